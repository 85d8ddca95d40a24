"""Our real image, built with podman from a local Debian base (no registry), run as clusters run it.

* every executor of both compiled pipelines and of every component file: its command's programs
  exist in the image, and its embedded component module loads and defines the function the
  executor names (what KFP's ``kfp.dsl.executor_main`` does first);
* the entry points users call: ``kfp-ddp --help``, ``python -m components.launcher --help``,
  ``python -m trainer.train --help``;
* the users clusters run it as: UID 1000 (the launcher's default) and an arbitrary UID with GID 0
  (OpenShift's restricted-v2), with a read-only root file system and writable volumes only where
  the launcher mounts them, without any capability or network; and without read-only root, the
  image's own HOME, caches and KFP's artifact folders are writable by both users.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from components.launcher.pod_paths import SCRATCH_DIRS
from tests import yaml_fast
from tests.containers.layouts import layout_path, oci_layout
from tests.containers.podman import REPO

pytestmark = pytest.mark.slow

COMPILED = sorted((REPO / "pipelines" / "compiled").glob("*.yaml")) + sorted(
    (REPO / "components" / "compiled").glob("*.yaml")
)
USERS = {"uid-1000": "1000:1000", "arbitrary-uid-gid-0": "1000940000:0"}
LOCKED_DOWN = ["--network", "none", "--cap-drop", "ALL", "--security-opt", "no-new-privileges"]
# What the launcher's pods mount writable besides their data volumes: its scratch emptyDirs.
WRITABLE = [scratch.path for scratch in SCRATCH_DIRS]

EXECUTOR_CHECK = r"""
import importlib.util, json, shutil, sys, tempfile
from pathlib import Path
problems = []
for item in json.load(open(sys.argv[1])):
    where = f"{item['file']} {item['executor']}"
    command = item["command"]
    for program in [command[0]] + (["mktemp", "python3"] if "mktemp" in " ".join(command) else []):
        if shutil.which(program) is None:
            problems.append(f"{where}: {program} is not on PATH")
    if "kfp.dsl.executor_main" in " ".join(command):
        if importlib.util.find_spec("kfp.dsl.executor_main") is None:
            problems.append(f"{where}: no kfp.dsl.executor_main")
        path = Path(tempfile.mkdtemp()) / "ephemeral_component.py"
        path.write_text(command[-1])
        spec = importlib.util.spec_from_file_location("ephemeral_component", path)
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception as err:
            problems.append(f"{where}: the component module does not load: {err!r}")
            continue
        function = item["args"][item["args"].index("--function_to_execute") + 1]
        if not callable(getattr(module, function, None)):
            problems.append(f"{where}: the module defines no {function}()")
    print("checked", where)
