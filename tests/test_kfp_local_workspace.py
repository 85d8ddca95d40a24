"""Every ``kfp.local.init`` in the tests and in the product names its workspace folder: without
``workspace_root`` kfp makes ``/tmp/kfp-workspace-XXXX`` and never removes it."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCANNED = ("tests", "pipelines", "components", "examples")


def _local_init_calls(path: Path) -> list[ast.Call]:
    tree = ast.parse(path.read_text(), str(path))
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "init"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "local"
    ]


def test_every_local_init_names_its_workspace():
    calls = {
        f"{path.relative_to(REPO)}:{call.lineno}": {k.arg for k in call.keywords}
        for folder in SCANNED
        for path in sorted((REPO / folder).rglob("*.py"))
        for call in _local_init_calls(path)
    }
    assert len(calls) >= 9, calls  # the scan finds them (the tests' 8, run-local's)
    leaking = sorted(where for where, keywords in calls.items() if "workspace_root" not in keywords)
    assert leaking == [], f"local.init without workspace_root (a /tmp folder stays): {leaking}"
