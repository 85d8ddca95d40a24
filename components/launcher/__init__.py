"""The training-job launcher: ``TrainSpec`` → a pure manifest per cluster API → ``run_job``.

One spec, two Kubeflow APIs: a Kubeflow Trainer v2 ``TrainJob`` (``build_trainjob``) or a Training
Operator v1 ``PyTorchJob`` (``build_pytorchjob``); ``api="auto"`` submits whichever the cluster
serves. TensorFlow programs run as a Training Operator v1 ``TFJob`` (``build_tfjob``,
``api="tfjob"``, always explicit). Backends: ``kubernetes`` (submit, follow, clean up) and
``local`` (processes with each API's env contract).

>>> from components.launcher import KubernetesOptions, TrainSpec, build_trainjob, run_job
>>> spec = TrainSpec(name="resnet-ddp", workers=2, args=["--data-dir", "/workspace/data"])
>>> manifest = build_trainjob(spec)               # a dict, valid against the TrainJob CRD
>>> result = run_job(spec, backend="local")       # or backend="kubernetes", options=...
"""

from components.launcher.apis import JOB_APIS, JobApi, build_manifest, job_api
from components.launcher.launcher import run_job
from components.launcher.options import BACKENDS, KubernetesOptions, LocalOptions, options_for
from components.launcher.pytorchjob import admission_errors, build_pytorchjob
from components.launcher.result import (
    JobCancelled,
    JobExists,
    JobFailed,
    JobResult,
    JobTimeout,
    PreflightError,
)
from components.launcher.spec import APIS, PvcMount, SpecError, TrainSpec
from components.launcher.tfjob import build_tfjob
from components.launcher.trainjob import build_trainjob

__all__ = [
    "APIS",
    "BACKENDS",
    "JOB_APIS",
    "JobApi",
    "JobCancelled",
    "JobExists",
    "JobFailed",
    "JobResult",
    "JobTimeout",
    "KubernetesOptions",
    "LocalOptions",
    "PreflightError",
    "PvcMount",
    "SpecError",
    "TrainSpec",
    "admission_errors",
    "build_manifest",
    "build_pytorchjob",
    "build_tfjob",
    "build_trainjob",
    "job_api",
    "options_for",
    "run_job",
]
