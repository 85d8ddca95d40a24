"""Our trainer under Ray Train (``python -m trainer.ray_train``, a KubeRay RayJob's entrypoint),
against a real one-machine Ray cluster started here on loopback (``ray start --head``, as a
RayCluster's head runs it): two workers train to the end in Ray's process group, a worker's
configuration error is the command's exit 2, and the trainer reuses a process group it finds
(Ray's) and leaves it to its owner."""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tests.image_data import write_image_folder
from tests.trainer.trainer_launch import REPO, TINY, base_env, free_port
from trainer.distributed import DistEnv, destroy_process_group, init_process_group
from trainer.errors import ConfigError

ray = pytest.importorskip("ray", reason="ray[train] is not installed (trainer.ray_train needs it)")

RAY_CLI = Path(sys.executable).with_name("ray")


def _session_processes(session_id: int) -> list[int]:
    """The processes of the session ``ray start`` leads: every Ray process it started (the
    raylet's workers too); nothing else on this machine."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == session_id:  # field 6 of /proc/PID/stat: the session id
            pids.append(int(entry.name))
    return pids


def _stop_head(head: subprocess.Popen) -> None:
    """Stop the cluster this test started, and only it (``ray stop`` would stop every Ray
    cluster of this machine): SIGTERM lets ``ray start`` drain and stop its processes; whatever
    of its session is left after that is killed."""
    with contextlib.suppress(ProcessLookupError):
        head.send_signal(signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        head.wait(timeout=20)
    for _ in range(3):
        left = _session_processes(head.pid)
        if not left:
            return
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
    with contextlib.suppress(subprocess.TimeoutExpired):
        head.wait(timeout=5)


@pytest.fixture(scope="module")
def ray_head():
    """The environment that reaches a Ray head on 127.0.0.1 with 2 CPUs (``RAY_ADDRESS`` and
    its token), its files under a short /tmp folder (the Unix sockets' paths have a length
    limit), gone afterwards.

    The token is passed in the environment, as KubeRay does: without one, Ray 2.60 takes
    ``~/.ray/auth_token`` when that file exists (``ray.init()`` writes it when it starts a local
    cluster), and a driver without ``RAY_AUTH_MODE=token`` is then refused.
    """
    if not RAY_CLI.exists():
        pytest.skip(f"no ray command next to {sys.executable}")
    temp = tempfile.mkdtemp(prefix="rt-", dir="/tmp")
    port = free_port()
    command = [
        str(RAY_CLI),
        "start",
        "--head",
        "--block",
        f"--port={port}",
        "--node-ip-address=127.0.0.1",
        f"--ray-client-server-port={free_port()}",
        "--num-cpus=2",
        "--num-gpus=0",
        "--include-dashboard=false",
        "--disable-usage-stats",
        f"--temp-dir={temp}",
    ]
    reach = {
        # Ray's own processes find their cluster by RAY_ADDRESS: with another Ray cluster on
        # this machine (other tests), "auto" finds two and Ray Train's placement-group cleaner
        # fails.
        "RAY_ADDRESS": f"127.0.0.1:{port}",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": secrets.token_hex(32),
    }
    env = {k: v for k, v in base_env().items() if not k.startswith("RAY_")} | reach
    env["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] = "0"  # stop at once on SIGTERM (no drain)
    log_path = Path(temp, "head.log")
    with open(log_path, "wb") as log:
        head = subprocess.Popen(
            command, cwd=temp, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 90
        while "Ray runtime started" not in log_path.read_text(errors="replace"):
            if head.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"ray start failed:\n{log_path.read_text(errors='replace')}")
            time.sleep(0.3)
        yield reach
    finally:
        _stop_head(head)
        shutil.rmtree(temp, ignore_errors=True)


def _ray_train(
    reach: dict[str, str], tmp_path: Path, argv: list[str], timeout: float = 150
) -> subprocess.CompletedProcess:
    env = {k: v for k, v in base_env().items() if not k.startswith("RAY_")} | reach
    storage = ["--storage-path", str(tmp_path / "ray-results")]  # Ray's run folder: ours to remove
    return subprocess.run(
        [sys.executable, "-m", "trainer.ray_train", *storage, *argv],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_two_ray_train_workers_train_to_the_end(ray_head, tmp_path):
    data = write_image_folder(tmp_path / "data", classes=("circle", "square"), per_class=8)
    out = tmp_path / "out"
    flags = ["--data-dir", str(data), "--output-dir", str(out), *TINY, "--epochs", "2"]
    done = _ray_train(ray_head, tmp_path, ["--workers", "2", "--", *flags, "--batch-size", "2"])
    said = done.stdout + done.stderr
    assert done.returncode == 0, said
    assert "[ray_train] done: the trainer exited 0 on all 2 workers" in said, said
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] > 0, summary
    assert (out / "model" / "weights.pt").is_file()


def test_a_workers_config_error_is_the_commands_exit_2(ray_head, tmp_path):
    """Too little data for ``--batch-size 64`` on 2 ranks: the trainer's ConfigError (exit 2)
    fails the Ray run, and the command exits 2 naming the flag (a permanent failure)."""
    data = write_image_folder(tmp_path / "data", classes=("circle", "square"), per_class=8)
    flags = ["--data-dir", str(data), "--output-dir", str(tmp_path / "out"), *TINY]
    done = _ray_train(ray_head, tmp_path, ["--workers", "2", "--", *flags, "--batch-size", "64"])
    said = done.stdout + done.stderr
    assert done.returncode == 2, said
    failed = [line for line in said.splitlines() if line.startswith("[ray_train] failed:")]
    assert failed and "exited 2" in failed[0] and "--batch-size" in failed[0], said
    assert failed[0].endswith("exiting 2"), said


def test_flags_that_do_not_parse_exit_2_before_ray_starts(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "trainer.ray_train", "--workers", "2", "--", "--epochs", "many"],
        cwd=REPO,
        env=base_env() | {"RAY_ADDRESS": "127.0.0.1:9"},  # nothing listens there
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--epochs" in done.stderr and "do not parse" in done.stdout


def test_a_head_that_is_not_there_fails_in_seconds_not_minutes():
    done = subprocess.run(
        [sys.executable, "-m", "trainer.ray_train", "--workers", "1", "--connect-timeout-s", "1"],
        cwd=REPO,
        env=base_env() | {"RAY_ADDRESS": f"127.0.0.1:{free_port()}"},  # nothing listens there
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "[ray_train] cannot reach a Ray cluster" in done.stdout


def test_the_exit_code_comes_back_from_a_ray_train_v2_worker_failure():
    """The code travels pickled in the worker's exception, as Ray returns it; among several
    workers' codes the permanent one wins over a peer's lost-contact code (200)."""
    from ray.train.v2._internal.exceptions import UserExceptionWithTraceback
    from ray.train.v2.api.exceptions import WorkerGroupError

    from trainer.ray_train import WorkerExit, describe, exit_code_of

    failures = {
        0: UserExceptionWithTraceback(WorkerExit(200, 0), traceback_str="..."),
        1: UserExceptionWithTraceback(WorkerExit(2, 1, "[trainer] error: bad"), "..."),
    }
    err = pickle.loads(pickle.dumps(WorkerGroupError("2 workers failed", failures)))
    code, cause = exit_code_of(err)
    assert code == 2 and cause is not None and cause.rank == 1
    assert cause.summary == "trainer.train on rank 1 exited 2: [trainer] error: bad"
    assert exit_code_of(RuntimeError("the controller died")) == (1, None)
    crash = {1: UserExceptionWithTraceback(ValueError("boom\nmore"), "...")}
    assert exit_code_of(WorkerGroupError("1 worker failed", crash)) == (1, None)
    assert describe(WorkerGroupError("1 worker failed", crash)) == "rank 1: ValueError: boom"


@pytest.fixture
def foreign_group(tmp_path):
    """A default process group this process joined itself (as Ray Train does): one gloo rank."""
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_a_process_group_found_stays_its_owners(foreign_group):
    destroy_process_group()
    assert dist.is_initialized() and dist.group.WORLD is foreign_group
    job = DistEnv(rank=0, world_size=2, master_addr="127.0.0.1", master_port=1)
    with pytest.raises(ConfigError, match="rank 0 of 1"):  # not this job's group
        init_process_group(job, torch.device("cpu"), 30)


REUSE_IN_RANK = """
import sys, torch, torch.distributed as dist
from trainer import distributed
from trainer.distributed import DistEnv, destroy_process_group, init_process_group
rank, store = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=2)
world = dist.group.WORLD
env = DistEnv(rank=rank, world_size=2, master_addr="127.0.0.1", master_port=1)
control = init_process_group(env, torch.device("cpu"), 30)  # port 1: a 2nd init would fail
assert control is world and dist.group.WORLD is world and not distributed._OWN_WORLD
flag = torch.tensor([rank])
dist.all_reduce(flag, group=control)
assert flag.item() == 1, flag
destroy_process_group()
assert dist.is_initialized() and dist.group.WORLD is world  # left to its owner
dist.destroy_process_group()
print(f"rank {rank} ok", flush=True)
"""
"""One rank that joined a 2-rank gloo group itself, then runs the trainer's set-up and tear-down."""


def test_two_ranks_reuse_the_gloo_group_they_found(tmp_path):
    store = tmp_path / "store"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", REUSE_IN_RANK, str(rank), str(store)],
            cwd=REPO,
            env=base_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    said = []
    for proc in procs:
        try:
            said.append(proc.communicate(timeout=90)[0])
        finally:
            proc.kill()
    assert [p.returncode for p in procs] == [0, 0], "\n".join(said)
    assert "rank 0 ok" in said[0] and "rank 1 ok" in said[1]
