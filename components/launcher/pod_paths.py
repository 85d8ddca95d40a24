"""The pods' file system as the launcher lays it out: every container's root file system is
read-only, so what a program writes goes to the scratch emptyDirs (``SCRATCH_DIRS``), /dev/shm and
the job's volumes; and which node folders a hostPath may never be in."""

from __future__ import annotations

from typing import Any, NamedTuple

from components.launcher import sizing

IMAGE_HOME = "/home/kfp-ddp"
"""HOME of the image's kfp-ddp user (the Dockerfile); XDG_CACHE_HOME and every cache folder the
image names (Triton, TorchInductor, torch, matplotlib) are inside it."""


class ScratchDir(NamedTuple):
    """A folder the containers write although their root file system is read-only: an emptyDir
    of every pod, mounted into every container the launcher renders."""

    volume: str
    path: str
    size_gi: int
    """The emptyDir's sizeLimit in GiB (counted in the pod's ephemeral-storage, see sizing)."""
    holds: str
    """What is written there (named by the error that refuses another volume at its path)."""


SCRATCH_DIRS = (
    ScratchDir(
        volume="tmp",
        path="/tmp",
        size_gi=sizing.TMP_GI,
        holds="temporary files: Python's tempfile, torchrun's log folder, the C compiler of "
        "Triton and TorchInductor",
    ),
    ScratchDir(
        volume="home",
        path=IMAGE_HOME,
        size_gi=sizing.HOME_GI,
        holds="HOME and its caches: Triton, TorchInductor, torch, matplotlib, CUDA's JIT cache",
    ),
)
"""Every container's root file system is read-only (``readOnlyRootFilesystem``): these, /dev/shm
and the job's volumes (staging, PVCs) are all it may write."""
SCRATCH_ENV = {"HOME": IMAGE_HOME, "TMPDIR": "/tmp"}
"""Set in every container unless ``env`` sets them: whatever the image says, a program's home and
temporary files land on the scratch emptyDirs."""

SYSTEM_PATHS = (
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/home",
    "/lib",
    "/lib32",
    "/lib64",
    "/opt",
    "/proc",
    "/root",
    "/run",
    "/sbin",
    "/sys",
    "/tmp",
    "/usr",
    "/var/lib/containerd",
    "/var/lib/docker",
    "/var/lib/etcd",
    "/var/lib/kubelet",
    "/var/log",
    "/var/run",
)
"""Node folders a hostPath cache may never be in (the node's system, the kubelet's and the
container runtime's state, logs); the cache wants a folder of its own, e.g. /mnt/kfp-ddp-cache."""


def scratch_dir_at(path: Any) -> ScratchDir | None:
    """The scratch folder mounted exactly at ``path`` (None: none; a folder below one is fine)."""
    if not isinstance(path, str):
        return None
    return next((d for d in SCRATCH_DIRS if d.path == path.rstrip("/")), None)


def scratch_clash(scratch: ScratchDir) -> str:
    """Why a volume of the user's may not take a scratch folder's path, and what to do instead."""
    return (
        f"the pods mount their own emptyDir {scratch.volume!r} there ({scratch.holds}), as every "
        "container's root file system is read-only: mount the volume at another path (a folder "
        f"below {scratch.path} is fine), and point the program there (e.g. env "
        "TORCHINDUCTOR_CACHE_DIR for a cache kept between runs)"
    )


def host_path_problem(path: Any) -> str:
    """What is wrong with a hostPath cache folder ('' when nothing)."""
    if not isinstance(path, str) or not path.startswith("/"):
        return "must be an absolute folder of its own, such as /mnt/kfp-ddp-cache"
    parts = [p for p in path.split("/") if p]
    if ".." in parts or "." in parts:
        return "must be a plain absolute path (no . or ..)"
    if len(parts) < 2:
        return "must be a folder of its own at least two levels deep, such as /mnt/kfp-ddp-cache"
    normal = "/" + "/".join(parts)
    for system in SYSTEM_PATHS:
        if normal == system or normal.startswith(system + "/"):
            return (
                f"is inside {system}, a system folder of the node (the node's own files, the "
                "kubelet's or the container runtime's state): use a folder of its own, such as "
                "/mnt/kfp-ddp-cache"
            )
    return ""
