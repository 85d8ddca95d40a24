"""Every container the launcher renders has a read-only root file system, and every path its
programs write is a volume: /tmp and HOME (bounded emptyDirs, counted in the pod's disk),
/dev/shm, the staging volume, the job's PVCs.

The manifests of all three APIs are checked container by container (tests/launcher/
read_only_root.py says which paths are written and why); the image's environment (the
Dockerfile) is held to the mounts; volumes of the user's own may not take /tmp's or HOME's
place; and the real stager and trainer run as in a TrainJob's node with the root file system
made read-only (a mount namespace of their own), every failed write traced. The pods the real
controllers make of these manifests are checked in test_pod_security.py.
"""

from __future__ import annotations

import math
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import V1SecurityContext

from components.launcher import SpecError, TrainSpec, build_manifest
from components.launcher.sizing import GI, LOGS_GI, quantity
from components.launcher.spec import (
    IMAGE_HOME,
    NODE_OUTPUT,
    SCRATCH_DIRS,
    STAGE_CACHE,
    STAGE_ROOT,
    STAGE_SYNC_CACHE,
    STAGED_DATA,
)
from components.s3_sync import sync
from tests.image_data import write_image_folder
from tests.launcher.k8s_helpers import PROGRAMS
from tests.launcher.read_only_root import WRITTEN_BY_EVERY_CONTAINER, container_problems
from tests.trainer.trainer_launch import TINY, free_port

REPO = Path(__file__).resolve().parents[2]
STAGED = {"stage_data_uri": "s3://data/cats", "stage_data_digest": "0f3a" * 16}
HOST_CACHE = {"stage_cache_host_path": "/mnt/kfp-ddp-cache", "pod_security": "privileged"}
VARIANTS: dict[str, dict[str, Any]] = {
    "cpu": {},
    "gpu": {"gpus_per_worker": 1},
    "staged": STAGED | {"args": ["--data-dir", STAGED_DATA, "--output-dir", f"{NODE_OUTPUT}/r"]},
    "shared-volume": {
        "pvcs": ["ws:/workspace"],
        "args": ["--data-dir", "/workspace/data", "--output-dir", "/workspace/train/r"],
    },
    "host-cache": STAGED | HOST_CACHE,
    "no-shm": {"shm_size": None},
    "user-volume-in-home": {
        "pod_extras": {
            "volumes": [{"name": "aws", "secret": {"secretName": "aws-config"}}],
            "volume_mounts": [{"name": "aws", "mountPath": f"{IMAGE_HOME}/.aws", "readOnly": True}],
        }
    },
}


