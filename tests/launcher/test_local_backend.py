"""Local backend: real processes with each API's env contract, restarts, deadlines, SIGTERM.

The real trainer runs with 2 nodes (gloo) to completion and through a killed node, under the
Trainer v2 contract (PET_* only, torchrun in each node) and the Training Operator's; a small
script (written by the tests) checks the env contracts, torch.distributed over them, and the
restart/resume mechanics quickly.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from components.launcher import (
    JobFailed,
    JobResult,
    JobTimeout,
    LocalOptions,
    TrainSpec,
    run_job,
)
from components.launcher.api_options import PyTorchJobOptions, TrainJobOptions
from components.launcher.backends.contracts import local_api, replica_names
from components.launcher.backends.local import NODE_TAG_ENV, NODES_DIR_ENV, tagged_pids
from tests.image_data import write_image_folder

REPO = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path

    out = Path(sys.argv[1])
    mode = sys.argv[2] if len(sys.argv) > 2 else "ok"
    rank = int(os.environ["RANK"])
    out.mkdir(parents=True, exist_ok=True)
    (out / f"env-{rank}.json").write_text(json.dumps(dict(os.environ)))
    if mode == "ok":
        print(f"hello from rank {rank}")
        sys.exit(0)
    if mode == "fail-rank-1":
        print(f"rank {rank} here")
        if rank == 1:
            print("worker broke: bad config")
            sys.exit(3)
        time.sleep(30)
    if mode == "always-crash":
        print("crash")
        sys.exit(1)
    if mode == "sleep":
        import signal
        def on_term(signum, frame):
            (out / f"sigterm-{rank}").write_text("got it")
            sys.exit(143)
        signal.signal(signal.SIGTERM, on_term)
        print("sleeping", flush=True)
        time.sleep(60)
    if mode == "resume":
        # A stand-in trainer: step checkpoints (rank 0), resume from the newest one.
        ckpt = out / "ckpt.json"
        start = json.loads(ckpt.read_text())["step"] if ckpt.exists() else 0
        resumed = start if ckpt.exists() else None
        for step in range(start + 1, 21):
            time.sleep(0.15)
            if rank == 0:
                tmp = out / "ckpt.tmp"
                tmp.write_text(json.dumps({"step": step}))
                tmp.replace(ckpt)
            print(f"step {step}")
        if rank == 0:
            summary = {"steps": 20, "resumed_from_step": resumed, "world_size": 2}
            (out / "summary.json").write_text(json.dumps(summary))
        sys.exit(0)
    """
)

DDP_SCRIPT = textwrap.dedent(
    """
    import os, torch, torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    print(f"rank {dist.get_rank()}/{dist.get_world_size()} sum {t.item():g}")
    dist.destroy_process_group()
    """
)


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "fake_trainer.py"
    path.write_text(SCRIPT)
    return path


def local(spec: TrainSpec, **options) -> JobResult:
    return run_job(spec, backend="local", options=LocalOptions(**options))


def local_spec(script: Path, mode: str, **kw) -> TrainSpec:
    """The test script under the PyTorchJob's Master contract (it reads RANK like a pod without
    torchrun, which only a PyTorchJob with a Master gets)."""
    base = {
        "api": "pytorchjob",
        "pytorch_master": True,
        "name": "local-job",
        "workers": 2,
        "command": ["python", str(script)],
        "args": ["/workspace/out", mode],
        "pvcs": ["ws:/workspace"],
    }
    return TrainSpec.flat(**(base | kw))


def test_env_contract_path_map_and_prefixed_logs(script: Path, tmp_path: Path):
    lines: list[str] = []
    ws = tmp_path / "ws"
    result = local(
        local_spec(script, "ok", env={"EXTRA": "/workspace/x"}),
        path_map={"/workspace": str(ws)},
        log=lines.append,
        workdir=tmp_path,
    )
    assert result.phase == "Succeeded" and result.restarts == 0 and result.backend == "local"
    assert "[master-0] hello from rank 0" in lines and "[worker-0] hello from rank 1" in lines
    envs = [json.loads((ws / "out" / f"env-{r}.json").read_text()) for r in (0, 1)]
    for rank, env in enumerate(envs):
        assert env["RANK"] == env["PET_NODE_RANK"] == str(rank)
        assert env["WORLD_SIZE"] == "2" and env["PET_NNODES"] == "2"
        assert env["PET_NPROC_PER_NODE"] == "1"
        assert env["MASTER_ADDR"] == env["PET_MASTER_ADDR"] == "127.0.0.1"
        assert env["MASTER_PORT"] == env["PET_MASTER_PORT"] == envs[0]["MASTER_PORT"]
        assert env["PYTHONUNBUFFERED"] == "1"
        assert env["EXTRA"] == f"{ws}/x"  # PVC paths in env are mapped too
        if sys.platform.startswith("linux"):
            assert env["GLOO_SOCKET_IFNAME"] == "lo"


