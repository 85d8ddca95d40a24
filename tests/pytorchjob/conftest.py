"""Fixtures of the launcher's tests: the official CRD schema, a stand-in API server, scenarios."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.pytorchjob.fake_apiserver import FakeKubeAPI, Operator

CRD_PATH = Path(__file__).resolve().parents[3] / "shared/reference/kubeflow.org_pytorchjobs.yaml"


def _strict(schema: Any) -> Any:
    """The CRD schema as JSON Schema, refusing unknown fields (like `kubectl --validate=strict`)."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items() if not k.startswith("x-kubernetes-")}
        if (
            out.get("type") == "object"
            and "properties" in out
            and "additionalProperties" not in out
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@pytest.fixture(scope="session")
def crd_validator():
    """A jsonschema validator of the official PyTorchJob CRD (Training Operator v1.9.0)."""
    if not CRD_PATH.is_file():
        pytest.skip(f"official CRD not found at {CRD_PATH} (../shared/reference beside the repo)")
    import jsonschema

    crd = yaml.safe_load(CRD_PATH.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = _strict(copy.deepcopy(version["schema"]["openAPIV3Schema"]))
    # Kubernetes requires these of every object even though the schema leaves them optional.
    schema["required"] = sorted(set(schema.get("required", [])) | {"apiVersion", "kind", "spec"})
    checker = jsonschema.FormatChecker()

    @checker.checks("int32")
    def _int32(value: object) -> bool:
        return not isinstance(value, int) or -(2**31) <= value < 2**31

    @checker.checks("int64")
    def _int64(value: object) -> bool:
        return not isinstance(value, int) or -(2**63) <= value < 2**63

    return jsonschema.Draft7Validator(schema, format_checker=checker)


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
    """Scenario: pods Pending → Running (logging) → Succeeded."""

    def scenario(op: Operator) -> None:
        op.condition("Created")
        pods = [op.add_pod("Master", 0)] + [op.add_pod("Worker", i) for i in range(workers - 1)]
        op.sleep(delay)
        for pod in pods:
            op.running(pod, restarts=restarts)
        op.condition("Running")
        for step in range(lines):
            for pod in pods:
                op.log(pod, f"step {step} from {pod}")
            op.sleep(delay)
        for pod in pods:
            op.terminate(pod)
        op.condition("Succeeded")

    return scenario
