"""Test speed only: kfp's ``PipelineTask`` names its caller without ``inspect.stack()``.

kfp 2.17's ``PipelineTask._ensure_container_spec_exists`` runs ``inspect.stack()[1][3]`` on every
``set_cpu_request``, ``set_memory_request``, ``set_env_variable``... call, only to name that method
in an error. ``inspect.stack()`` builds every frame's source context, and each frame's
``inspect.getmodule`` walks ``sys.modules``: in a pytest worker (a stack of ~70 frames, ~10,000
modules loaded: torch, ray, the Kubernetes client's models) that is ~0.1 s per call, 1.2 s per
build of our pipeline, where a plain ``kfp-ddp`` process builds it in 25 ms. Measured: 65 of the
85 s of tests/pipelines/test_cli_local_commands.py were in it.

:func:`install` gives that module an ``inspect`` whose ``stack()[n]`` is the same frame record
``inspect.stack()`` has at ``n`` (frame, file, line, function name), read from the frame itself;
the rest of ``inspect`` is the real one. It installs nothing when kfp's method no longer reads
``inspect.stack()[1][3]`` (a kfp upgrade), so the tests never run on a guess.
``tests/pipelines/test_kfp_caller_name.py`` shows kfp's error still names the method.
"""

from __future__ import annotations

import inspect
import sys
import types

KFP_CALL = "inspect.stack()[1][3]"


class _FrameRecords:
    """``inspect.stack()`` of ``frame`` (the one that called ``stack()``), a record at a time."""

    def __init__(self, frame: types.FrameType):
        self.frame = frame

    def __getitem__(self, depth: int) -> tuple:
        frame: types.FrameType | None = self.frame
        for _ in range(depth):
            frame = frame.f_back if frame else None
        if frame is None:
            raise IndexError(f"the stack has no frame {depth} deep")
        code = frame.f_code
        return (frame, code.co_filename, frame.f_lineno, code.co_name, None, None)


def install() -> bool:
    """True when kfp's ``PipelineTask`` now names its caller the cheap way."""
    try:
        from kfp.dsl import pipeline_task
    except ImportError:  # the trainer's tests run where kfp is not installed (a GPU node)
        return False
    method = pipeline_task.PipelineTask._ensure_container_spec_exists
    if KFP_CALL not in inspect.getsource(method) or pipeline_task.inspect is not inspect:
        return False
    shim = types.ModuleType("inspect", "inspect, whose stack() builds only the records read")
    shim.__dict__.update({k: v for k, v in vars(inspect).items() if not k.startswith("__")})
    shim.stack = lambda context=1: _FrameRecords(sys._getframe(1))  # type: ignore[attr-defined]
    pipeline_task.inspect = shim
    return True