ENV_DUMP = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    (out / f"env-{os.environ['PET_NODE_RANK']}.json").write_text(json.dumps(dict(os.environ)))
    """
)


def test_trainjob_contract_gives_each_node_only_the_pet_variables(tmp_path: Path, monkeypatch):
    # Whatever launched this process must not leak into the nodes (a pod starts clean).
    monkeypatch.setenv("RANK", "7")
    monkeypatch.setenv("MASTER_ADDR", "elsewhere")
    (tmp_path / "dump.py").write_text(ENV_DUMP)
    lines: list[str] = []
    spec = TrainSpec(
        api="trainjob",
        name="v2",
        workers=2,
        nproc_per_node=3,
        command=["python", str(tmp_path / "dump.py")],
        args=[str(tmp_path / "out")],
    )
    result = local(spec, log=lines.append)
    assert result.phase == "Succeeded" and result.api == "trainjob"
    envs = [json.loads((tmp_path / "out" / f"env-{n}.json").read_text()) for n in (0, 1)]
    for node, env in enumerate(envs):
        assert env["PET_NODE_RANK"] == str(node) and env["PET_NNODES"] == "2"
        assert env["PET_NPROC_PER_NODE"] == "3"
        assert env["PET_MASTER_ADDR"] == "127.0.0.1"
        assert env["PET_MASTER_PORT"] == envs[0]["PET_MASTER_PORT"]
        for absent in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
            assert absent not in env, absent  # torchrun in the node derives these
    assert any("local trainjob contract, 2 node(s)" in x for x in lines)


def test_auto_runs_locally_with_the_trainjob_contract(tmp_path: Path):
    (tmp_path / "dump.py").write_text(ENV_DUMP)
    spec = TrainSpec(name="v2", command=["python", str(tmp_path / "dump.py")], args=[str(tmp_path)])
    assert local(spec, log=lambda line: None).api == "trainjob"


@pytest.mark.slow
def test_torchrun_in_each_node_joins_the_nodes_under_the_trainjob_contract(tmp_path: Path):
    (tmp_path / "ddp.py").write_text(DDP_SCRIPT)
    lines: list[str] = []
    spec = TrainSpec(
        api="trainjob",
        name="v2",
        workers=2,
        nproc_per_node=2,
        command=["torchrun", str(tmp_path / "ddp.py")],
    )
    assert local(spec, log=lines.append, timeout_s=120).phase == "Succeeded"
    output = "\n".join(lines)
    for rank in range(4):  # 2 nodes x 2 processes, one world: 1+2+3+4 = 10
        assert output.count(f"rank {rank}/4 sum 10") == 1, output
    assert any(x.startswith("[node-1] ") for x in lines)


def test_unmapped_pvc_gets_a_folder_under_workdir(script: Path, tmp_path: Path):
    local(local_spec(script, "ok", workers=1), workdir=tmp_path, log=print)
    assert (tmp_path / "volumes" / "ws" / "out" / "env-0.json").is_file()


def test_torch_distributed_initialises_from_the_contract(tmp_path: Path):
    (tmp_path / "ddp.py").write_text(DDP_SCRIPT)
    lines: list[str] = []
    spec = TrainSpec.flat(
        api="pytorchjob",
        pytorch_master=True,
        name="ddp",
        workers=2,
        command=["python", str(tmp_path / "ddp.py")],
    )
    assert local(spec, log=lines.append).phase == "Succeeded"
    assert "[master-0] rank 0/2 sum 3" in lines and "[worker-0] rank 1/2 sum 3" in lines


ENV_BY_PID = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    Path(sys.argv[1], f"env-{os.getpid()}.json").write_text(json.dumps(dict(os.environ)))
    """
)