def pod_specs(manifest: dict[str, Any]) -> dict[str, tuple[dict[str, Any], list[Any]]]:
    """Replica → (its pod spec as rendered, the training container's env: a TrainJob's is in
    ``spec.trainer``, not in its runtime patch)."""
    if manifest["kind"] == "TrainJob":
        (patch,) = manifest["spec"]["runtimePatches"]
        (node,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
        env = manifest["spec"]["trainer"].get("env") or []
        return {"node": (node["template"]["spec"]["template"]["spec"], env)}
    (replicas,) = [v for k, v in manifest["spec"].items() if k.endswith("ReplicaSpecs")]
    found = {}
    for rtype, replica in replicas.items():
        pod = replica["template"]["spec"]
        found[rtype] = (pod, pod["containers"][0].get("env") or [])
    return found


def written_paths(spec: TrainSpec, init: bool) -> list[str]:
    """What the programs of a container of ``spec`` write: the image's every-container paths,
    /dev/shm (a training container's, when the spec mounts one), the staging folders, and the
    trainer's output and checkpoint folders as its arguments name them."""
    paths = list(WRITTEN_BY_EVERY_CONTAINER)
    if spec.stage_data_uri:
        root = STAGE_CACHE if spec.stage_cache_host_path else STAGE_ROOT
        paths += [root, STAGED_DATA, STAGE_SYNC_CACHE]
    if not init:
        paths += ["/dev/shm"] if spec.shm_size else []
        for flag in ("--output-dir", "--checkpoint-dir"):
            if spec.trainer_flag(flag):
                paths.append(spec.trainer_flag(flag))
    return paths


def problems_of(spec: TrainSpec) -> list[str]:
    found = []
    for rtype, (pod, env) in pod_specs(build_manifest(spec)).items():
        volumes = {v["name"]: v for v in pod.get("volumes") or []}
        containers = [(c, True) for c in pod.get("initContainers") or []]
        containers += [(c | {"env": c.get("env") or env}, False) for c in pod["containers"]]
        for container, init in containers:
            written = written_paths(spec, init)
            found += [f"{rtype} {p}" for p in container_problems(container, volumes, written)]
    return found


LEVELS = [
    (variant, level)
    for variant, settings in VARIANTS.items()
    for level in ("restricted", "baseline", "privileged")
    if level == settings.get("pod_security", level)  # a hostPath cache: privileged only
]


@pytest.mark.parametrize(("variant", "level"), LEVELS)
@pytest.mark.parametrize("api", ["trainjob", "pytorchjob", "tfjob", "xgboostjob"])
def test_every_container_has_a_read_only_root_and_a_volume_for_every_path_it_writes(
    api, variant, level
):
    settings = VARIANTS[variant] | {"pod_security": level}
    program = PROGRAMS[api] | {"args": settings.get("args", [])} if api in PROGRAMS else {}
    assert problems_of(TrainSpec.flat(api=api, name="j", workers=2, **(settings | program))) == []


def test_the_check_finds_a_writable_root_and_a_path_on_no_volume(monkeypatch):
    """The check above can fail: a container without the setting, a trainer writing where no
    volume is, a scratch folder gone."""
    from components.launcher import pod_parts, pod_security

    spec = TrainSpec(api="pytorchjob", name="j", args=["--output-dir", "/out"])
    assert problems_of(spec) == [
        "Worker pytorch: /out is on the read-only root (no writable volume)"
    ]
    monkeypatch.setattr(
        pod_security,
        "container_context",
        lambda s, **kw: V1SecurityContext(allow_privilege_escalation=False),
    )
    trainjob = TrainSpec(api="trainjob", name="j")
    assert "node node: no readOnlyRootFilesystem: true" in problems_of(trainjob)
    monkeypatch.undo()
    monkeypatch.setattr(pod_parts, "scratch_mounts", lambda: [])
    staged = problems_of(TrainSpec.flat(api="pytorchjob", name="j", **STAGED))
    assert "Worker stage-data: /tmp is on the read-only root (no writable volume)" in staged


@pytest.mark.parametrize("variant", ["cpu", "staged", "host-cache"])
@pytest.mark.parametrize("api", ["trainjob", "pytorchjob"])
def test_the_scratch_folders_are_bounded_and_counted_in_the_pods_disk(api, variant):
    """Each scratch emptyDir has a sizeLimit; the ephemeral-storage request (= limit) is the
    sum of the pod's disk-backed emptyDirs plus the containers' logs, the way the staging
    volume is counted."""
    spec = TrainSpec.flat(api=api, name="j", **VARIANTS[variant])
    ((pod, _),) = pod_specs(build_manifest(spec)).values()
    volumes = {v["name"]: v for v in pod["volumes"]}
    for scratch in SCRATCH_DIRS:
        assert volumes[scratch.volume] == {
            "name": scratch.volume,
            "emptyDir": {"sizeLimit": f"{scratch.size_gi}Gi"},
        }
    on_disk = [
        v["emptyDir"]["sizeLimit"]
        for v in volumes.values()
        if "emptyDir" in v and v["emptyDir"].get("medium") != "Memory"
    ]
    assert len(on_disk) == (3 if spec.stage_data_uri else 2)
    assert quantity(spec.disk()) == sum(quantity(size) for size in on_disk) + LOGS_GI * GI
    if not spec.stage_data_uri:
        assert spec.disk() == "4Gi"  # as before the read-only root: /tmp, HOME, logs


# -- the image's environment and the mounts ------------------------------------------------------


def dockerfile_env() -> dict[str, str]:
    """The Dockerfile's ENV values (``ENV A=1 \\`` continuation lines joined), but PATH (where
    the image's programs are: read, never written)."""
    text = (REPO / "Dockerfile").read_text().replace("\\\n", " ")
    env: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("ENV "):
            env |= dict(word.split("=", 1) for word in shlex.split(line[4:]))
    env.pop("PATH", None)
    return env


def test_the_images_environment_and_the_pods_mounts_agree():
    """HOME, XDG_CACHE_HOME and every cache folder the image names lie on a scratch emptyDir;
    the image sets no TMPDIR of its own (the pod sets /tmp, its emptyDir), and no Python
    bytecode is written beside the image's code."""
    env = dockerfile_env()
    text = (REPO / "Dockerfile").read_text()
    assert env["HOME"] == IMAGE_HOME and f"--home-dir {IMAGE_HOME}" in text
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert "TMPDIR" not in env
    named = {k: v for k, v in env.items() if v.startswith("/")}  # every folder it names
    assert set(named) >= {
        "HOME",
        "XDG_CACHE_HOME",
        "TRITON_CACHE_DIR",
        "TORCHINDUCTOR_CACHE_DIR",
        "TORCH_HOME",
        "MPLCONFIGDIR",
    }
    for api in ("trainjob", "pytorchjob"):
        spec = TrainSpec.flat(api=api, name="j", **STAGED)
        for pod, pod_env in pod_specs(build_manifest(spec)).values():
            volumes = {v["name"]: v for v in pod["volumes"]}
            for container in [*pod.get("initContainers", []), *pod["containers"]]:
                container = container | {"env": container.get("env") or pod_env}
                values = {e["name"]: e.get("value") for e in container["env"]}
                assert values["HOME"] == env["HOME"] and values["TMPDIR"] == "/tmp"
                assert container_problems(container, volumes, list(named.values())) == []


# -- volumes of the user's own at /tmp or HOME --------------------------------------------------


@pytest.mark.parametrize("path", ["/tmp", IMAGE_HOME, f"{IMAGE_HOME}/"])
def test_a_volume_of_the_users_may_not_take_a_scratch_folders_place(path):
    """Refused, naming the field: the pods' own emptyDir is mounted there (a read-only volume
    would leave nothing writable; a writable one would go unbounded and uncounted)."""
    with pytest.raises(SpecError, match=r"TrainSpec\.pvcs=.*the pods mount their own emptyDir"):
        TrainSpec(name="j", pvcs=[f"cache:{path}"])
    extras = {
        "volumes": [{"name": "cache", "persistentVolumeClaim": {"claimName": "cache"}}],
        "volume_mounts": [{"name": "cache", "mountPath": path}],
    }
    with pytest.raises(SpecError, match=r"TrainSpec\.pod_extras=.*mount their own emptyDir"):
        TrainSpec(name="j", pod_extras=extras)


def test_below_a_scratch_folder_and_other_names_are_fine():
    nested = TrainSpec(name="j", pvcs=[f"cache:{IMAGE_HOME}/.cache/torchinductor"])
    assert problems_of(nested) == []
    with pytest.raises(SpecError, match="volume home: the name of one of the spec's volumes"):
        TrainSpec(
            name="j",
            pod_extras={
                "volumes": [{"name": "home", "emptyDir": {}}],
                "volume_mounts": [{"name": "home", "mountPath": "/h"}],
            },
        )
    with pytest.raises(SpecError, match="env HOME: set twice"):
        TrainSpec(
            name="j",
            pod_extras={"env": [{"name": "HOME", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}]},
        )


# -- the real stager and trainer, the root file system read-only --------------------------------


def read_only_run_problem() -> str:
    """Why this machine cannot make a read-only root for a process ('' when it can)."""
    if os.geteuid() != 0:
        return "needs root (a mount namespace)"
    for tool in ("unshare", "strace"):
        if shutil.which(tool) is None:
            return f"needs {tool}"
    probe = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "mount", "-o", "remount,bind,ro", "/"],
        capture_output=True,
        text=True,
    )
    return "" if probe.returncode == 0 else f"cannot remount / read-only: {probe.stderr.strip()}"


