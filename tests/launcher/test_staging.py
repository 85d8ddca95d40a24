"""Data staged per node (no shared volume): the manifests of both APIs, the stager itself against
the test S3 server, and a local 2-node job whose nodes share nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from components.launcher import LocalOptions, SpecError, TrainSpec, build_manifest, run_job
from components.launcher.spec import STAGED_DATA
from components.s3_sync import sync
from tests.crds import schema_errors
from tests.image_data import write_image_folder

REPO = Path(__file__).resolve().parents[2]
STAGED = {
    "stage_data_uri": "s3://datasets/cats",
    "s3_credentials_secret": "s3-credentials",
    "s3_endpoint": "https://minio.example.com",
}


def node_pod(manifest: dict) -> dict:
    if manifest["kind"] == "PyTorchJob":
        (replica,) = manifest["spec"]["pytorchReplicaSpecs"].values()  # Workers only
        return replica["template"]["spec"]
    (patch,) = manifest["spec"]["runtimePatches"]
    (node,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    return node["template"]["spec"]["template"]["spec"]


SECRET_REFS = [
    {"name": "AWS_ENDPOINT_URL_S3", "value": "https://minio.example.com"},
    {
        "name": "AWS_ACCESS_KEY_ID",
        "valueFrom": {"secretKeyRef": {"key": "AWS_ACCESS_KEY_ID", "name": "s3-credentials"}},
    },
    {
        "name": "AWS_SECRET_ACCESS_KEY",
        "valueFrom": {"secretKeyRef": {"key": "AWS_SECRET_ACCESS_KEY", "name": "s3-credentials"}},
    },
]
STAGE = [
    "python",
    "-m",
    "components.s3_sync.stage",
    "--source",
    "s3://datasets/cats",
    "--root",
    "/stage",
    "--link",
    "/stage/current",
]


def test_a_pytorchjob_stages_in_an_init_container():
    m = build_manifest(TrainSpec(api="pytorchjob", name="j", workers=2, **STAGED))
    pod = node_pod(m)
    (init,) = pod["initContainers"]
    assert init["name"] == "stage-data" and init["command"] == STAGE
    assert init["env"] == SECRET_REFS  # the Secret's keys by reference, never their values
    assert init["volumeMounts"] == [{"name": "staged-data", "mountPath": "/stage"}]
    # Restricted Pod Security covers our init container too.
    assert init["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    (container,) = pod["containers"]
    assert {"name": "staged-data", "mountPath": "/stage"} in container["volumeMounts"]
    assert [e for e in container["env"] if not e["name"].startswith("PET_RDZV")] == SECRET_REFS
    # Bounded: the data set (size unknown here: 100Gi) and room for checkpoints (20Gi).
    assert {"name": "staged-data", "emptyDir": {"sizeLimit": "120Gi"}} in pod["volumes"]
    assert schema_errors("pytorchjob", m) == []


def test_a_trainjob_stages_then_execs_the_trainer():
    """Runtime patches cannot add an init container: the node's command stages first."""
    m = build_manifest(TrainSpec(api="trainjob", name="j", workers=2, **STAGED))
    trainer = m["spec"]["trainer"]
    assert trainer["command"] == [
        *STAGE,
        "--",
        "python",
        "-m",
        "trainer.torchrun",
        "-m",
        "trainer.train",
    ]
    assert trainer["env"] == SECRET_REFS
    pod = node_pod(m)
    assert {"name": "staged-data", "emptyDir": {"sizeLimit": "120Gi"}} in pod["volumes"]
    assert {"name": "staged-data", "mountPath": "/stage"} in pod["containers"][0]["volumeMounts"]
    assert schema_errors("trainjob", m) == []


