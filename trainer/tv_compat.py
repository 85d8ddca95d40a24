"""Import torchvision on a CPU-only torch whose torchvision wheel is a CUDA build.

PyPI's torchvision wheels are built against CUDA. With the CPU build of torch, torchvision's C++
extension (``_C.so``) cannot load, and ``import torchvision`` then dies in import-time code that
looks up ``torchvision::nms`` ("operator torchvision::nms does not exist").

:func:`import_torchvision` probes whether that extension loads. Only when it does not, it declares
the schemas of the ops that import-time code touches, so that models, transforms and datasets work;
detection ops (``ops.nms``) and ``io.decode_*`` stay unavailable (decode images with PIL). With a
matching (e.g. CUDA) install the probe succeeds and this is a plain ``import torchvision``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import torch

# Schemas of the ops that torchvision's import-time code resolves (_meta_registrations.py).
_MISSING_OP_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
# The Library object must stay alive, or torch unregisters the schemas again.
_stub_library: torch.library.Library | None = None


def _extension_loads() -> bool:
    """True when torchvision's compiled ops load (a matching install), without importing it."""
    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("torchvision is not installed: pip install torchvision")
    for location in spec.submodule_search_locations:
        for candidate in Path(location).glob("_C*.so"):
            try:
                torch.ops.load_library(str(candidate))
                return True
            except (OSError, RuntimeError):
                return False
    return False


def cpu_stub_ops_installed() -> bool:
    """Whether this process runs torchvision with declared-only (stub) C++ ops."""
    return _stub_library is not None


def import_torchvision() -> ModuleType:
    """Return the ``torchvision`` module, importable on CPU-only torch too."""
    global _stub_library
    if "torchvision" in sys.modules:
        return sys.modules["torchvision"]
    if not _extension_loads() and _stub_library is None:
        library = torch.library.Library("torchvision", "DEF")
        for schema in _MISSING_OP_SCHEMAS:
            library.define(schema)
        _stub_library = library
    import torchvision

    return torchvision
