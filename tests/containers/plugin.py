"""Fixtures for the tests that run our real image (registered in tests/conftest.py).

* ``podman`` — :class:`~tests.containers.podman.Podman` for this test process (skips, saying
  which package is missing, where containers cannot run);
* ``cpu_image`` — the CPU image ``localhost/kfp-ddp:<version>-cpu``, built by ``image/build.sh
  local`` (``make image-local``) once per session: the build labels the image with a hash of
  its inputs and builds nothing when they did not change, and test processes take turns on a
  lock, so a warm suite pays a second or two;
* ``private_network`` — a bridge of this test process's own (see ``PrivateNetwork``);
* ``bridge_s3`` — the test S3 server listening on that bridge's host address only.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.containers.podman import DockerSocket, Podman, PrivateNetwork, missing

BUILD_TIMEOUT_S = 1800  # cold, on 2 busy cores: the base (~90 s), the wheels, the layers (~4 min)


def _worker_index(worker_id: str) -> int:
    return int(worker_id.removeprefix("gw")) if worker_id.startswith("gw") else 0


NETNS = Path("/run/netns")
"""Where podman keeps its containers' network namespaces (it makes the folder a mount point)."""


@pytest.fixture(scope="session")
def podman(tmp_path_factory) -> Iterator[Podman]:
    reason = missing()
    if reason:
        pytest.skip(reason)
    mounted_before = os.path.ismount(NETNS)
    yield Podman(tmp_path_factory.mktemp("podman"))
    # The mount point podman made, once no namespace is left in it (another user's stays).
    if not mounted_before and os.path.ismount(NETNS) and not any(NETNS.iterdir()):
        subprocess.run(["umount", str(NETNS)], capture_output=True, timeout=30)


@pytest.fixture(scope="session")
def cpu_image(podman, tmp_path_factory, worker_id) -> str:
    """The CPU image's name, built (or found up to date) by ``image/build.sh local``."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if worker_id != "master" else base
    with open(shared / "cpu-image.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time; the next finds it up to date
        return podman.build_script("local", python=sys.executable, timeout=BUILD_TIMEOUT_S)


@pytest.fixture(scope="session")
def private_network(podman, worker_id):
    index = 10 + _worker_index(worker_id)
    network = PrivateNetwork(
        name=f"kfp-ddp-test-{index}", bridge=f"kfpddp{index}", subnet_index=index, podman=podman
    )
    network.create()
    yield network
    network.remove()


@pytest.fixture(scope="session")
def bridge_s3(private_network):
    """SeaweedFS on the private bridge's host address: containers on it reach it, nothing else."""
    from kfp_ddp.local_s3 import LocalS3Server

    with LocalS3Server(host=private_network.gateway) as server:
        yield server


@pytest.fixture(scope="session")
def docker_socket(podman):
    """Docker's API on a unix socket (podman system service), for kfp.local's DockerRunner."""
    socket = DockerSocket(podman).start()
    yield socket
    socket.stop()
