"""Import a module written by a generator (``components.kfp.launcher.training_job_source``) from
a file, as a developer imports the module they generated for their own step inputs."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType


def import_written(source: str, folder: Path, name: str) -> ModuleType:
    """Write ``source`` to ``folder/name.py`` and import it (``inspect.getsource`` reads it)."""
    path = folder / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
