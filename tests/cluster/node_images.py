"""The images node test modules run besides our CPU image, pushed to the node's registry in the
background from the node's start.

A module names its image with ``pytest.mark.node_image(NAME)`` (:data:`BUILDERS`: our image's
Ray and MPI variants, the XGBoost example's image; tests/containers/example_images.py). When
the node starts, our CPU image and then the images of the session's node tests are each built
unless up to date and pushed, one after another in a thread of their own (they share our
image's layers), while the plane starts and the first tests run; a module's fixture then takes
its image's name (:meth:`NodeImages.pushed`), at once when the push is done by then. Pushed by
each module's fixture in turn, on the node tests' one worker, they took ~6 s of its time
(1.5-2.7 s each, warm).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.containers.example_images import mpi_image, ray_image, xgboost_example_image
from tests.containers.layouts import oci_layout
from tests.containers.podman import Podman
from tests.containers.registry import LocalRegistry

MARK = "node_image"
PUSH_TIMEOUT_S = 1800
"""A cold build of an image (pip from the wheelhouse, apt for MPI) and its push."""


def _cpu(podman: Podman, cpu_image: str, folder: Path) -> tuple[str, str]:
    return cpu_image, cpu_image.rsplit("/", 1)[1]


def _ray(podman: Podman, cpu_image: str, folder: Path) -> tuple[str, str]:
    return ray_image(podman, cpu_image, folder), "kfp-ddp-ray:test"


def _mpi(podman: Podman, cpu_image: str, folder: Path) -> tuple[str, str]:
    built = mpi_image(podman, cpu_image)
    return built, built.rsplit("/", 1)[1]


def _xgboost(podman: Podman, cpu_image: str, folder: Path) -> tuple[str, str]:
    return xgboost_example_image(podman, cpu_image, folder), "kfp-ddp-xgb-example:test"


BUILDERS: dict[str, Callable[[Podman, str, Path], tuple[str, str]]] = {
    "cpu": _cpu,
    "ray": _ray,
    "mpi": _mpi,
    "xgboost": _xgboost,
}
"""Each image: our CPU image itself (``cpu``: every node test's, pushed first) or one built on it
(in ``podman``, a folder of its own for the build's context), and its name in the node's
registry."""


def marked_images(items: Iterable[pytest.Item]) -> list[str]:
    """The images ``items`` name with :data:`MARK`, in the order they run."""
    names: list[str] = []
    for item in items:
        for mark in item.iter_markers(MARK):
            if mark.args[0] not in names:
                names.append(mark.args[0])
    return names


@dataclass
class NodeImages:
    """The images pushed for the node's pods, each once, in a background thread."""

    podman: Podman
    cpu_image: str
    registry: LocalRegistry
    folder: Path
    futures: dict[str, Future[str]] = field(default_factory=dict)
    pool: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(1))

    def start(self, names: Iterable[str]) -> None:
        """Build (unless up to date) and push ``names`` in the background, in this order."""
        for name in names:
            self._submit(name)

    def pushed(self, name: str) -> str:
        """``name``'s image in the node's registry, once pushed (started now if it was not)."""
        return self._submit(name).result(timeout=PUSH_TIMEOUT_S)

    def close(self) -> None:
        """Nothing left running: a push under way ends, those not started never do."""
        self.pool.shutdown(wait=True, cancel_futures=True)

    def _submit(self, name: str) -> Future[str]:
        if name not in self.futures:
            self.futures[name] = self.pool.submit(self._push, name)
        return self.futures[name]

    def _push(self, name: str) -> str:
        built, target = BUILDERS[name](self.podman, self.cpu_image, self.folder / name)
        return self.registry.push_oci_layout(oci_layout(self.podman, built), target)