print(json.dumps(problems))
"""


def _executors() -> list[dict]:
    """Every executor's container command and arguments, as KFP's driver would run them."""
    found = []
    for path in COMPILED:
        for document in yaml_fast.safe_load_all(path.read_text()):
            spec = document.get("deploymentSpec") if isinstance(document, dict) else None
            for name, executor in (spec or {}).get("executors", {}).items():
                container = executor["container"]
                command, args = container.get("command", []), container.get("args", [])
                # KFP's Python components: `sh -ec SCRIPT MODULE_SOURCE`; SCRIPT writes $0 (the
                # embedded module) to a file and runs kfp.dsl.executor_main on it.
                found.append(
                    {
                        "file": path.relative_to(REPO).as_posix(),
                        "executor": name,
                        "command": command,
                        "args": args,
                    }
                )
    return found


def test_every_executor_of_the_compiled_files_exists_in_the_image(podman, cpu_image, tmp_path):
    executors = _executors()
    assert len(executors) >= 12, [e["executor"] for e in executors]  # both pipelines + components
    (tmp_path / "executors.json").write_text(json.dumps(executors))
    (tmp_path / "check.py").write_text(EXECUTOR_CHECK)
    tmp_path.chmod(0o755)
    result = podman.run(
        "run", "--rm", *LOCKED_DOWN, "--read-only", "--tmpfs", "/tmp",
        "-v", f"{tmp_path}:/check:ro", cpu_image,
        "python3", "/check/check.py", "/check/executors.json",
    )  # fmt: skip
    problems = json.loads(result.stdout.strip().splitlines()[-1])
    assert problems == []
    assert result.stdout.count("checked ") == len(executors)


def test_the_entry_points_users_call_run_in_the_image(podman, cpu_image):
    script = (
        "set -e; kfp-ddp --help; python -m components.launcher --help; "
        "python -m trainer.train --help; python -m components.s3_sync --help"
    )
    result = podman.run("run", "--rm", *LOCKED_DOWN, "--read-only", "--tmpfs", "/tmp",
                        cpu_image, "sh", "-c", script)  # fmt: skip
    out = result.stdout
    for usage in ("kfp-ddp [OPTIONS] COMMAND", "python -m components.launcher",
                  "python -m trainer.train"):  # fmt: skip
        assert usage in out, out[-2000:]


def _mounts(tmp_path: Path) -> list[str]:
    """A folder of mode 0777 at each path the launcher's pods mount writable, as the kubelet
    makes an emptyDir (podman's tmpfs would copy the image folder's owner and mode instead)."""
    out = []
    for index, path in enumerate(WRITABLE):
        folder = tmp_path / f"emptydir-{index}"
        folder.mkdir()
        folder.chmod(0o777)
        out += ["-v", f"{folder}:{path}"]
    return out


@pytest.mark.parametrize("user", list(USERS.values()), ids=list(USERS))
def test_the_trainer_trains_read_only_as_either_user(podman, cpu_image, tmp_path, user):
    """Read-only root, no capabilities, no network, writable only where the pods mount volumes:
    a short training run, its checkpoint and model, and a cache write under HOME."""
    script = (
        "set -e; id; "
        "python -m trainer.train --synthetic --output-dir /tmp/out --model mobilenet_v3_small "
        "--image-size 32 --batch-size 4 --synthetic-size 16 --num-classes 3 --max-steps 2 "
        "--checkpoint-every-steps 1; "
        "ls /tmp/out/model /tmp/out/checkpoints; "
        'python -c "import os, pathlib; '
        "p = pathlib.Path(os.environ['TORCHINDUCTOR_CACHE_DIR']); "
        "p.mkdir(parents=True, exist_ok=True); "
        "(p / 'x').write_text('ok'); print('cache writable')\""
    )
    result = podman.run("run", "--rm", *LOCKED_DOWN, "--read-only", *_mounts(tmp_path),
                        "--user", user, cpu_image, "sh", "-c", script, timeout=300)  # fmt: skip
    uid, gid = user.split(":")
    assert f"uid={uid}" in result.stdout and f"gid={gid}" in result.stdout
    assert "done: 2 steps" in result.stdout + result.stderr
    assert "step-2" in result.stdout and "cache writable" in result.stdout


@pytest.mark.parametrize("user", list(USERS.values()), ids=list(USERS))
def test_the_images_own_folders_are_writable_by_either_user(podman, cpu_image, user):
    """Without read-only root (a platform that allows it): HOME, its caches and KFP's artifact
    folders are writable by UID 1000 and by an arbitrary UID in group 0; the root is not."""
    script = (
        "set -e; for d in $HOME $XDG_CACHE_HOME /gcs /minio /s3; do "
        'mkdir -p "$d/probe" && echo ok > "$d/probe/file" && echo "writable $d"; done; '
        "if touch /opt/kfp-ddp/probe 2>/dev/null; then echo 'image files writable'; fi"
    )
    result = podman.run("run", "--rm", *LOCKED_DOWN, "--user", user, cpu_image,
                        "sh", "-c", script)  # fmt: skip
    for folder in ("/home/kfp-ddp", "/home/kfp-ddp/.cache", "/gcs", "/minio", "/s3"):
        assert f"writable {folder}\n" in result.stdout, result.stdout
    assert "image files writable" not in result.stdout


def test_the_cpu_image_pushed_to_a_registry_is_found_by_the_image_check_and_pulls_back(
    podman, cpu_image, oci_registry, tmp_path
):
    """What users do with a built image: push it, let `kfp-ddp upload|run|schedule` find it
    (the OCI distribution API), and pull it elsewhere. The push is skopeo's, from the image's
    OCI layout made once per build (layouts.py). The pull here is skopeo's too: every blob
    downloaded and checked against its digest, and the image is the one built (its config, which
    holds the uncompressed layers' digests). Unpacking and running a pulled image is the real
    node's part: containerd pulls this image from the same registry and runs it in a pod
    (tests/cluster/test_real_node.py); a second podman storage here cost ~60 s of CPU for it."""
    from pipelines.image_check import ImageMissing, check_images

    tag = cpu_image.rsplit(":", 1)[1]
    layout = oci_layout(podman, cpu_image)  # made once per build, then reused
    made = layout_path(layout).stat().st_mtime_ns
    assert oci_layout(podman, cpu_image) == layout
    assert layout_path(layout).stat().st_mtime_ns == made  # not made again
    pushed = oci_registry.push_oci_layout(layout, f"kfp-ddp:{tag}")
    check_images([pushed], what="kfp-ddp upload", find=lambda *_: None)
    with pytest.raises(ImageMissing, match=r"kfp-ddp:no-such-tag"):
        check_images([f"{oci_registry.host}/kfp-ddp:no-such-tag"], what="kfp-ddp upload")
    pulled = oci_registry.pull_oci_layout(pushed, tmp_path / "pulled")
    (entry,) = json.loads((pulled / "index.json").read_text())["manifests"]
    manifest = json.loads(_blob(pulled, entry["digest"]))
    built = podman.run("image", "inspect", "--format", "{{.Id}}", cpu_image).stdout.strip()
    assert manifest["config"]["digest"] == f"sha256:{built}"
    config = json.loads(_blob(pulled, manifest["config"]["digest"]))
    assert len(manifest["layers"]) == len(config["rootfs"]["diff_ids"]) > 1
    # Pushed and pulled as built: each layer is the uncompressed one the config names.
    assert [layer["digest"] for layer in manifest["layers"]] == config["rootfs"]["diff_ids"]


def _blob(layout: Path, digest: str) -> bytes:
    algorithm, value = digest.split(":", 1)
    return (layout / "blobs" / algorithm / value).read_bytes()
