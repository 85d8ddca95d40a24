"""Fixtures of the launcher's tests: a stand-in API server and the scenarios it plays."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.launcher.fake_apiserver import FakeKubeAPI
from tests.launcher.fake_controller import Operator


@pytest.fixture
def fake_api() -> Iterator[Callable[..., FakeKubeAPI]]:
    """``fake_api(scenario=..., **options)`` → a started FakeKubeAPI, stopped after the test."""
    servers: list[FakeKubeAPI] = []

    def start(**options: Any) -> FakeKubeAPI:
        server = FakeKubeAPI(**options).__enter__()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.__exit__(None, None, None)
        assert not server.scenario_errors, server.scenario_errors


def succeed(workers: int = 2, *, lines: int = 3, restarts: int = 0, delay: float = 0.2):
    """Scenario: pods Pending → Running (logging) → the job's success condition."""

    def scenario(op: Operator) -> None:
        op.condition("Created")
        pods = [op.add_node(i) for i in range(workers)]
        op.sleep(delay)
        for pod in pods:
            op.running(pod, restarts=restarts)
        op.condition("Running")
        for step in range(lines):
            for i, pod in enumerate(pods):
                op.log(pod, f"step {step} from node {i}")
            op.sleep(delay)
        for pod in pods:
            op.terminate(pod)
        op.succeed()

    return scenario