@pytest.mark.parametrize("api", ["trainjob", "pytorchjob"])
def test_a_host_path_cache_keeps_staged_data_on_the_node(api):
    spec = TrainSpec(
        api=api,
        name="j",
        stage_cache_host_path="/mnt/kfp-ddp-cache",
        pod_security="privileged",  # hostPath volumes: refused by baseline and restricted
        **STAGED,
    )
    m = build_manifest(spec)
    assert {
        "name": "staged-data",
        "hostPath": {"path": "/mnt/kfp-ddp-cache", "type": "DirectoryOrCreate"},
    } in node_pod(m)["volumes"]
    assert schema_errors(api, m) == []
    text = yaml.safe_dump(m)
    assert "AKIA" not in text and "secretKeyRef" in text


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"stage_data_uri": "/local/data"}, "stage_data_uri"),
        ({"stage_cache_host_path": "/mnt/x"}, "set stage_data_uri too"),
        ({"stage_data_uri": "s3://b/d", "stage_cache_host_path": "relative"}, "absolute"),
        ({"stage_data_uri": "s3://b/d", "stage_cache_host_path": "/mnt/x"}, "privileged"),
        ({"s3_credentials_secret": "Bad Secret"}, "s3_credentials_secret"),
        ({"s3_endpoint": "minio:9000"}, "s3_endpoint"),
        ({"stage_data_uri": "s3://b/d", "pvcs": ["ws:/stage"]}, "/stage"),
    ],
)
def test_bad_staging_settings_are_refused(kwargs, message):
    with pytest.raises(SpecError, match=message):
        TrainSpec(name="j", **kwargs)


# -- the stager, against the test S3 server ----------------------------------------------------


@pytest.fixture
def dataset_uri(s3_server, monkeypatch, tmp_path_factory) -> str:
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("S3SYNC_CACHE_DIR", str(tmp_path_factory.mktemp("sync-cache")))
    bucket = s3_server.create_bucket("staging")
    data = write_image_folder(tmp_path_factory.mktemp("dataset") / "data", per_class=4)
    uri = f"s3://{bucket}/data"
    sync(str(data), uri)
    return uri


def stage(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "components.s3_sync.stage", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )


def test_the_stager_links_the_frozen_data_and_runs_the_command(dataset_uri, tmp_path):
    root, link = tmp_path / "stage", tmp_path / "stage" / "current"
    command = [sys.executable, "-c", "import os, sys; print('ran in', os.getcwd()); sys.exit(7)"]
    first = stage("--source", dataset_uri, "--root", str(root), "--link", str(link), "--", *command)
    assert first.returncode == 7, first.stderr  # exec'd: the command's own exit code
    assert "ran in" in first.stdout and "transferred" in first.stdout
    assert sorted(p.name for p in link.iterdir()) == ["train", "val"]
    assert link.resolve().parent.parent == root  # root/<source key>/<digest>
    again = stage("--source", dataset_uri, "--root", str(root), "--link", str(link))
    assert again.returncode == 0 and "transferred 0 of 24" in again.stdout  # a cached node
    for output in (first.stdout + first.stderr, again.stdout + again.stderr):
        assert "AWS_SECRET" not in output


def test_the_stager_refuses_what_it_cannot_stage(dataset_uri, tmp_path):
    bad = stage("--source", "/not/s3", "--root", str(tmp_path))
    assert bad.returncode == 2 and "s3://bucket/prefix" in bad.stderr
    missing = stage("--source", "s3://no-such-bucket-here/x", "--root", str(tmp_path), "--", "true")
    assert missing.returncode in (1, 2) and "Traceback" not in missing.stderr


# -- a local job whose nodes share nothing -------------------------------------------------------


@pytest.mark.slow
def test_each_local_node_stages_its_own_copy_and_trains(dataset_uri, tmp_path):
    out = tmp_path / "out"
    spec = TrainSpec(
        api="trainjob",
        name="staged",
        workers=2,
        stage_data_uri=dataset_uri,
        args=[
            *("--data-dir", STAGED_DATA, "--output-dir", "/out"),
            *("--model", "shufflenet_v2_x0_5", "--image-size", "16", "--batch-size", "4"),
            *("--epochs", "1"),
        ],
    )
    lines: list[str] = []
    options = LocalOptions(workdir=tmp_path, path_map={"/out": str(out)}, log=lines.append)
    result = run_job(spec, backend="local", options=options)
    assert result.phase == "Succeeded" and result.summary["world_size"] == 2
    for node in ("node-0", "node-1"):
        staged = tmp_path / "nodes" / node / "stage" / "current"
        assert sorted(p.name for p in staged.iterdir()) == ["train", "val"], node
        assert any(x.startswith(f"[{node}] stage: ") for x in lines), node
    assert json.loads((out / "summary.json").read_text())["steps"] >= 1
