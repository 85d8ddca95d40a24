"""Trainer tests run many small CPU trainings side by side with other suites on few cores."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def one_cpu_thread(monkeypatch):
    """One compute thread for in-process runs (the trainer keeps OMP_NUM_THREADS when set).

    On a busy 2-core machine two spinning OpenMP threads make a tiny run many times slower.
    """
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


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
