"""The official CRDs from ``../shared/reference`` as strict JSON-Schema validators (test helper).

Strict means what ``kubectl --validate=strict`` and the API server's pruning mean: a field the
schema does not declare is an error (the server would silently drop it). Kubernetes' own
requirements of every object (apiVersion, kind) are added; the CEL rules
(``x-kubernetes-validations``) are not evaluated.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import pytest
import yaml

REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference"
PROMETHEUS = REFERENCE / "prometheus-operator-v0.93"
CRDS = {
    "pytorchjob": REFERENCE / "kubeflow.org_pytorchjobs.yaml",
    "tfjob": REFERENCE / "training-operator-v1.9" / "kubeflow.org_tfjobs.yaml",
    "xgboostjob": REFERENCE / "training-operator-v1.9" / "kubeflow.org_xgboostjobs.yaml",
    "rayjob": REFERENCE / "kuberay-v1.7.0" / "ray.io_rayjobs.yaml",
    "mpijob": REFERENCE / "mpi-operator-v0.8.0" / "kubeflow.org_mpijobs.yaml",
    "trainjob": REFERENCE / "trainer-v2.3.0" / "trainer.kubeflow.org_trainjobs.yaml",
    "clustertrainingruntime": REFERENCE
    / "trainer-v2.3.0"
    / "trainer.kubeflow.org_clustertrainingruntimes.yaml",
    "podmonitor": PROMETHEUS / "monitoring.coreos.com_podmonitors.yaml",
    "servicemonitor": PROMETHEUS / "monitoring.coreos.com_servicemonitors.yaml",
    "prometheusrule": PROMETHEUS / "monitoring.coreos.com_prometheusrules.yaml",
}


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
        if schema.get("x-kubernetes-int-or-string"):
            out.pop("type", None)
            out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@functools.cache
def crd_validator(kind: str):
    """A Draft 7 validator of the CRD's served version (None when the file is absent)."""
    import jsonschema

    path = CRDS[kind]
    if not path.is_file():
        return None
    crd = yaml.load(path.read_text(), Loader=yaml.CSafeLoader)  # libyaml: megabytes of schema
    versions = crd["spec"]["versions"]
    version = next((v for v in versions if v.get("storage")), versions[0])
    schema = _strict(copy.deepcopy(version["schema"]["openAPIV3Schema"]))
    schema["required"] = sorted(set(schema.get("required", [])) | {"apiVersion", "kind"})
    checker = jsonschema.FormatChecker()

    @checker.checks("int32")
    def _int32(value: object) -> bool:
        return not isinstance(value, int) or -(2**31) <= value < 2**31

    @checker.checks("int64")
    def _int64(value: object) -> bool:
        return not isinstance(value, int) or -(2**63) <= value < 2**63

    return jsonschema.Draft7Validator(schema, format_checker=checker)


def require_crd(kind: str):
    """The validator of ``kind``, or skip the test naming the missing file."""
    validator = crd_validator(kind)
    if validator is None:
        pytest.skip(f"official CRD not found at {CRDS[kind]} (../shared/reference beside the repo)")
    return validator


def schema_errors(kind: str, manifest: dict[str, Any]) -> list[str]:
    """What the official CRD refuses in ``manifest`` (empty when valid). Without the CRD the
    calling test is skipped, saying which file is missing: it never passes unchecked."""
    validator = require_crd(kind)
    return [
        f"{'.'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}"
        for e in validator.iter_errors(manifest)
    ]
