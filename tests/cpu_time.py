"""What each test costs the suite in CPU time, and a summary by file at the end of the run.

On 2 cores the suite is CPU-bound (4 workers keep both cores ~92 % busy from start to end), so a
test's wall time says little about what it costs: a test that waits leaves its core to another
worker, and one that starts 4 trainers takes both. Each test's CPU seconds are those of the
pytest process and of the children it reaped while the test ran (setup, call and teardown): the
trainers, kfp.local's steps, the servers a fixture stopped. They go into the test's junit record
as the property ``cpu_s``, and the terminal summary lists the files that cost the most.

Not counted in ``cpu_s``: processes this process does not reap (pods on the real node and
containers run under containerd and podman; Ray's daemons), and a session fixture's server until
its teardown, where all of its CPU lands in the test during whose teardown it stops: pytest tears
the session's fixtures down in the teardown of the last test a worker runs, so that test shows
the whole session's control planes and S3 server (~400 CPU-s in a full run).

So each test also records ``machine_cpu_s``: the busy CPU seconds of the whole machine over the
test (``/proc/stat``: all but idle and I/O wait). It counts everything a test makes run (pods,
containers, the control planes' API servers and controllers, Ray), but also whatever else runs
meanwhile: it is a test's true cost only when tests run one at a time on an otherwise idle
machine (``-n 0``, as ``make test-profile`` runs them). Then the summary ranks files by it.
"""

from __future__ import annotations

import os
import resource
from collections import defaultdict
from pathlib import Path

import pytest

CPU_KEY = "cpu_s"
MACHINE_KEY = "machine_cpu_s"
START = pytest.StashKey[tuple[float, float | None]]()
BUSY_FIELDS = (0, 1, 2, 5, 6, 7)
"""Of /proc/stat's ``cpu`` line: user, nice, system, irq, softirq, steal (guest time is in user)."""
SHOWN = 12


def cpu_seconds() -> float:
    """User + system CPU of this process and of its reaped children, in seconds."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


def machine_cpu_seconds() -> float | None:
    """Busy CPU seconds of the whole machine since it started; None without /proc/stat."""
    try:
        with Path("/proc/stat").open() as stat:
            fields = stat.readline().split()[1:]
    except OSError:
        return None
    return sum(int(fields[i]) for i in BUSY_FIELDS) / os.sysconf("SC_CLK_TCK")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[START] = (cpu_seconds(), machine_cpu_seconds())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    if call.when == "teardown" and START in item.stash:
        own, machine = item.stash[START]
        item.user_properties.append((CPU_KEY, round(cpu_seconds() - own, 2)))
        machine_now = machine_cpu_seconds()
        if machine is not None and machine_now is not None:
            item.user_properties.append((MACHINE_KEY, round(machine_now - machine, 2)))
    yield


class Summary:
    """CPU and wall seconds by test file, from the reports (the xdist controller gets them all).
    ``serial``: the tests ran one at a time, so the machine's CPU is theirs and ranks them."""

    def __init__(self, serial: bool) -> None:
        self.serial = serial
        self.wall: defaultdict[str, float] = defaultdict(float)
        self.cpu: dict[str, defaultdict[str, float]] = {
            CPU_KEY: defaultdict(float),
            MACHINE_KEY: defaultdict(float),
        }

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        path = report.nodeid.split("::", 1)[0]
        self.wall[path] += report.duration
        for key, value in report.user_properties:
            if key in self.cpu and isinstance(value, float):
                self.cpu[key][path] += value

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter) -> None:
        own, machine = self.cpu[CPU_KEY], self.cpu[MACHINE_KEY]
        if not own:
            return
        write = terminalreporter.write_line
        terminalreporter.section("CPU time by test file (tests/cpu_time.py)")
        total_wall = sum(self.wall.values())
        if self.serial and machine:
            busy, theirs = sum(machine.values()), sum(own.values())
            write(
                f"all {len(own)} files, one test at a time: the machine busy {busy:.0f} CPU-s "
                f"(the tests' own processes {theirs:.0f}) in {total_wall:.0f} s"
            )
            for path, cpu in sorted(machine.items(), key=lambda item: -item[1])[:SHOWN]:
                write(f"{cpu:8.0f} CPU-s {own[path]:8.0f} own {self.wall[path]:7.0f} s  {path}")
            return
        write(f"all {len(own)} files: {sum(own.values()):.0f} CPU-s in {total_wall:.0f} s of tests")
        for path, cpu in sorted(own.items(), key=lambda item: -item[1])[:SHOWN]:
            write(f"{cpu:8.0f} CPU-s {self.wall[path]:7.0f} s  {path}")


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller, or a run without xdist
        serial = not getattr(config.option, "numprocesses", None)
        config.pluginmanager.register(Summary(serial), "cpu-time-summary")
