"""Fixtures shared by every test area. Area-specific fixtures live in tests/<area>/conftest.py."""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

# OpenMP threads that find no work spin before they sleep (libgomp's default), taking the cores
# the suite's other processes are waiting for: the suite keeps 2 cores busy with more threads
# than that. Passive waiting, for this process (set before torch loads libgomp) and every
# process a test starts. Measured: 3 two-thread ResNet-18 trainings side by side on 2 cores took
# 88.9 s and 174 CPU-s; 20.2 s and 36 CPU-s with OMP_WAIT_POLICY=PASSIVE.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# Byte code cached (in the __pycache__ folders git ignores) by every process the suite starts,
# where PYTHONDONTWRITEBYTECODE=1 is set (as on these machines); this process too, from
# pytest_configure. Otherwise every xdist worker rewrites the asserts of every test module again
# as it collects them: measured here, one collection took 11.1 s, 7.6 s with the cache.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

from kfp_ddp.free_ports import free_port
from tests import kfp_caller_name
from tests.image_data import write_image_folder
from tests.node_scheduling import (
    PLANE_FIXTURES,
    ClusterOwnerScheduling,
    file_of,
    is_node_test,
    uses_a_plane,
)
from tests.s3_env import use_s3_server, use_s3_variables

pytest_plugins = [
    "pytester",
    "tests.cpu_time",
    "tests.machine_speed",
    # before the plugins that import it, so that pytest rewrites its asserts
    "tests.containers.registry",
    "tests.cluster.plugin",
    "tests.cluster.node_plugin",
    "tests.containers.plugin",
]

SHARED_DIR = Path(__file__).resolve().parents[1].parent / "shared"


def pytest_configure(config: pytest.Config) -> None:
    sys.dont_write_bytecode = False  # before the test modules are collected (see above)
    kfp_caller_name.install()  # tests/kfp_caller_name.py: ~1 s less per pipeline build


@pytest.hookimpl(optionalhook=True)  # without xdist (-p no:xdist) there is no such hook
def pytest_xdist_make_scheduler(config, log):
    """The real node's and the control planes' tests on one worker (tests/node_scheduling.py)."""
    return ClusterOwnerScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the real node's tests first, then those of the files that use a control plane, then
    the tests marked ``slow`` (otherwise in collection order).

    Without xdist, so that the node and the planes each start once and stop after their last
    test (tests/cluster/node_plugin.py, tests/cluster/plugin.py); with xdist one worker takes
    those in this order anyway (tests/node_scheduling.py).

    With xdist a long test that starts last leaves the other workers idle until it ends; started
    first, the short tests fill in around it (``--maxschedchunk 1`` in pyproject.toml: a worker
    takes the next test when it is free, not a fixed share). The order is the same in every
    worker, as xdist requires.
    """
    for item in items:  # xdist's scheduler knows them by file name only
        if (item.get_closest_marker("node") is not None) != is_node_test(item.nodeid):
            raise pytest.UsageError(
                f"{item.nodeid}: tests marked 'node' belong in files named test_real_node*.py "
                "(and only they): tests/node_scheduling.py keeps those on one worker"
            )
        planes = PLANE_FIXTURES.intersection(getattr(item, "fixturenames", ()))
        if planes and not uses_a_plane(config.rootpath / file_of(item.nodeid)):
            raise pytest.UsageError(
                f"{item.nodeid} uses a control plane ({', '.join(sorted(planes))}) through a "
                "fixture of another file: take the plane fixture in a function of the test's "
                "own file, so that tests/node_scheduling.py sees it from the file"
            )
    items.sort(
        key=lambda item: (
            not is_node_test(item.nodeid),
            not uses_a_plane(config.rootpath / file_of(item.nodeid)),
            item.get_closest_marker("slow") is None,
        )
    )


@pytest.fixture
def image_folder(tmp_path: Path) -> Path:
    """A tiny 3-class ImageFolder with train/ and val/ splits of 16x16 PNGs."""
    return write_image_folder(tmp_path / "data")


@pytest.fixture(scope="session")
def s3_server():
    """A running LocalS3Server (SeaweedFS on 127.0.0.1, free ports, enforced key pair)."""
    from kfp_ddp.local_s3 import LocalS3Server

    with LocalS3Server() as server:
        yield server


@pytest.fixture(scope="session")
def moto_server() -> Iterator[str]:
    """Endpoint URL of moto's S3 server on 127.0.0.1: it stores keys SeaweedFS refuses (``..``, a
    name of more than 255 bytes), as AWS S3 does."""
    from moto.server import ThreadedMotoServer  # optional: only these tests start it

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture
def moto_env(moto_server, monkeypatch, tmp_path_factory):
    """The standard AWS variables point at ``moto_server`` and nothing else leaks in (as
    ``s3_env`` does for SeaweedFS); a boto3 client of it."""
    import boto3  # optional: only these tests use it
    from botocore.config import Config

    variables = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL_S3": moto_server,
    }
    use_s3_variables(monkeypatch, variables, tmp_path_factory.mktemp("s3sync-cache"))
    return boto3.client("s3", config=Config(s3={"addressing_style": "path"}))


@pytest.fixture
def s3_env(s3_server, monkeypatch, tmp_path_factory):
    """The standard AWS env vars point at ``s3_server`` and nothing else leaks in (inherited by
    the processes a test starts)."""
    use_s3_server(monkeypatch, s3_server, tmp_path_factory.mktemp("s3sync-cache"))
    return s3_server


@pytest.fixture
def bucket(s3_env, request) -> str:
    """A fresh bucket on ``s3_server``, named after the test."""
    name = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:45]
    return s3_env.create_bucket(f"t-{name}-{time.monotonic_ns() % 100000}".strip("-"))


@pytest.fixture
def small_disk(tmp_path):
    """``small_disk(size_bytes)`` mounts a tmpfs of that size and returns it (a real full disk).

    Needs root (or CAP_SYS_ADMIN): the test is skipped, saying so, where mount is refused.
    """
    import subprocess

    mounted = []

    def mount(size_bytes: int):
        point = tmp_path / f"small-disk-{len(mounted)}"
        point.mkdir()
        command = ["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(point)]
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=30)
        except OSError as err:
            pytest.skip(f"cannot run mount to make a small tmpfs: {err}")
        if result.returncode != 0:
            pytest.skip(
                f"cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN): {result.stderr.strip()}"
            )
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", "-l", str(point)], capture_output=True, timeout=30)
