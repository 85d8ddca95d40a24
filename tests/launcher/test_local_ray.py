"""A RayJob run by the local backend as KubeRay runs it: a real Ray cluster on loopback (a head
that trains nothing, 2 worker nodes), the entrypoint run as the Ray job's driver once every
node joined: the user's own Ray program (examples/ray) and our trainer under Ray Train, 2
workers; the job succeeds when the driver does, and every Ray process goes with the job."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from components.launcher import JobFailed, LocalOptions, TrainSpec, run_job
from components.launcher.backends.local import LocalBackend
from tests.image_data import write_image_folder

pytest.importorskip("ray", reason="ray is not installed (the dev extras install it)")
pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
TINY = ["--model", "mobilenet_v3_small", "--image-size", "16", "--epochs", "1"]
RAY_IMAGE = "registry.example.com/ray:1"
"""An image with Ray, as a RayJob needs (the default image is refused; none is pulled here)."""


def _ray_processes(ray_dir_prefix: str = "kfp-ddp-ray-") -> list[str]:
    """Ray processes of a local RayJob still running (their command names our Ray folder)."""
    found = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    return [line for line in found.splitlines() if ray_dir_prefix in line]


def _options(tmp_path: Path, lines: list[str]) -> LocalOptions:
    return LocalOptions(log=lines.append, workdir=REPO, handle_sigterm=False)


def test_the_users_ray_program_runs_as_the_driver_on_a_cluster_of_two_workers(tmp_path):
    out = tmp_path / "primes.json"
    spec = TrainSpec.flat(
        api="rayjob",
        image=RAY_IMAGE,
        name="primes",
        workers=2,
        command=["python", "examples/ray/count_primes.py", "--limit", "30000"],
        args=["--output", str(out)],
        env={"OMP_NUM_THREADS": "1"},
    )
    lines: list[str] = []
    result = run_job(spec, backend="local", options=_options(tmp_path, lines))
    log = "\n".join(lines)
    assert result.phase == "Succeeded", log[-4000:]
    assert "[submitter] [ray] 3 Ray nodes up" in log
    said = json.loads(out.read_text())
    assert said["primes"] == 3245  # π(30000)
    assert said["nodes"] == 2  # the tasks ran on the worker nodes (the head has no CPUs)
    assert _ray_processes() == []


def test_our_trainer_trains_under_ray_train_with_two_workers(tmp_path):
    data = write_image_folder(tmp_path / "data", classes=("circle", "square"), per_class=8)
    out = tmp_path / "out"
    spec = TrainSpec.flat(
        api="rayjob",
        image=RAY_IMAGE,
        name="ray-ddp",
        workers=2,
        args=["--data-dir", str(data), "--output-dir", str(out), *TINY, "--batch-size", "2"],
        env={"OMP_NUM_THREADS": "1"},
    )
    lines: list[str] = []
    result = run_job(spec, backend="local", options=_options(tmp_path, lines))
    log = "\n".join(lines)
    assert result.phase == "Succeeded", log[-6000:]
    assert "[ray_train] done: the trainer exited 0 on all 2 workers" in log, log[-6000:]
    started = [line for line in lines if "Started training worker group of size 2" in line]
    assert len(started) == 1, started  # each Ray worker's line once, not once per Ray node
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] > 0, summary
    assert (out / "model" / "weights.pt").is_file()
    assert _ray_processes() == []


def test_a_failing_driver_fails_the_job_for_good_and_stops_the_ray_nodes(tmp_path):
    """Exit 2 is permanent: not retried, although ``backoff_limit`` would allow a new Ray
    cluster (on a cluster the launcher stops KubeRay's retries alike)."""
    spec = TrainSpec.flat(
        api="rayjob",
        image=RAY_IMAGE,
        name="bad",
        workers=1,
        command=["python", "-c", "import sys; print('bad input: --limit'); sys.exit(2)"],
        backoff_limit=1,
    )
    lines: list[str] = []
    with pytest.raises(JobFailed) as err:
        run_job(spec, backend="local", options=_options(tmp_path, lines))
    assert "submitter" in str(err.value) and "exit code 2" in str(err.value), str(err.value)
    assert sum("started 3 replica(s)" in line for line in lines) == 1  # never retried
    assert _ray_processes() == []


def test_a_dry_run_shows_the_driver_the_head_and_the_workers(tmp_path):
    spec = TrainSpec.flat(api="rayjob", name="dry", workers=2, nproc_per_node=2, image=RAY_IMAGE)
    planned = LocalBackend(LocalOptions(workdir=tmp_path)).dry_run(spec)
    replicas = {d["replica"]: d for d in planned.documents}
    assert list(replicas) == ["submitter", "head-0", "worker-0", "worker-1"]
    driver = replicas["submitter"]["command"]
    assert driver[driver.index("--") + 1 :][1:4] == ["-m", "trainer.ray_train", "--workers"]
    assert "--num-cpus=0" in replicas["head-0"]["command"]
    assert "--num-cpus=2" in replicas["worker-1"]["command"]
    head_port = replicas["head-0"]["command"][replicas["head-0"]["command"].index("--head") + 1]
    assert replicas["worker-0"]["env"]["RAY_ADDRESS"] == f"127.0.0.1:{head_port.split('=')[1]}"
    assert "RAY_ADDRESS" not in replicas["head-0"]["env"]
