"""Copies of the test images as OCI layouts, made once per image and pushed from there.

Pushing an image from podman's storage compresses its layers every time: ~38 s of CPU for the
CPU image (1.5 GB) on 2 cores, paid by every test process that pushes it to its registry. An OCI
layout (``skopeo copy containers-storage:IMAGE oci:DIR``) holds the layers, and a push from it
uploads them as they are (``LocalRegistry.push_oci_layout``). :func:`oci_layout` makes one per
image ID under ``~/.cache/kfp-ddp/image/oci-layouts`` (``KFP_DDP_IMAGE_CACHE``, beside the CPU
image's wheels): a rebuilt image gets a new layout and the old one of the same name is removed;
test processes take turns on a lock per name, and a layout is renamed into place once complete.

The layers are kept uncompressed (``--dest-oci-accept-uncompressed-layers``; an OCI media type
that registries and containerd take), so that a layer is named by the digest podman's storage
knows it by, and a new layout starts with hard links to the blobs of the layouts already made:
skopeo writes only the layers it does not find there. Measured on this 2-core machine, the
copy of the CPU image took 25 s of CPU gzipped, 13.5 s uncompressed and 0.05 s with every layer
found; the three images built on it then took 0.9 to 4.9 s each, their own layers only. After a
source change, the CPU image's one small layer and the others' top layers are written again.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
from pathlib import Path

from tests.containers.example_images import CACHE
from tests.containers.podman import Podman
from tests.containers.registry import run_image_copy

LAYOUTS = CACHE / "oci-layouts"
TAG = "image"
"""The one tag inside each layout."""
COPY_TIMEOUT_S = 900


def oci_layout(podman: Podman, image: str) -> str:
    """``oci:DIR:image``: the layout of ``image`` (a name in ``podman``'s storage), made now
    unless there is one for the image's current ID."""
    image_id = podman.run("image", "inspect", "--format", "{{.Id}}", image).stdout.strip()
    folder = LAYOUTS / re.sub(r"[^A-Za-z0-9_.-]+", "_", image)
    layout = folder / image_id[:16]
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not layout.is_dir():
            partial = folder / f".{layout.name}.partial"
            shutil.rmtree(partial, ignore_errors=True)
            _link_known_blobs(partial / "blobs" / "sha256")
            copy = ["skopeo", "copy", "--quiet", "--dest-oci-accept-uncompressed-layers"]
            copy += [f"containers-storage:{image_id}", f"oci:{partial}:{TAG}"]
            run_image_copy(copy, podman.env, COPY_TIMEOUT_S)
            _remove_unused_blobs(partial)
            partial.rename(layout)
        for other in folder.iterdir():  # an older build's layout, or an interrupted copy
            if other.is_dir() and other != layout:
                shutil.rmtree(other, ignore_errors=True)
    return f"oci:{layout}:{TAG}"


def layout_path(reference: str) -> Path:
    """The folder of an ``oci:DIR:TAG`` reference."""
    return Path(reference.removeprefix("oci:").rsplit(":", 1)[0])


def _link_known_blobs(blobs: Path) -> None:
    """Hard links in ``blobs`` to the blobs of every complete layout (of any image): the layers
    skopeo finds there by digest it does not copy again. A blob that goes meanwhile (another
    process removed an old layout) or cannot be linked is left to skopeo."""
    blobs.mkdir(parents=True)
    for known in LAYOUTS.glob("*/[!.]*/blobs/sha256/*"):
        with contextlib.suppress(OSError):
            os.link(known, blobs / known.name)


def _remove_unused_blobs(layout: Path) -> None:
    """Remove the linked blobs that the layout's image does not use (its index, manifests,
    configs and layers are what is kept)."""
    blobs = layout / "blobs" / "sha256"

    def blob(digest: str) -> Path:
        return blobs / digest.removeprefix("sha256:")

    used: set[str] = set()
    for entry in json.loads((layout / "index.json").read_text())["manifests"]:
        manifest = json.loads(blob(entry["digest"]).read_text())
        used |= {entry["digest"], manifest["config"]["digest"]}
        used |= {layer["digest"] for layer in manifest["layers"]}
    for path in blobs.iterdir():
        if f"sha256:{path.name}" not in used:
            path.unlink()
