"""Data staged per node (no shared volume): the manifests of both APIs, the stager itself against
the test S3 server, and a local 2-node job whose nodes share nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from components.launcher import LocalOptions, SpecError, TrainSpec, build_manifest, run_job
from components.launcher.spec import STAGED_DATA
from components.s3_sync import sync
from tests.crds import schema_errors
from tests.image_data import write_image_folder
from tests.launcher.k8s_helpers import CPU_REQUEST_ENV
from tests.s3_env import use_s3_server

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
SCRATCH_ENV = [
    {"name": "HOME", "value": "/home/kfp-ddp"},
    {"name": "TMPDIR", "value": "/tmp"},
    # The stager's hash cache (an entry per file) on the volume that grows with the data set.
    {"name": "S3SYNC_CACHE_DIR", "value": "/stage/.s3-sync-cache"},
]
SCRATCH_MOUNTS = [
    {"name": "tmp", "mountPath": "/tmp"},
    {"name": "home", "mountPath": "/home/kfp-ddp"},
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
    m = build_manifest(TrainSpec.flat(api="pytorchjob", name="j", workers=2, **STAGED))
    pod = node_pod(m)
    (init,) = pod["initContainers"]
    assert init["name"] == "stage-data" and init["command"] == STAGE
    # The Secret's keys by reference, never their values.
    assert init["env"] == SCRATCH_ENV + SECRET_REFS
    stage_mount = {"name": "staged-data", "mountPath": "/stage"}
    assert init["volumeMounts"] == [*SCRATCH_MOUNTS, stage_mount]
    # Restricted Pod Security covers our init container too; its root is read-only.
    assert init["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
    }
    (container,) = pod["containers"]
    assert stage_mount in container["volumeMounts"]
    env = [e for e in container["env"] if not e["name"].startswith("PET_RDZV")]
    assert env == [*SCRATCH_ENV, CPU_REQUEST_ENV, *SECRET_REFS]
    # Bounded: the data set (size unknown here: 100Gi) and room for checkpoints (20Gi).
    assert {"name": "staged-data", "emptyDir": {"sizeLimit": "120Gi"}} in pod["volumes"]
    assert schema_errors("pytorchjob", m) == []


def test_a_trainjob_stages_then_execs_the_trainer():
    """Runtime patches cannot add an init container: the node's command stages first."""
    m = build_manifest(TrainSpec.flat(api="trainjob", name="j", workers=2, **STAGED))
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
    assert trainer["env"] == [*SCRATCH_ENV, CPU_REQUEST_ENV, *SECRET_REFS]
    pod = node_pod(m)
    assert {"name": "staged-data", "emptyDir": {"sizeLimit": "120Gi"}} in pod["volumes"]
    assert {"name": "staged-data", "mountPath": "/stage"} in pod["containers"][0]["volumeMounts"]
    assert schema_errors("trainjob", m) == []


@pytest.mark.parametrize("api", ["trainjob", "pytorchjob"])
def test_a_host_path_cache_keeps_staged_data_on_the_node(api):
    spec = TrainSpec.flat(
        api=api,
        name="j",
        stage_cache_host_path="/mnt/kfp-ddp-cache",
        pod_security="privileged",  # hostPath volumes: refused by baseline and restricted
        stage_data_bytes=50 * 2**30,
        **STAGED,
    )
    m = build_manifest(spec)
    pod = node_pod(m)
    # The data sets live in the node's cache; the link to this pod's data set, its checkpoints
    # and outputs stay on its own bounded emptyDir (no data in it: checkpoint room only), so two
    # jobs on one node never share a link or an output.
    assert pod["volumes"][-2:] == [
        {"name": "staged-data", "emptyDir": {"sizeLimit": "20Gi"}},
        {
            "name": "stage-cache",
            "hostPath": {"path": "/mnt/kfp-ddp-cache", "type": "DirectoryOrCreate"},
        },
    ]
    mounts = [
        {"name": "staged-data", "mountPath": "/stage"},
        {"name": "stage-cache", "mountPath": "/stage-cache"},
    ]
    (container,) = pod["containers"]
    assert container["volumeMounts"][-2:] == mounts
    command = (pod["initContainers"][0] if api == "pytorchjob" else m["spec"]["trainer"])["command"]
    assert command[3:] == [
        *("--source", "s3://datasets/cats", "--root", "/stage-cache", "--link", "/stage/current"),
        *("--keep-snapshots", "2"),
        *(["--", "python", "-m", "trainer.torchrun", "-m", "trainer.train"] * (api == "trainjob")),
    ]
    if api == "pytorchjob":
        assert pod["initContainers"][0]["volumeMounts"] == SCRATCH_MOUNTS + mounts
    assert schema_errors(api, m) == []
    text = yaml.safe_dump(m)
    assert "AKIA" not in text and "secretKeyRef" in text


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"stage_data_uri": "/local/data"}, "stage_data_uri"),
        ({"stage_cache_host_path": "/mnt/x"}, "set stage_data_uri too"),
        ({"stage_data_uri": "s3://bkt/d", "stage_cache_host_path": "relative"}, "absolute"),
        ({"stage_data_uri": "s3://bkt/d", "stage_cache_host_path": "/mnt/x"}, "privileged"),
        ({"s3_credentials_secret": "Bad Secret"}, "s3_credentials_secret"),
        ({"s3_endpoint": "minio:9000"}, "s3_endpoint"),
        ({"stage_data_uri": "s3://bkt/d", "pvcs": ["ws:/stage"]}, "/stage"),
        (
            {
                "stage_data_uri": "s3://bkt/d",
                "stage_cache_host_path": "/mnt/x",
                "pod_security": "privileged",
                "pvcs": ["ws:/stage-cache"],
            },
            "/stage-cache",
        ),
    ],
)
def test_bad_staging_settings_are_refused(kwargs, message):
    with pytest.raises(SpecError, match=message):
        TrainSpec.flat(name="j", **kwargs)


