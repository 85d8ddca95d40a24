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
