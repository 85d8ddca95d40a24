"""Our trainer under Ray Train (``python -m trainer.ray_train``, a KubeRay RayJob's entrypoint),
against a real one-machine Ray cluster started here on loopback (``ray start --head``, as a
RayCluster's head runs it): a worker's configuration error is the command's exit 2, a run lost
without a worker's code exits 200 (retryable), the stop file (a worker pod's preStop hook) has
both workers checkpoint and exit 143, and the trainer reuses a process group it finds (Ray's) and
leaves it to its owner. Two workers training to the end: tests/launcher/test_local_ray.py (the
same command as a RayJob's driver, run by the local backend on a Ray cluster of its own)."""

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
from tests.trainer.trainer_launch import REPO, TINY, base_env, free_port, run_operator_style
from trainer import checkpoint as ckpt
from trainer import stop_file
from trainer.distributed import DistEnv, StopRequest, destroy_process_group, init_process_group
from trainer.errors import EXIT_PEER_LOST, EXIT_SIGTERM, ConfigError
from trainer.stop_file import STOP_FILE_ENV

ray = pytest.importorskip("ray", reason="ray[train] is not installed (trainer.ray_train needs it)")

RAY_CLI = Path(sys.executable).with_name("ray")
STOPPED = "[trainer] stop file"


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


def _ray_train_command(reach: dict[str, str], tmp_path: Path, argv: list[str]) -> dict:
    """``subprocess`` arguments that run ``trainer.ray_train`` with ``argv`` on the cluster
    ``reach`` names, watching the stop file ``tmp_path/stop`` (the machine's default is shared
    by every run here)."""
    env = {k: v for k, v in base_env().items() if not k.startswith("RAY_")} | reach
    env[STOP_FILE_ENV] = str(tmp_path / "stop")
    storage = ["--storage-path", str(tmp_path / "ray-results")]  # Ray's run folder: ours to remove
    command = [sys.executable, "-m", "trainer.ray_train", *storage, *argv]
    return {"args": command, "cwd": REPO, "env": env, "text": True}


def _ray_train(
    reach: dict[str, str], tmp_path: Path, argv: list[str], timeout: float = 150
) -> subprocess.CompletedProcess:
    command = _ray_train_command(reach, tmp_path, argv)
    return subprocess.run(**command, capture_output=True, timeout=timeout)


