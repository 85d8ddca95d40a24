"""A read-only root file system, checked two ways: in a pod's JSON, and on a running process.

``container_problems``: what a container of a pod spec (Kubernetes API JSON: a manifest's pod
template, a runtime patch or a pod the controllers created) lacks: ``readOnlyRootFilesystem``,
or a writable volume at a path its programs write.

Run as a script, a command runs as in such a container, the root read-only and a few folders
writable::

    unshare --mount --propagation private python tests/launcher/read_only_root.py \
        --writable DIR [--writable DIR ...] --trace LOG -- COMMAND ARGS...

In a mount namespace of its own (nothing changes for the rest of the machine): each ``--writable``
folder is bind-mounted onto itself (a mount of its own, so it stays writable), then every other
mount but /proc, /sys and /dev (whose /dev/shm a pod has too) is remounted read-only, and
``COMMAND`` runs under ``strace``, which logs every file-system call that failed (``--trace``):
a write the read-only root refused shows there as ``EROFS`` even where the program swallows the
error (a best-effort cache).
"""

from __future__ import annotations

import argparse
import os
import subprocess
from typing import Any

from components.launcher.spec import IMAGE_HOME

WRITTEN_BY_EVERY_CONTAINER = {
    "/tmp": "Python's tempfile, torchrun's torchelastic_* logs, TorchInductor's precompiled "
    "headers (TMPDIR/torchinductor_<user>), gcc's temporaries",
    f"{IMAGE_HOME}/.cache": "XDG_CACHE_HOME: Triton, TorchInductor, torch hub, matplotlib, the "
    "S3 sync's hash cache",
    f"{IMAGE_HOME}/.nv": "CUDA's JIT cache (ComputeCache)",
}
"""Paths our image's programs write in any container (the trainer, the stager)."""
READ_ONLY_KINDS = ("configMap", "secret", "downwardAPI", "projected")


def writable_volume(path: str, container: dict[str, Any], volumes: dict[str, Any]) -> str | None:
    """The name of the writable volume ``path`` lies on in ``container`` (None: the root's)."""
    mounts = [
        m
        for m in container.get("volumeMounts") or []
        if path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/")
    ]
    if not mounts:
        return None
    mount = max(mounts, key=lambda m: len(m["mountPath"]))  # the innermost mount holds it
    volume = volumes.get(mount["name"], {})
    claim = volume.get("persistentVolumeClaim") or {}
    if mount.get("readOnly") or claim.get("readOnly") or set(volume) & set(READ_ONLY_KINDS):
        return None
    return mount["name"]


def container_problems(
    container: dict[str, Any], volumes: dict[str, Any], written: list[str]
) -> list[str]:
    """What ``container`` lacks: a read-only root, a writable volume under each ``written``
    path, HOME and TMPDIR (its env) on such volumes."""
    name = container["name"]
    problems = []
    if (container.get("securityContext") or {}).get("readOnlyRootFilesystem") is not True:
        problems.append(f"{name}: no readOnlyRootFilesystem: true")
    env = {e["name"]: e.get("value") for e in container.get("env") or []}
    named = [env[k] for k in ("HOME", "TMPDIR", "XDG_CACHE_HOME", "S3SYNC_CACHE_DIR") if env.get(k)]
    for path in [*written, *named]:
        if writable_volume(path, container, volumes) is None:
            problems.append(f"{name}: {path} is on the read-only root (no writable volume)")
    return problems


KEPT = ("/proc", "/sys", "/dev")
"""Mounts left as they are: the kernel's, and the devices (a pod has its /dev and /dev/shm)."""


def mount_points() -> list[str]:
    """Every mount point of this namespace (mountinfo's field 5, octal escapes undone)."""
    with open("/proc/self/mountinfo") as handle:
        return [line.split()[4].encode().decode("unicode_escape") for line in handle]


def kept(point: str, writable: list[str]) -> bool:
    return point in writable or any(point == k or point.startswith(k + "/") for k in KEPT)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--writable", action="append", default=[])
    parser.add_argument("--trace", required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    writable = [os.path.realpath(folder) for folder in args.writable]
    for folder in writable:
        subprocess.run(["mount", "--bind", folder, folder], check=True)
    for point in mount_points():
        if not kept(point, writable):
            subprocess.run(["mount", "-o", "remount,bind,ro", point], check=True)
    strace = ["strace", "-f", "-qq", "--seccomp-bpf", "--failed-only", "-e", "trace=%file"]
    os.execvp("strace", [*strace, "-o", args.trace, "--", *command])


if __name__ == "__main__":
    main()