# -- the stager, against the test S3 server ----------------------------------------------------


@pytest.fixture
def dataset_uri(s3_server, monkeypatch, tmp_path_factory) -> str:
    use_s3_server(monkeypatch, s3_server, tmp_path_factory.mktemp("sync-cache"))
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


@pytest.fixture
def own_dataset_uri(dataset_uri, request) -> str:
    """A copy of the data set under a prefix of this test's own (it writes into it)."""
    uri = f"{dataset_uri}-{request.node.name[:40]}"
    sync(dataset_uri, str(Path(request.getfixturevalue("tmp_path")) / "copy"))
    sync(str(Path(request.getfixturevalue("tmp_path")) / "copy"), uri)
    return uri


def put(s3_server, uri: str, key: str, body: bytes) -> None:
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    s3_server.client().put_object(Bucket=bucket, Key=f"{prefix}/{key}", Body=body)


def test_a_cache_keeps_the_newest_data_sets_and_any_in_use(s3_server, own_dataset_uri, tmp_path):
    """A hostPath cache is bounded: each source keeps its 2 most recently used data sets; one a
    running command still reads is kept whatever its age, until that command ends."""
    cache, link = tmp_path / "cache", tmp_path / "pod" / "current"
    keep = ("--root", str(cache), "--link", str(link), "--keep-snapshots", "2")
    holder = subprocess.Popen(  # stage v1, then exec a command that keeps reading it
        [sys.executable, "-m", "components.s3_sync.stage", "--source", own_dataset_uri, *keep]
        + [
            "--",
            sys.executable,
            "-c",
            "import sys; print('reading', flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        lines = [holder.stdout.readline() for _ in range(3)]  # staged, evicted, the command
        assert lines[2] == "reading\n", lines
        v1 = link.resolve()
        snapshots = []
        for version in (2, 3, 4):
            put(s3_server, own_dataset_uri, f"train/a/new-{version}.txt", b"x" * version)
            done = stage("--source", own_dataset_uri, *keep)
            assert done.returncode == 0, done.stderr
            snapshots.append(link.resolve())
        v3, v4 = snapshots[1:]
        assert "evicted 1 cached data set(s), 1 in use kept" in done.stdout  # v2 went
        assert sorted(p for p in v1.parent.iterdir() if p.is_dir() and p.name != "mirror") == (
            sorted([v1, v3, v4])
        )
        assert (v1 / "train").is_dir()  # still complete for its reader
    finally:
        holder.communicate("", timeout=60)
    put(s3_server, own_dataset_uri, "train/a/new-5.txt", b"x" * 5)
    assert stage("--source", own_dataset_uri, *keep).returncode == 0
    left = sorted(p.name for p in v1.parent.iterdir() if not p.name.startswith("."))
    assert v1.name not in left and v3.name not in left and v4.name in left  # v1 free: evicted


def test_a_source_unused_for_long_leaves_the_cache(dataset_uri, tmp_path):
    from components.s3_sync.staging import evict
    from components.s3_sync.staging import stage as stage_into

    cache = tmp_path / "cache"
    old = stage_into(dataset_uri, cache).snapshot
    assert evict(cache, keep=2, max_idle_days=7).removed == []  # used just now
    later = evict(cache, keep=2, max_idle_days=7, now=time.time() + 8 * 86400)
    assert later.removed == [old, old.parent / "mirror"] and not old.exists()
    with pytest.raises(ValueError, match="at least 1"):
        evict(cache, keep=0, max_idle_days=7)


def test_an_unwritable_cache_says_whose_it_must_be(dataset_uri, tmp_path):
    cache = tmp_path / "root-owned"
    cache.mkdir(mode=0o555)
    try:
        done = stage("--source", dataset_uri, "--root", str(cache), "--keep-snapshots", "2")
    finally:
        cache.chmod(0o755)
    if os.geteuid() == 0:
        pytest.skip("running as root: every folder is writable")
    assert done.returncode == 2 and f"writable by UID {os.getuid()}" in done.stderr
    assert "Traceback" not in done.stderr


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
