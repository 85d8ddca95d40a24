"""What each test costs the suite in CPU time, and a summary by file at the end of the run.

On 2 cores the suite is CPU-bound (both cores ~90 % busy from start to end), so a test's wall
time says little about what it costs: a test that waits leaves its core to the other worker, and
one that starts 4 trainers takes both. Each test's CPU seconds are those of the pytest process
and of the children it reaped while the test ran (setup, call and teardown): the trainers,
kfp.local's steps, the servers a fixture stopped. They go into the test's junit record as the
property ``cpu_s``, and the terminal summary lists the files that cost the most.

Not counted: processes this process does not reap (pods on the real node and containers run under
containerd and podman), and a session fixture's server until its teardown, where all of its CPU
lands in the test during whose teardown it stops.
"""

from __future__ import annotations

import resource
from collections import defaultdict

import pytest

CPU_KEY = "cpu_s"
START = pytest.StashKey[float]()
SHOWN = 12


def cpu_seconds() -> float:
    """User + system CPU of this process and of its reaped children, in seconds."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[START] = cpu_seconds()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    if call.when == "teardown" and START in item.stash:
        item.user_properties.append((CPU_KEY, round(cpu_seconds() - item.stash[START], 2)))
    yield


class Summary:
    """CPU and wall seconds by test file, from the reports (the xdist controller gets them all)."""

    def __init__(self) -> None:
        self.cpu: defaultdict[str, float] = defaultdict(float)
        self.wall: defaultdict[str, float] = defaultdict(float)

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        path = report.nodeid.split("::", 1)[0]
        self.wall[path] += report.duration
        for key, value in report.user_properties:
            if key == CPU_KEY and isinstance(value, float):
                self.cpu[path] += value

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.cpu:
            return
        write = terminalreporter.write_line
        terminalreporter.section("CPU time by test file (tests/cpu_time.py)")
        total_cpu, total_wall = sum(self.cpu.values()), sum(self.wall.values())
        write(f"all {len(self.cpu)} files: {total_cpu:.0f} CPU-s in {total_wall:.0f} s of tests")
        for path, cpu in sorted(self.cpu.items(), key=lambda item: -item[1])[:SHOWN]:
            write(f"{cpu:8.0f} CPU-s {self.wall[path]:7.0f} s  {path}")


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller, or a run without xdist
        config.pluginmanager.register(Summary(), "cpu-time-summary")
