"""tests/cpu_time.py: a test's CPU seconds, its children's included, in its junit record and the
summary by file; a test that only waits costs next to none."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

BURN = "import time\nend = time.process_time() + 0.8\nwhile time.process_time() < end: pass"
DETACHED = (
    "import os, sys, time\n"
    "if os.fork():\n    sys.exit(0)\n"  # the child exits at once: the grandchild is not ours
    "end = time.process_time() + 0.8\nwhile time.process_time() < end: pass\n"
    "open(sys.argv[1], 'w').close()\n"
)


def test_a_tests_cpu_and_its_childrens_are_recorded_and_summed_by_file(pytester, monkeypatch):
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)  # CI's --junitxml is not this run's
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    pytester.makepyfile(
        test_burn=f"""
        import subprocess, sys, time

        def test_a_child_computes():
            subprocess.run([sys.executable, "-c", {BURN!r}], check=True)

        def test_it_waits():
            time.sleep(0.8)

        def test_a_detached_process_computes(tmp_path):
            done = tmp_path / "done"
            subprocess.run([sys.executable, "-c", {DETACHED!r}, str(done)], check=True)
            while not done.exists():
                time.sleep(0.05)
        """
    )
    result = pytester.runpytest_subprocess(
        "-p", "tests.cpu_time", "-p", "no:cacheprovider", "--junitxml=report.xml"
    )
    result.assert_outcomes(passed=3)
    cpu, machine = ({}, {})
    for case in ET.parse(pytester.path / "report.xml").iter("testcase"):
        for prop in case.iter("property"):
            kept = {"cpu_s": cpu, "machine_cpu_s": machine}[prop.get("name")]
            kept[case.get("name")] = float(prop.get("value"))
    assert cpu["test_a_child_computes"] >= 0.8, cpu  # the child's 0.8 s, reaped in the test
    assert cpu["test_it_waits"] < 0.4, cpu
    # A process it does not reap is not its own CPU, but the machine's counts it (and whatever
    # else this machine ran meanwhile: at least the 0.8 s).
    assert cpu["test_a_detached_process_computes"] < 0.4, cpu
    assert machine["test_a_detached_process_computes"] >= 0.8, machine
    assert machine["test_a_child_computes"] >= 0.8, machine
    result.stdout.fnmatch_lines(
        [
            "*CPU time by test file*",
            "all 1 files, one test at a time: the machine busy * CPU-s (the tests' own processes *",
            "* CPU-s * own * s  test_burn.py",
        ]
    )