@pytest.mark.slow
def test_a_workers_only_pytorchjob_meets_by_c10d_rendezvous(tmp_path: Path):
    """The default PyTorchJob (no Master): the operator's PET_NNODES / PET_NPROC_PER_NODE and
    the manifest's c10d rendezvous, no ranks and no master address; torchrun in each node."""
    (tmp_path / "ddp.py").write_text(DDP_SCRIPT)
    (tmp_path / "dump.py").write_text(ENV_BY_PID)
    out = tmp_path / "out"
    out.mkdir()
    lines: list[str] = []
    dump = TrainSpec(
        api="pytorchjob",
        name="dump",
        workers=2,
        command=["python", str(tmp_path / "dump.py")],
        args=[str(out)],
    )
    assert local(dump, log=lines.append, timeout_s=60).phase == "Succeeded"
    assert len(list(out.glob("env-*.json"))) == 2
    for path in out.glob("env-*.json"):
        env = json.loads(path.read_text())
        assert env["PET_NNODES"] == "2" and env["PET_NPROC_PER_NODE"] == "1"
        assert env["PET_RDZV_BACKEND"] == "c10d" and env["PET_RDZV_ID"] == "dump"
        assert env["PET_RDZV_ENDPOINT"].startswith("127.0.0.1:")
        assert not {"RANK", "WORLD_SIZE", "MASTER_ADDR", "PET_NODE_RANK"} & set(env)
    spec = TrainSpec(
        api="pytorchjob", name="ddp", workers=2, command=["torchrun", str(tmp_path / "ddp.py")]
    )
    assert local(spec, log=lines.append, timeout_s=120).phase == "Succeeded"
    assert sum("/2 sum 3" in x for x in lines) == 2


def test_torchrun_command_runs_nproc_per_node_processes(tmp_path: Path):
    (tmp_path / "ddp.py").write_text(DDP_SCRIPT)
    lines: list[str] = []
    spec = TrainSpec(
        api="pytorchjob",
        name="ddp",
        workers=1,
        nproc_per_node=2,
        command=["torchrun", str(tmp_path / "ddp.py")],
    )
    assert local(spec, log=lines.append).phase == "Succeeded"
    # torchrun started both local ranks. They share the pod's stdout, where unbuffered prints of
    # two processes may land on one line (as in a real pod): count messages, not lines.
    output = "\n".join(lines)
    assert output.count("rank 0/2 sum 3") == 1 and output.count("rank 1/2 sum 3") == 1


def test_elastic_job_rendezvouses_with_c10d(tmp_path: Path):
    (tmp_path / "ddp.py").write_text(DDP_SCRIPT)
    lines: list[str] = []
    spec = TrainSpec.flat(
        api="pytorchjob",
        name="elastic",
        workers=2,
        elastic_min_replicas=2,
        elastic_max_replicas=2,
        max_restarts=0,
        command=["torchrun", str(tmp_path / "ddp.py")],
    )
    assert local(spec, log=lines.append, timeout_s=120).phase == "Succeeded"
    assert "[worker-0] rank 0/2 sum 3" in lines or "[worker-1] rank 0/2 sum 3" in lines
    assert sum("/2 sum 3" in x for x in lines) == 2


def test_permanent_failure_stops_the_group_and_reports(script: Path, tmp_path: Path):
    spec = local_spec(script, "fail-rank-1", restart_policy="ExitCode")
    start = time.monotonic()
    with pytest.raises(JobFailed) as err:
        local(spec, workdir=tmp_path, log=lambda line: None, grace_period_s=2)
    assert time.monotonic() - start < 20  # master-0 (sleeping 30 s) was stopped
    message = str(err.value)
    assert "worker-0 exited with code 3" in message and "permanent" in message
    assert "[worker-0] worker broke: bad config" in message
    assert err.value.result.phase == "Failed" and err.value.result.restarts == 0


def test_backoff_limit_bounds_group_restarts(script: Path, tmp_path: Path):
    spec = local_spec(
        script, "always-crash", backoff_limit=1, workers=1, restart_policy="OnFailure"
    )
    with pytest.raises(JobFailed, match="backoff limit 1 restarts used up") as err:
        local(spec, workdir=tmp_path, log=lambda line: None)
    assert err.value.result.restarts == 1


