"""The real node's image store, kept from one test session to the next (as podman's storage is).

containerd's root (its content store, the unpacked overlayfs snapshots, its metadata) lives in the
image cache, ``~/.cache/kfp-ddp/image/node-containerd`` (``KFP_DDP_IMAGE_CACHE``), not in the
session's folder. The kubelet still pulls every image from the loopback registry by name, and the
registry listens on a new port each session, so every name is new: containerd asks the registry
for the manifest and fetches and unpacks only the layers it does not hold. A warm session's pull
of our CPU image took ~1 s instead of ~24 s (1.5 GB unpacked).

What stays between sessions is only what the last session pulled, by image ID: when the node
stops (:meth:`ImageStore.forget`, containerd still running, the kubelet gone) every task and
container is deleted, every image name is removed, and so is every image ID the session did not
use; containerd's garbage collector then removes their content and snapshots. A node that was
not stopped (the session killed) leaves its marker behind, and the next start empties the store.
Only one node runs per host at a time (the host lock of ``tests/cluster/node_plugin.py``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.containers.example_images import CACHE

STORE = CACHE / "node-containerd"
IN_USE = ".in-use"
"""Written when a node starts on the store, removed when it has stopped cleanly."""
CRI_FOLDERS = ("io.containerd.grpc.v1.cri/containers", "io.containerd.grpc.v1.cri/sandboxes")
"""The CRI plugin's per-container files (status, hosts, resolv.conf) kept in the root."""
CTR_TIMEOUT_S = 60


@dataclass
class ImageStore:
    """containerd's root for the node, and its clean-up between sessions."""

    root: Path = STORE
    forgotten: bool = False
    """True once :meth:`forget` ran to the end: the store can be kept."""

    def claim(self) -> Path:
        """Mark the store in use (emptied first when its last node was not stopped); its path."""
        marker = self.root / IN_USE
        if marker.exists():
            shutil.rmtree(self.root)  # files only: the mounts died with that node's namespace
        self.root.mkdir(parents=True, exist_ok=True)
        marker.write_text(f"pid {os.getpid()}\n")
        self.forgotten = False
        return self.root

    def forget(self, ctr: list[str]) -> None:
        """Every task and container deleted, every image name and every ID not pulled this
        session removed (``ctr`` reaches the node's running containerd, namespace ``k8s.io``)."""
        for task in _lines(ctr, "tasks", "ls", "-q"):
            _ctr(ctr, "tasks", "delete", "--force", task)
        containers = _lines(ctr, "containers", "ls", "-q")
        if containers:
            _ctr(ctr, "containers", "rm", *containers)
        drop = images_to_forget(_ctr(ctr, "images", "ls"))
        if drop:
            _ctr(ctr, "images", "rm", "--sync", *drop)  # their content collected now
        self.forgotten = True

    def release(self) -> None:
        """After containerd stopped: keep the store when :meth:`forget` completed, else leave the
        marker (the next node starts on an empty store)."""
        if not self.forgotten:
            return
        for folder in CRI_FOLDERS:
            shutil.rmtree(self.root / folder, ignore_errors=True)
        (self.root / IN_USE).unlink(missing_ok=True)


def images_to_forget(listing: str) -> list[str]:
    """Of ``ctr images ls``'s table (REF TYPE DIGEST SIZE PLATFORMS LABELS), the references to
    remove: every name, and every ID (``sha256:…``) whose image no name points to."""
    rows = [line.split() for line in listing.splitlines()[1:] if line.strip()]
    named = {row[2] for row in rows if not row[0].startswith("sha256:")}
    return [row[0] for row in rows if not row[0].startswith("sha256:") or row[2] not in named]


def _ctr(ctr: list[str], *args: str) -> str:
    result = subprocess.run(
        [*ctr, *args], capture_output=True, text=True, timeout=CTR_TIMEOUT_S, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"ctr {' '.join(args[:2])} failed: {result.stderr.strip()[-500:]}")
    return result.stdout


def _lines(ctr: list[str], *args: str) -> list[str]:
    return [line for line in _ctr(ctr, *args).splitlines() if line.strip()]
