"""The suite's xdist scheduling keeps the real node's tests on one worker (two real nodes on one
host would share a bridge, ports and containerd's state: CI failed that way), and the tests that
use a control plane on that same worker (each plane then starts once in the session); a file with
a module-scoped fixture stays on the worker that took its first test (set up once, not twice)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.node_scheduling import has_a_module_fixture, is_node_test, uses_a_plane

REPO = Path(__file__).resolve().parents[1]

RECORDING_TEST = """
import json, os, time
import pytest

@pytest.fixture
def cluster():  # a plane fixture's name: tests/node_scheduling.py reads it from the file
    return None

@pytest.fixture(scope="module")
def shared():  # set up once per worker that runs one of this file's tests
    return None

@pytest.mark.parametrize("n", range({count}))
def test_it(n, {fixture}):
    time.sleep(0.05)
    with open(os.environ["RECORD"], "a") as out:
        out.write(json.dumps([__name__, os.environ["PYTEST_XDIST_WORKER"]]) + "\\n")
"""


def test_node_test_files_are_recognised_by_name():
    assert is_node_test("tests/launcher/test_real_node_jobs.py::test_x[trainjob]")
    assert is_node_test("tests/cluster/test_real_node.py::test_y")
    assert not is_node_test("tests/cluster/test_node_helpers.py::test_real_node")
    assert not is_node_test("tests/launcher/test_k8s_backend.py::test_real_node_jobs")


def test_plane_files_are_recognised_by_the_fixtures_their_functions_take():
    tests = REPO / "tests"
    assert uses_a_plane(tests / "launcher" / "test_k8s_backend.py")  # tests taking k8s
    assert uses_a_plane(tests / "launcher" / "test_pod_security.py")  # a fixture taking cluster
    assert uses_a_plane(tests / "pipelines" / "test_kfp_backend_compiler.py")  # clusters
    assert not uses_a_plane(tests / "trainer" / "test_train_ddp.py")
    assert not uses_a_plane(tests / "no_such_file.py")


def test_files_with_a_module_scoped_fixture_are_recognised():
    tests = REPO / "tests"
    assert has_a_module_fixture(tests / "trainer" / "test_ray_train.py")  # the Ray head
    assert has_a_module_fixture(tests / "pipelines" / "test_object_store_yaml.py")
    assert not has_a_module_fixture(tests / "trainer" / "test_train_ddp.py")
    assert not has_a_module_fixture(tests / "no_such_file.py")


def test_the_cluster_tests_run_on_one_worker_node_tests_first_the_others_on_both(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "conftest.py").write_text(
        "def pytest_xdist_make_scheduler(config, log):\n"
        "    from tests.node_scheduling import ClusterOwnerScheduling\n"
        "    return ClusterOwnerScheduling(config, log)\n"
    )
    files = {
        "test_real_node_a": 4,
        "test_other_1": 6,
        "test_plane_a": 3,
        "test_real_node_b": 3,
        "test_other_2": 6,
        "test_plane_b": 2,
        "test_shared_1": 6,
        "test_shared_2": 5,
    }
    fixtures = {"test_plane": "cluster", "test_shared": "shared"}
    for name, count in files.items():
        fixture = fixtures.get(name.rsplit("_", 1)[0], "tmp_path")
        (tmp_path / f"{name}.py").write_text(RECORDING_TEST.format(count=count, fixture=fixture))
    record = tmp_path / "record.jsonl"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
         "--maxschedchunk", "1", "-c", str(tmp_path / "pytest.ini"), str(tmp_path)],
        cwd=tmp_path,
        env={**os.environ, "RECORD": str(record), "PYTHONPATH": str(REPO)},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    runs = [json.loads(line) for line in record.read_text().splitlines()]
    assert len(runs) == sum(files.values())  # every test ran, once
    pinned = {"test_real_node": 0, "test_plane": 1}
    kinds = [(pinned.get(module.rsplit("_", 1)[0]), worker) for module, worker in runs]
    owners = {worker for kind, worker in kinds if kind is not None}
    assert len(owners) == 1, runs
    # ... the node's one after another, then the planes', before the owner's other tests.
    (owner,) = owners
    order = [2 if kind is None else kind for kind, worker in kinds if worker == owner]
    assert order == sorted(order), runs
    assert {worker for _, worker in runs} == {"gw0", "gw1"}, runs
    # A file with a module-scoped fixture: all its tests on one worker.
    for shared in ("test_shared_1", "test_shared_2"):
        assert len({worker for module, worker in runs if module == shared}) == 1, runs