def test_never_restart_policy(script: Path, tmp_path: Path):
    spec = local_spec(script, "always-crash", restart_policy="Never", workers=1)
    with pytest.raises(JobFailed, match="restart policy Never") as err:
        local(spec, workdir=tmp_path, log=lambda line: None)
    assert err.value.result.restarts == 0


def test_active_deadline_is_enforced(script: Path, tmp_path: Path):
    spec = local_spec(script, "sleep", active_deadline_seconds=1)
    start = time.monotonic()
    with pytest.raises(JobTimeout, match="activeDeadlineSeconds=1"):
        local(spec, workdir=tmp_path, log=lambda line: None, grace_period_s=2)
    assert time.monotonic() - start < 10
    # The replicas got SIGTERM first (a chance to checkpoint).
    assert (tmp_path / "volumes" / "ws" / "out" / "sigterm-0").is_file()


def kill_once(
    pids: dict[str, int], ready: callable, replica: str = "worker-0", wait_s: float = 300
) -> threading.Thread:
    """Kill ``replica`` of the first attempt with SIGKILL as soon as ``ready()`` (within
    ``wait_s``: a loaded machine is slow to get there): every process of the node (its process
    group), as when a pod dies — torchrun's workers with it."""

    def killer() -> None:
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if replica in pids and ready():
                os.killpg(pids[replica], signal.SIGKILL)
                return
            time.sleep(0.05)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    return thread


def record_first_attempt(pids: dict[str, int]):
    def on_event(kind: str, info: dict) -> None:
        if kind == "started" and info["attempt"] == 0:
            pids[info["replica"]] = info["pid"]

    return on_event


def test_killed_worker_restarts_the_group_which_resumes(script: Path, tmp_path: Path):
    out = tmp_path / "volumes" / "ws" / "out"
    pids: dict[str, int] = {}
    ckpt = out / "ckpt.json"
    killer = kill_once(pids, lambda: ckpt.exists() and json.loads(ckpt.read_text())["step"] >= 3)
    lines: list[str] = []
    result = local(
        local_spec(script, "resume"),
        workdir=tmp_path,
        log=lines.append,
        on_event=record_first_attempt(pids),
        grace_period_s=2,
        output_dir=out,
    )
    killer.join()
    assert result.phase == "Succeeded" and result.restarts == 1
    assert result.summary["resumed_from_step"] >= 3
    assert any("worker-0 exited with code 137; restarting the group" in x for x in lines)


SIGTERM_LAUNCHER = textwrap.dedent(
    """
    import sys
    from components.launcher import JobCancelled, LocalOptions, TrainSpec, run_job

    spec = TrainSpec.flat(api="pytorchjob", pytorch_master=True, name="local-job", workers=2,
                     command=["python", sys.argv[1]], args=[sys.argv[2], "sleep"])
    try:
        run_job(spec, backend="local", options=LocalOptions(grace_period_s=5))
    except JobCancelled as exc:
        print("CANCELLED", exc, flush=True)
        sys.exit(143)
    """
)


def _start_launcher(
    source: str, script: Path, tmp_path: Path, *, wait_s: float, **popen
) -> tuple[subprocess.Popen, Path]:
    """Run the launcher program ``source`` on ``script`` and wait until both of its nodes run
    (each wrote its env); returns it and the nodes' output folder."""
    launcher = tmp_path / "launcher.py"
    launcher.write_text(source)
    out = tmp_path / "out"
    command = [sys.executable, str(launcher), str(script), str(out)]
    proc = subprocess.Popen(command, cwd=REPO, **popen)
    deadline = time.monotonic() + wait_s
    while not ((out / "env-0.json").exists() and (out / "env-1.json").exists()):
        if time.monotonic() >= deadline or proc.poll() is not None:
            proc.kill()
            raise AssertionError(f"the nodes did not start (launcher exit {proc.poll()})")
        time.sleep(0.05)
    return proc, out