@pytest.mark.slow
def test_a_stop_file_checkpoints_every_worker_and_a_rerun_resumes(ray_head, tmp_path):
    """A RayJob's worker pod being deleted runs its preStop hook (``trainer.stop_file``): it
    creates the stop file and returns once both workers have stopped at the same step with rank 0's
    checkpoint of it written; the command exits 143 (retryable), and a rerun resumes from that
    checkpoint (two trainers started as the Training Operator starts them: the same resume,
    without a second Ray Train start-up's half minute)."""
    data = write_image_folder(tmp_path / "data")  # 36 images, 2 ranks, batch 2: 9 steps/epoch
    out = tmp_path / "out"
    flags = ["--data-dir", str(data), "--output-dir", str(out), *TINY, "--batch-size", "2"]
    flags += ["--checkpoint-every-steps", "0", "--stop-check-every-steps", "2"]
    argv = ["--workers", "2", "--", *flags, "--epochs", "200"]
    log_path = tmp_path / "stopped.log"
    with open(log_path, "w") as log:
        command = _ray_train_command(ray_head, tmp_path, argv)
        run = subprocess.Popen(**command, stdout=log, stderr=subprocess.STDOUT)
    try:
        metrics = out / "metrics.jsonl"
        _wait_until(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 3, run)
        assert len(stop_file.running_trainers(command["env"][STOP_FILE_ENV])) == 2
        hook = subprocess.run(
            [sys.executable, "-m", "trainer.stop_file", "--wait-s", "60"],
            env=command["env"],
            capture_output=True,
            text=True,
            timeout=90,
        )
        checkpoints = ckpt.complete_checkpoints(out / "checkpoints")  # as the hook returns
        code = run.wait(timeout=60)
    finally:
        run.kill()
    said = log_path.read_text()
    assert "trainers done" in hook.stdout, hook.stdout + hook.stderr + said
    assert code == EXIT_SIGTERM, said
    assert f"[ray_train] failed: trainer.train on rank 0 exited {EXIT_SIGTERM}" in said, said
    (checkpoint,) = checkpoints  # no periodic ones: the stop's
    step = int(checkpoint.name.removeprefix("step-"))
    assert 3 <= step < 200 * 9 and step % 2 == 0, said  # at a stop check
    assert not (out / "model").exists()

    epochs = str(step // 9 + 1)
    rerun = [*flags, "--epochs", epochs]
    codes, said = run_operator_style([rerun, rerun], log_dir=tmp_path / "rerun")
    assert codes == [0, 0], said
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed_from_step"] == step and summary["steps"] == int(epochs) * 9, summary


def _wait_until(predicate, run: subprocess.Popen, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert run.poll() is None, "trainer.ray_train exited before the awaited event"
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.slow
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
    assert done.returncode == EXIT_PEER_LOST, done.stdout + done.stderr  # retryable
    assert "[ray_train] cannot reach a Ray cluster" in done.stdout
    assert f"exiting {EXIT_PEER_LOST} to be retried" in done.stdout


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
    crash = {1: UserExceptionWithTraceback(ValueError("boom\nmore"), "...")}
    assert describe(WorkerGroupError("1 worker failed", crash)) == "rank 1: ValueError: boom"


@pytest.mark.parametrize(
    "failure",
    [
        ray.exceptions.ActorDiedError(),  # the worker's pod was deleted, its node lost
        ray.exceptions.WorkerCrashedError(),  # the OOM killer, a segfault
        ray.exceptions.NodeDiedError("node 1 died"),
        RuntimeError("the controller died"),  # Ray itself failed
    ],
    ids=["actor-died", "worker-crashed", "node-died", "ray-failed"],
)
def test_a_failure_without_a_workers_code_is_retryable(failure):
    """No worker's code means the run was cut short from outside (a preempted GPU pod): exit
    200, which the launcher retries, so the retry resumes from the checkpoints."""
    from ray.train.v2._internal.exceptions import UserExceptionWithTraceback
    from ray.train.v2.api.exceptions import WorkerGroupError

    from trainer.ray_train import exit_code_of

    assert exit_code_of(failure) == (EXIT_PEER_LOST, None)
    wrapped = WorkerGroupError("1 worker failed", {1: UserExceptionWithTraceback(failure, "...")})
    assert exit_code_of(pickle.loads(pickle.dumps(wrapped))) == (EXIT_PEER_LOST, None)


class _LostRun:
    """A TorchTrainer whose run Ray loses: a worker's actor died with its pod."""

    def fit(self):
        raise ray.exceptions.ActorDiedError()


def test_a_run_lost_without_a_workers_code_exits_200_to_be_retried(monkeypatch, capsys):
    from trainer import ray_train

    monkeypatch.setenv("RAY_TRAIN_ENABLE_PRINT_PATCH", "0")  # main() sets it: undone after
    monkeypatch.setattr(ray_train, "_connect", lambda args: "a cluster")
    monkeypatch.setattr(ray_train, "_trainer", lambda args, flags: _LostRun())
    assert ray_train.main(["--workers", "2", "--", "--epochs", "1"]) == EXIT_PEER_LOST
    (failed,) = [line for line in capsys.readouterr().out.splitlines() if "failed:" in line]
    assert "ActorDiedError" in failed and failed.endswith(f"exiting {EXIT_PEER_LOST} to be retried")


def test_the_stop_request_counts_the_stop_file_once_it_exists(tmp_path, capfd):
    path = tmp_path / "stop"
    stop = StopRequest({STOP_FILE_ENV: str(path)})
    assert not stop.requested and capfd.readouterr().err == ""
    path.touch()
    assert stop.requested and stop.requested  # looked for once, then remembered
    said = capfd.readouterr().err
    assert said.count(STOPPED) == 1 and str(path) in said and "checkpointing" in said
    path.unlink()
    assert stop.requested  # a stop is not taken back
    assert not StopRequest({}).requested  # no variable, no stop file watched
    assert not StopRequest({STOP_FILE_ENV: ""}).requested


def test_the_stop_hook_waits_for_the_trainers_marked_running(tmp_path):
    """The preStop hook creates the stop file and returns once no trainer beside it runs; a
    marker of a process that is gone does not hold it."""
    path = str(tmp_path / "stop")
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    Path(f"{path}{stop_file.RUNNING_SUFFIX}{gone.stdout.strip()}").touch()  # killed, no clean-up
    with stop_file.running_marker(path):
        assert stop_file.running_trainers(path) == [os.getpid()]
        started = time.monotonic()
        assert stop_file.wait_for_trainers(path, 0.3) == [os.getpid()]
        assert 0.3 <= time.monotonic() - started < 5
    assert stop_file.running_trainers(path) == []
    hook = subprocess.run(
        [sys.executable, "-m", "trainer.stop_file", "--wait-s", "30"],
        cwd=REPO,
        env=base_env() | {STOP_FILE_ENV: path},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert hook.returncode == 0 and Path(path).exists(), hook.stderr
    assert f"created {path}; trainers done" in hook.stdout


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
import gc, sys, torch, torch.distributed as dist
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
# Both ranks done with the control group before the owner ends the world: without it, 1 run in
# ~12 aborted at exit ("terminate called without an active exception", gloo's teardown).
dist.barrier(group=world)
dist.destroy_process_group()
# The group's last references go here, so that gloo stops its threads now, not somewhere in the
# interpreter's exit: held to the end, 2 runs of 75 here beside 2 busy cores still aborted at
# exit so (and one in clean-clone run X21), none of 100 without them.
del world, control, flag
gc.collect()
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
