"""A DataLoader worker that dies ends the trainer with one line and an exit code the operator can
act on (trainer/data_worker_loss.py), not a traceback and exit 1 (permanent): out of /dev/shm
(SIGBUS) is permanent (5); a SIGKILL that is not this container's memory limit (the node's
out-of-memory killer, a person) restarts the job (137)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.trainer.trainer_forkserver import ForkedTrainer
from tests.trainer.trainer_launch import REPO, TINY, base_env
from trainer import data_worker_loss
from trainer.data_worker_loss import DataWorkerLost, memory_limit_hits, verdict, worker_death
from trainer.errors import OutOfMemory


def _data_worker(trainer_pid: int, log: Path) -> int:
    """The pid of a DataLoader worker of the trainer, once the trainer has trained a step."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if log.exists() and "| epoch 0 |" in log.read_text():
            for entry in Path("/proc").iterdir():
                try:
                    parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                    command = (entry / "cmdline").read_bytes()
                except (OSError, ValueError, IndexError):
                    continue
                if parent == trainer_pid and b"spawn_main" in command:
                    return int(entry.name)
        time.sleep(0.1)
    raise AssertionError(f"no DataLoader worker of {trainer_pid} trained:\n{log.read_text()}")


@pytest.mark.parametrize(
    ("signum", "exit_code", "said"),
    [
        (signal.SIGKILL, 137, "was killed by SIGKILL, not by this container's memory limit"),
        (signal.SIGBUS, 5, "was killed by SIGBUS: /dev/shm ("),
    ],
    ids=["killed", "out-of-shm"],
)
def test_a_dead_data_worker_is_one_line_and_an_exit_code_to_act_on(
    signum, exit_code, said, tmp_path, image_folder
):
    log = tmp_path / "trainer.log"
    args = ["--data-dir", str(image_folder), "--output-dir", str(tmp_path / "out"), *TINY]
    args += ["--batch-size", "2", "--epochs", "1000", "--cache-images", "never"]
    trainer = ForkedTrainer([*args, "--num-workers", "1"], env=base_env(), cwd=REPO, log_path=log)
    try:
        worker = _data_worker(trainer.pid, log)
        os.kill(worker, signum)
        assert trainer.wait(timeout=60) == exit_code, log.read_text()[-3000:]
    finally:
        trainer.kill()
    text = log.read_text()
    # torch's SIGBUS handler in the worker writes "...(shm).\n" and a NUL before it dies
    last = text.replace("\x00", "").strip().splitlines()[-1].strip()
    assert last.startswith(f"[trainer] error: a data-loading worker (pid {worker}) "), text
    assert said in last
    if signum == signal.SIGBUS:  # what fills /dev/shm, and the fixes
        assert "--num-workers 1 workers per process" in last and "shm_size" in last
    assert "Traceback" not in text


def test_a_worker_killed_at_the_containers_memory_limit_is_permanent(tmp_path, monkeypatch):
    """cgroup v2's memory.events (a pod's container): ``oom`` rose since the trainer started, so
    the container reached its own limit, which a restart reaches again; ``oom_kill`` alone (the
    node's out-of-memory killer) is retryable. The SIGCHLD handler's wording of the death."""
    (tmp_path / "cgroup").write_text("0::/kubepods/pod-1/ctr\n")
    folder = tmp_path / "fs" / "kubepods" / "pod-1" / "ctr"
    folder.mkdir(parents=True)
    events = folder / "memory.events"
    events.write_text("low 0\nhigh 0\nmax 7\noom 0\noom_kill 0\noom_group_kill 0\n")
    (folder / "memory.max").write_text(f"{2 * 2**30}\n")
    monkeypatch.setattr(data_worker_loss, "PROC_CGROUP", tmp_path / "cgroup")
    monkeypatch.setattr(data_worker_loss, "CGROUP_ROOT", tmp_path / "fs")
    before = memory_limit_hits()
    assert before == 0
    died = worker_death(RuntimeError("DataLoader worker (pid 42) is killed by signal: Killed. "))
    assert died is not None and (died.pid, died.signum) == (42, signal.SIGKILL)
    config = SimpleNamespace(num_workers=None, batch_size=256, image_size=224)

    events.write_text("low 0\nhigh 0\nmax 9\noom 1\noom_kill 1\noom_group_kill 0\n")
    at_limit = verdict(died, config, before)
    assert isinstance(at_limit, OutOfMemory) and at_limit.exit_code == 5
    assert str(at_limit).startswith(
        "a data-loading worker (pid 42) was killed by the out-of-memory killer at this "
        "container's memory limit (2.0 GiB) (--num-workers auto workers per process, each "
        "preparing batches of --batch-size 256 at --image-size 224); give each node more memory"
    )
    events.write_text("low 0\nhigh 0\nmax 9\noom 1\noom_kill 2\noom_group_kill 0\n")
    by_the_node = verdict(died, config, 1)
    assert isinstance(by_the_node, DataWorkerLost) and by_the_node.exit_code == 137
    assert worker_death(RuntimeError("CUDA error: an illegal memory access")) is None
