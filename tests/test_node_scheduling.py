"""The suite's xdist scheduling keeps the real node's tests on one worker (two real nodes on one
host would share a bridge, ports and containerd's state: CI failed that way)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.node_scheduling import is_node_test

REPO = Path(__file__).resolve().parents[1]

RECORDING_TEST = """
import json, os, time
import pytest

@pytest.mark.parametrize("n", range({count}))
def test_it(n):
    time.sleep(0.05)
    with open(os.environ["RECORD"], "a") as out:
        out.write(json.dumps([__name__, os.environ["PYTEST_XDIST_WORKER"]]) + "\\n")
"""


def test_node_test_files_are_recognised_by_name():
    assert is_node_test("tests/launcher/test_real_node_jobs.py::test_x[trainjob]")
    assert is_node_test("tests/cluster/test_real_node.py::test_y")
    assert not is_node_test("tests/cluster/test_node_helpers.py::test_real_node")
    assert not is_node_test("tests/launcher/test_k8s_backend.py::test_real_node_jobs")


def test_the_real_node_tests_run_on_one_worker_one_after_another_the_others_on_both(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "conftest.py").write_text(
        "def pytest_xdist_make_scheduler(config, log):\n"
        "    from tests.node_scheduling import OneNodeWorkerScheduling\n"
        "    return OneNodeWorkerScheduling(config, log)\n"
    )
    files = {"test_real_node_a": 4, "test_other_1": 6, "test_real_node_b": 3, "test_other_2": 6}
    for name, count in files.items():
        (tmp_path / f"{name}.py").write_text(RECORDING_TEST.format(count=count))
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
    node_workers = {worker for module, worker in runs if module.startswith("test_real_node")}
    assert len(node_workers) == 1, runs
    # ... one after another, before the owner's other tests (its node starts once).
    (owner,) = node_workers
    owners = [module.startswith("test_real_node") for module, worker in runs if worker == owner]
    assert owners == sorted(owners, reverse=True), runs
    assert {worker for _, worker in runs} == {"gw0", "gw1"}, runs
