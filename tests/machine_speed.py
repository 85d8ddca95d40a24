"""How fast this machine ran the suite: a fixed reference job timed before and after the tests.

This VM's speed drifts without steal time showing it: the same code took 896 s and 1,060 s on
the same machine 80 minutes apart, and the CPU time of one pure-Python loop varied by as much
(0.62-0.76 s) over the same day. So two runs' wall times (or busy CPU-seconds) cannot say
whether a change made the suite cheaper. The summary line says how long the reference job took
before the tests and after, and how many reference jobs the machine's busy CPU-seconds over the
session were worth: runs are compared by that count, which the drift should move far less.

Only the xdist controller (or a run without xdist) measures: ~0.6 s of CPU before the workers
start and ~0.6 s after they have ended.
"""

from __future__ import annotations

import time

import pytest

from tests.cpu_time import machine_cpu_seconds

REPEATS = 3
"""The reference job runs this many times; the fastest counts (an interrupt only slows one)."""
LOOP = 4_000_000
"""~0.2 s of CPU on this machine."""


def reference_job_cpu_s() -> float:
    """CPU seconds of a fixed pure-Python loop (integer arithmetic, one core), the fastest of
    ``REPEATS`` runs."""
    best = float("inf")
    for _ in range(REPEATS):
        started = time.process_time()
        total = 0
        for i in range(LOOP):
            total += i * i
        best = min(best, time.process_time() - started)
    return best


class MachineSpeed:
    def __init__(self) -> None:
        self.before = reference_job_cpu_s()
        self.busy_before = machine_cpu_seconds()

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter) -> None:
        busy_after = machine_cpu_seconds()
        after = reference_job_cpu_s()
        line = (
            f"machine speed (tests/machine_speed.py): the reference job took {self.before:.3f} "
            f"CPU-s before the tests and {after:.3f} after"
        )
        if self.busy_before is not None and busy_after is not None:
            busy = busy_after - self.busy_before
            jobs = busy / ((self.before + after) / 2)
            line += (
                f"; the machine was busy {busy:,.0f} CPU-s over the session, {jobs:,.0f} "
                "reference jobs (compare runs by this count, not by their wall time)"
            )
        terminalreporter.write_line(line)


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller, or a run without xdist
        config.pluginmanager.register(MachineSpeed(), "machine-speed")