def on_host(path: str, mounts: dict[str, Path]) -> str:
    """A pod path on this machine: under the folder that stands for its mount."""
    for mount in sorted(mounts, key=len, reverse=True):
        if path == mount or path.startswith(mount.rstrip("/") + "/"):
            return str(mounts[mount]) + path[len(mount) :]
    return path


def _value(var: dict, resources: dict, secret: dict[str, str], mounts: dict[str, Path]) -> str:
    """An env var's value in the pod, as the kubelet gives it: a value (its paths on this host),
    a Downward API resource (of the container's ``resources``, in whole ``divisor``s, rounded
    up) or a key of the Secret (by reference: the value comes from the server)."""
    if "value" in var:
        return on_host(var["value"], mounts)
    field = var["valueFrom"].get("resourceFieldRef")
    if field is None:
        return secret[var["name"]]
    kind, resource = field["resource"].split(".")
    amount = quantity(resources[kind][resource])
    return str(math.ceil(amount / quantity(field.get("divisor", "1"))))


@pytest.mark.slow
def test_the_stager_and_the_trainer_write_nothing_outside_the_pods_volumes(s3_env, tmp_path):
    """A TrainJob node's command (stage, then exec torchrun and the trainer) with the node
    container's env and mounts, the image's environment, each mount a fresh folder of its own
    and everything else read-only: it trains, and strace saw no write refused (EROFS), not even
    one a program swallows."""
    why = read_only_run_problem()
    if why:
        pytest.skip(why)
    bucket = s3_env.create_bucket("read-only-root")
    sync(str(write_image_folder(tmp_path / "data", per_class=4)), f"s3://{bucket}/data")
    spec = TrainSpec(
        api="trainjob",
        name="ro",
        stage_data_uri=f"s3://{bucket}/data",
        s3_endpoint=s3_env.endpoint_url,
        s3_credentials_secret="s3-credentials",
        args=[
            *("--data-dir", STAGED_DATA, "--output-dir", f"{NODE_OUTPUT}/run"),
            *(*TINY, "--batch-size", "4", "--epochs", "1"),
        ],
    )
    manifest = build_manifest(spec)
    ((pod, pod_env),) = pod_specs(manifest).values()
    (container,) = pod["containers"]
    mounts = {m["mountPath"]: tmp_path / "pod" / m["name"] for m in container["volumeMounts"]}
    mounts["/dev/shm"] = Path("/dev/shm")  # the node's own, as a pod has it (Memory emptyDir)
    for folder in mounts.values():
        folder.mkdir(parents=True, exist_ok=True)
    secret = {k: v for k, v in s3_env.env().items() if k.startswith("AWS_")}
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "LANG": "C.UTF-8"}
    env |= {k: on_host(v, mounts) for k, v in dockerfile_env().items()}
    resources = manifest["spec"]["trainer"]["resourcesPerNode"]  # the node container's
    for var in pod_env:
        env[var["name"]] = _value(var, resources, secret, mounts)
    env |= {  # what the Trainer's torch runtime gives the node (one node, one process)
        "PET_NNODES": "1",
        "PET_NPROC_PER_NODE": "1",
        "PET_NODE_RANK": "0",
        "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": str(free_port()),
        "GLOO_SOCKET_IFNAME": "lo",
        "OMP_NUM_THREADS": "1",
    }
    command = [on_host(a, mounts) for a in manifest["spec"]["trainer"]["command"]]
    command += [on_host(a, mounts) for a in manifest["spec"]["trainer"]["args"]]
    trace = tmp_path / "trace" / "strace.log"
    trace.parent.mkdir()
    writable = [str(folder) for path, folder in mounts.items() if path != "/dev/shm"]
    runner = [sys.executable, "-m", "tests.launcher.read_only_root", "--trace", str(trace)]
    runner += [f"--writable={folder}" for folder in [*writable, str(trace.parent)]]
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", *runner, "--", *command],
        cwd=REPO,  # the image's code, read-only like its WORKDIR
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    refused = [line for line in trace.read_text().splitlines() if "EROFS" in line]
    assert refused == [], "\n".join(refused[:20])
    output = Path(on_host(f"{NODE_OUTPUT}/run", mounts))
    assert (output / "summary.json").is_file() and (output / "model").is_dir()
    # Each write went where the manifest says: the hash cache on the staging volume, torchrun's
    # logs in /tmp, nothing under the image's code.
    assert list(Path(on_host(STAGE_SYNC_CACHE, mounts)).glob("*.json"))
    assert list(Path(on_host("/tmp", mounts)).glob("torchelastic_*"))
    assert "stage: " in done.stdout and re.search(r"\[trainer\] done", done.stdout + done.stderr)
