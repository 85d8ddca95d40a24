"""The backend protocol (dry run, submit, follow, cancel) on the local backend, and the dry runs
of both backends: what a dry run shows is what a run starts, and it starts nothing."""

from __future__ import annotations

import json
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from components.launcher import JobCancelled, LocalOptions, TrainSpec
from components.launcher.__main__ import cli
from components.launcher.apis import build_manifest
from components.launcher.backends.kubernetes import KubernetesBackend
from components.launcher.backends.local import LocalBackend, tagged_pids
from components.launcher.monitoring_documents import monitoring_documents
from components.launcher.options import KubernetesOptions

DUMP_AND_WAIT = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    name = os.environ.get("PET_NODE_RANK") or json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    (out / f"env-{name}.json").write_text(json.dumps(dict(os.environ)))
    time.sleep(float(sys.argv[2]))
    """
)


def _spec(tmp_path: Path, seconds: float, **kw) -> TrainSpec:
    script = tmp_path / "dump.py"
    script.write_text(DUMP_AND_WAIT)
    base = {
        "name": "proto",
        "workers": 2,
        "command": [sys.executable, str(script)],
        "args": [str(tmp_path / "out"), str(seconds)],
    }
    return TrainSpec.flat(**(base | kw))


def _node_pids(job) -> list[int]:
    """The processes of the job's nodes (found by the tag in their environment)."""
    return [pid for r in job.replicas for pid in tagged_pids(f"{job.run.run_tag}/{r.name}")]


def _quiet(**kw) -> LocalOptions:
    return LocalOptions(log=lambda line: None, handle_sigterm=False, **kw)


@pytest.mark.parametrize(
    ("settings", "contract"),
    [
        ({}, ("PET_NODE_RANK", "PET_NNODES", "PET_MASTER_ADDR")),  # auto: a TrainJob's
        ({"api": "pytorchjob", "pytorch_master": True}, ("RANK", "WORLD_SIZE", "MASTER_ADDR")),
    ],
)
def test_a_local_dry_run_shows_the_contract_the_nodes_get(tmp_path: Path, settings, contract):
    spec = _spec(tmp_path, 0, **settings)
    backend = LocalBackend(_quiet())
    planned = backend.dry_run(spec)
    assert not (tmp_path / "out").exists()  # nothing ran
    assert planned.backend == "local" and len(planned.documents) == 2
    job = backend.submit(spec)
    result = backend.follow(job, threading.Event())
    assert result.phase == "Succeeded"
    for rank, document in enumerate(planned.documents):
        env = json.loads((tmp_path / "out" / f"env-{rank}.json").read_text())
        assert document["command"][-2:] == spec.args
        for name in contract:  # the same variables; the ports differ (free ones at submit)
            assert name in document["env"] and name in env
            if "PORT" not in name:
                assert document["env"][name] == env[name], name


def test_follow_cancels_the_job_when_the_event_is_set(tmp_path: Path):
    backend = LocalBackend(_quiet(grace_period_s=2))
    job = backend.submit(_spec(tmp_path, 60))
    cancelled = threading.Event()
    threading.Timer(1.0, cancelled.set).start()
    start = time.monotonic()
    with pytest.raises(JobCancelled) as err:
        backend.follow(job, cancelled)
    assert err.value.result.phase == "Cancelled" and time.monotonic() - start < 20
    assert all(r.proc.poll() is not None for r in job.replicas)
    assert not _node_pids(job)


def test_cancel_stops_every_node_of_a_submitted_job(tmp_path: Path):
    backend = LocalBackend(_quiet(grace_period_s=2))
    job = backend.submit(_spec(tmp_path, 60))
    deadline = time.monotonic() + 20
    while len(list((tmp_path / "out").glob("env-*.json"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(_node_pids(job)) >= 2  # both nodes run
    backend.cancel(job, "test")
    assert all(r.proc.poll() is not None for r in job.replicas)
    assert not _node_pids(job)


def test_a_kubernetes_dry_run_is_the_manifest_and_touches_no_cluster(tmp_path, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-such-kubeconfig"))
    spec = TrainSpec(name="proto", workers=2, metrics_port=9400)
    planned = KubernetesBackend(KubernetesOptions()).dry_run(spec)
    assert planned.api == "trainjob"  # auto renders Kubeflow's current API
    assert planned.documents == [build_manifest(spec), *monitoring_documents(spec)]
    assert [d["kind"] for d in planned.documents] == ["TrainJob", "PodMonitor", "PrometheusRule"]


def test_the_cli_dry_run_prints_each_node_and_starts_nothing(tmp_path: Path):
    out = tmp_path / "out"
    args = ["run", "--dry-run", "--api", "tfjob", "--workers", "2", "--ps-replicas", "1"]
    args += ["--image", "registry.example.com/tf:1", "--name", "tf"]
    args += ["--command", json.dumps([sys.executable, "-c", "pass"]), "--", str(out)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    nodes = list(yaml.safe_load_all(result.stdout))
    assert [n["replica"] for n in nodes] == ["chief-0", "worker-0", "ps-0"]
    tasks = [json.loads(n["env"]["TF_CONFIG"])["task"] for n in nodes]
    assert tasks == [
        {"type": "chief", "index": 0},
        {"type": "worker", "index": 0},
        {"type": "ps", "index": 0},
    ]
    assert not out.exists()
