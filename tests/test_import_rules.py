"""The import rule the layer contracts (``.importlinter``, checked by ``make lint``) cannot see: a
first-party import inside a function says why it is there.

Imports belong at the top of a module, where they show the module's layer. One inside a function
is for a reason the reader must be told in a comment (the line above it, or the import's own
line): a KFP component's body runs alone, a heavy dependency only one command needs, an optional
one. An import dodging a circle has no such reason: the contracts refuse circles.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("components", "kfp_ddp", "pipelines", "trainer")


def unexplained_imports(source: str, filename: str = "<source>") -> list[str]:
    """``file:line module`` of each first-party import inside a function with no comment on its
    line or on the line above it (or above the run of imports it belongs to)."""
    lines = source.splitlines()
    found = []
    for function in ast.walk(ast.parse(source)):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(function):
            module = _first_party(node)
            if module and not _explained(lines, node.lineno, node.end_lineno or node.lineno):
                found.append(f"{filename}:{node.lineno} {module}")
    return found


def _first_party(node: ast.AST) -> str | None:
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        name = node.module
    elif isinstance(node, ast.Import):
        name = node.names[0].name
    else:
        return None
    return name if name.split(".")[0] in PACKAGES else None


def _explained(lines: list[str], first: int, last: int) -> bool:
    if any("#" in lines[i - 1] for i in range(first, last + 1)):
        return True
    above = first - 1
    while above >= 1:
        text = lines[above - 1].strip()
        if text.startswith("#"):
            return True
        if not text.startswith(("from ", "import ")) and text:
            return False
        above -= 1
    return False


def _sources() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def test_every_first_party_import_inside_a_function_says_why():
    found = []
    for path in _sources():
        found += unexplained_imports(path.read_text(), str(path.relative_to(ROOT)))
    assert not found, (
        "first-party imports inside functions without a reason (move them to the top, or say "
        "why in a comment above them):\n" + "\n".join(found)
    )


@pytest.mark.parametrize(
    ("body", "flagged"),
    [
        ("def f():\n    from trainer.config import TrainConfig\n", True),
        ("def f():\n    import pipelines.cli\n", True),
        ("def f():\n    # KFP runs this body alone\n    from trainer import config\n", False),
        ("def f():\n    from trainer import config  # torch: only here\n", False),
        ("def f():\n    # a reason\n    import json\n    from trainer import config\n", False),
        ("def f():\n    x = 1\n    from trainer import config\n", True),
        ("def f():\n    import json\n", False),  # not first-party
        ("from trainer import config\n", False),  # at the top
    ],
)
def test_the_rule_flags_exactly_the_unexplained_ones(body, flagged):
    assert bool(unexplained_imports(textwrap.dedent(body))) is flagged


NO_TORCH_MODULES = (
    "components.launcher.__main__",  # `python -m components.launcher`
    "components.launcher.step",  # the launcher's KFP step
    "components.launcher.backends.kubernetes",
    "components.launcher.backends.local",
    "components.s3_sync.__main__",  # the S3 sync step and the staging init container
    "pipelines.cli",  # `kfp-ddp`
)
"""Modules whose processes never train: the launcher's pod (it talks to the Kubernetes API),
the staging init containers, the CLI. Importing torch costs each ~3 s of CPU and ~300 MB."""


def test_the_processes_that_never_train_do_not_import_torch():
    """Checked in a fresh interpreter: a function-level ``import torch`` (the only ones these
    modules reach) is fine; one at the top of anything they import is not."""
    import subprocess
    import sys

    code = (
        "import importlib, sys\n"
        f"for name in {NO_TORCH_MODULES!r}:\n"
        "    importlib.import_module(name)\n"
        "    heavy = sorted(m for m in ('torch', 'torchvision') if m in sys.modules)\n"
        "    if heavy:\n"
        "        print(name, 'imports', *heavy); break\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout == "", out.stdout
