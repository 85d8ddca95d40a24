"""The PyTorchJob launcher: ``TrainSpec`` → ``build_pytorchjob`` (pure) → ``run_job`` (a backend).

>>> from components.pytorchjob import TrainSpec, build_pytorchjob, run_job
>>> spec = TrainSpec(name="resnet-ddp", workers=2, args=["--data-dir", "/workspace/data"])
>>> manifest = build_pytorchjob(spec)            # a dict, valid against the PyTorchJob CRD
>>> result = run_job(spec, backend="local")     # or backend="kubernetes"
"""

from components.pytorchjob.launcher import BACKENDS, run_job
from components.pytorchjob.manifest import admission_errors, build_pytorchjob
from components.pytorchjob.result import (
    JobCancelled,
    JobExists,
    JobFailed,
    JobResult,
    JobTimeout,
    PreflightError,
)
from components.pytorchjob.spec import PvcMount, SpecError, TrainSpec

__all__ = [
    "BACKENDS",
    "JobCancelled",
    "JobExists",
    "JobFailed",
    "JobResult",
    "JobTimeout",
    "PreflightError",
    "PvcMount",
    "SpecError",
    "TrainSpec",
    "admission_errors",
    "build_pytorchjob",
    "run_job",
]
