"""Compressed copies of the test images, made once per image and pushed from there.

Pushing an image from podman's storage compresses its layers every time: ~38 s of CPU for the
CPU image (1.5 GB) on 2 cores, paid by every test process that pushes it to its registry. An OCI
layout (``skopeo copy containers-storage:IMAGE oci:DIR``) holds the compressed layers, and a push
from it uploads them as they are (~2.5 s). :func:`oci_layout` makes one per image ID under
``~/.cache/kfp-ddp/image/oci-layouts`` (``KFP_DDP_IMAGE_CACHE``, beside the CPU image's
wheels): a rebuilt image gets a new layout and the old one of the same name is removed; test
processes take turns on a lock per name, and a layout is renamed into place once complete.
"""

from __future__ import annotations

import fcntl
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
            copy = ["skopeo", "copy", "--quiet", f"containers-storage:{image_id}"]
            run_image_copy([*copy, f"oci:{partial}:{TAG}"], podman.env, COPY_TIMEOUT_S)
            partial.rename(layout)
        for other in folder.iterdir():  # an older build's layout, or an interrupted copy
            if other.is_dir() and other != layout:
                shutil.rmtree(other, ignore_errors=True)
    return f"oci:{layout}:{TAG}"


def layout_path(reference: str) -> Path:
    """The folder of an ``oci:DIR:TAG`` reference."""
    return Path(reference.removeprefix("oci:").rsplit(":", 1)[0])