def test_sigterm_is_forwarded_to_every_replica(script: Path, tmp_path: Path):
    proc, out = _start_launcher(
        SIGTERM_LAUNCHER,
        script,
        tmp_path,
        wait_s=60,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        time.sleep(0.5)  # both replicas installed their SIGTERM handler
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, output
    assert "CANCELLED" in output
    assert (out / "sigterm-0").is_file() and (out / "sigterm-1").is_file()


ORPHAN_LAUNCHER = textwrap.dedent(
    """
    import sys
    from components.launcher import LocalOptions, TrainSpec, run_job

    # torchrun in each node, as a TrainJob runs it: torchrun starts the script in a session of
    # its own, so only torchrun itself can stop it
    spec = TrainSpec(api="trainjob", name="orphans", workers=2,
                     command=["torchrun", sys.argv[1]], args=[sys.argv[2], "sleep"])
    run_job(spec, backend="local", options=LocalOptions(grace_period_s=5, timeout_s=300))
    """
)


def test_nodes_die_with_a_launcher_killed_with_sigkill(script: Path, tmp_path: Path):
    """kill -9 of the launcher left torchrun and its training processes running (~75 s, writing
    their outputs); now every node gets SIGTERM at once and stops its processes."""
    proc, out = _start_launcher(
        ORPHAN_LAUNCHER,
        script,
        tmp_path,
        wait_s=90,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(1.0)  # both scripts installed their SIGTERM handler
        proc.kill()
        proc.wait(timeout=10)
        deadline = time.monotonic() + 30
        while not ((out / "sigterm-0").exists() and (out / "sigterm-1").exists()):
            assert time.monotonic() < deadline, "a node outlived its killed launcher"
            time.sleep(0.1)
        deadline = time.monotonic() + 30
        while _tagged_processes(out):
            assert time.monotonic() < deadline, f"left running: {_tagged_processes(out)}"
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in _tagged_processes(out):  # what a failure of this test left behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _tagged_processes(out: Path) -> list[int]:
    """Processes whose environment carries the tag of a node that wrote its env to ``out``."""
    tags = set()
    for dump in out.glob("env-*.json"):
        with contextlib.suppress(ValueError):  # being written
            tags.add(json.loads(dump.read_text())[NODE_TAG_ENV])
    return [pid for tag in sorted(tags) for pid in tagged_pids(tag)]


# -- the real trainer ----------------------------------------------------------------------------

TRAINER_ARGS = [
    "--data-dir",
    "/workspace/data",
    "--output-dir",
    "/workspace/out",
    "--model",
    "resnet18",
    "--image-size",
    "16",
    "--batch-size",
    "4",
    "--seed",
    "0",
]


def trainer_available() -> bool:
    return (REPO / "trainer" / "train.py").is_file()


needs_trainer = pytest.mark.skipif(not trainer_available(), reason="trainer/train.py not written")


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    write_image_folder(tmp_path / "ws" / "data", per_class=4, val_per_class=2)
    return tmp_path / "ws"


def trainer_spec(*args: str, **kw) -> TrainSpec:
    kw = {"api": "pytorchjob"} | kw
    return TrainSpec.flat(
        name="ddp-local", workers=2, pvcs=["ws:/workspace"], args=TRAINER_ARGS + list(args), **kw
    )


@needs_trainer
@pytest.mark.slow
def test_real_trainer_trainjob_contract_killed_node_restarts_and_resumes(workspace: Path):
    """Trainer v2's contract: PET_* only, torchrun in each of 2 nodes; node-1 SIGKILLed after a
    checkpoint → the group restarts → the trainer resumes → the run completes."""
    checkpoints = workspace / "out" / "checkpoints"
    pids: dict[str, int] = {}
    killer = kill_once(
        pids, lambda: (checkpoints / "step-2" / "COMPLETE").is_file(), replica="node-1"
    )
    lines: list[str] = []
    result = local(
        trainer_spec(
            "--max-steps",
            "30",
            "--checkpoint-every-steps",
            "2",
            "--epochs",
            "40",
            "--model",
            "shufflenet_v2_x0_5",
            api="trainjob",
        ),
        path_map={"/workspace": str(workspace)},
        log=lines.append,
        on_event=record_first_attempt(pids),
        grace_period_s=5,
    )
    killer.join()
    assert result.phase == "Succeeded" and result.restarts == 1 and result.api == "trainjob"
    assert any("node-1 exited with code 137; restarting the group" in x for x in lines)
    assert any(x.startswith("[node-0] [trainer] resuming from") for x in lines)
    assert result.summary["resumed_from_step"] is not None
    assert result.summary["resumed_from_step"] >= 2 and result.summary["steps"] == 30
    # The dead node's torchrun workers (in sessions of their own) died with it, as in a pod.
    leftovers = subprocess.run(
        ["pgrep", "-f", str(workspace)], capture_output=True, text=True
    ).stdout.split()
    assert not leftovers, leftovers
    assert result.summary["world_size"] == 2


@needs_trainer
@pytest.mark.slow
def test_real_trainer_killed_worker_resumes_from_its_checkpoint(workspace: Path):
    """A Workers-only PyTorchJob of our trainer (c10d rendezvous): worker-0 SIGKILLed after a
    checkpoint → the group restarts → the trainer resumes → the run completes with every
    output, as an uninterrupted run does."""
    checkpoints = workspace / "out" / "checkpoints"
    pids: dict[str, int] = {}
    killer = kill_once(pids, lambda: (checkpoints / "step-2" / "COMPLETE").is_file())
    lines: list[str] = []
    result = local(
        # A small model: its checkpoints are 30x smaller than resnet18's (the flag given last wins).
        trainer_spec(
            "--max-steps",
            "6",
            "--checkpoint-every-steps",
            "2",
            "--epochs",
            "20",
            "--model",
            "shufflenet_v2_x0_5",
        ),
        path_map={"/workspace": str(workspace)},
        log=lines.append,
        on_event=record_first_attempt(pids),
        grace_period_s=5,
    )
    killer.join()
    assert result.phase == "Succeeded" and result.restarts == 1
    assert any("worker-0 exited with code 137; restarting the group" in x for x in lines)
    assert result.summary["resumed_from_step"] is not None
    assert result.summary["resumed_from_step"] >= 2 and result.summary["steps"] == 6
    assert result.summary["world_size"] == 2
    # The resumed run finished as an uninterrupted one does: every output in its place.
    for rel in ("model/weights.pt", "model/model.json", "metrics.jsonl", "summary.json"):
        assert (workspace / "out" / rel).is_file(), rel
    assert any(x.startswith("[worker-0] ") for x in lines)  # Workers only, c10d rendezvous


def test_auto_runs_locally_as_the_api_of_its_options():
    plain = TrainSpec(name="j", workers=2)
    assert (local_api(plain), replica_names(plain)) == ("trainjob", ["node-0", "node-1"])
    runtime = TrainSpec(name="j", workers=2, api_options=TrainJobOptions(runtime_name="mine"))
    assert local_api(runtime) == "trainjob"
    master = TrainSpec(name="j", workers=2, api_options=PyTorchJobOptions(pytorch_master=True))
    assert local_api(master) == "pytorchjob"
    assert replica_names(master) == ["master-0", "worker-0"]  # not the TrainJob's nodes


def test_each_node_has_its_own_tmpdir_which_goes_with_it(
    script: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A node's temporary files (torchrun's logs among them) go to a TMPDIR of its own, as to a
    pod's /tmp emptyDir, and are gone after the run: nothing piles up in the machine's /tmp.
    The nodes' folder is WORKDIR/nodes when nothing else names one."""
    monkeypatch.delenv(NODES_DIR_ENV)
    ws = tmp_path / "ws"
    result = local(
        local_spec(script, "ok"),
        path_map={"/workspace": str(ws)},
        log=lambda line: None,
        workdir=tmp_path,
    )
    assert result.phase == "Succeeded"
    envs = [json.loads((ws / "out" / f"env-{r}.json").read_text()) for r in (0, 1)]
    tmpdirs = [Path(env["TMPDIR"]) for env in envs]
    assert tmpdirs == [tmp_path / "nodes" / name / "tmp" for name in ("master-0", "worker-0")]
    assert not any(folder.exists() for folder in tmpdirs)
    # env's own TMPDIR wins
    local(
        local_spec(script, "ok", env={"TMPDIR": "/workspace/scratch"}),
        path_map={"/workspace": str(ws)},
        log=lambda line: None,
        workdir=tmp_path,
    )
    assert json.loads((ws / "out" / "env-0.json").read_text())["TMPDIR"] == f"{ws}/scratch"
