"""The training-job launcher: ``TrainSpec`` → a pure manifest per cluster API → ``run_job``.

One spec, two Kubeflow APIs: a Kubeflow Trainer v2 ``TrainJob`` (``build_trainjob``) or a Training
Operator v1 ``PyTorchJob`` (``build_pytorchjob``); ``api="auto"`` submits whichever the cluster
serves. TensorFlow and XGBoost programs run as a Training Operator v1 ``TFJob`` or ``XGBoostJob``
(``build_tfjob``, ``build_xgboostjob``; ``api="tfjob"``/``"xgboostjob"``, always explicit), or
XGBoost as a TrainJob on Trainer's ``xgboost-distributed`` runtime; MPI as an MPI Operator
``MPIJob`` (``build_mpijob``; ``api="mpijob"``, always explicit); Ray as a KubeRay ``RayJob``
(``build_rayjob``; ``api="rayjob"``, always explicit). What only one API says is its options
object (``TrainJobOptions``, ``PyTorchJobOptions``, ``TFJobOptions``, ``XGBoostJobOptions``,
``MPIJobOptions``, ``RayJobOptions``) in ``TrainSpec.api_options``.
Backends: ``kubernetes`` (submit, follow, clean up) and ``local`` (processes with each API's env
contract).

>>> from components.launcher import KubernetesOptions, TrainSpec, build_trainjob, run_job
>>> spec = TrainSpec(name="resnet-ddp", workers=2, args=["--data-dir", "/workspace/data"])
>>> manifest = build_trainjob(spec)               # a dict, valid against the TrainJob CRD
>>> result = run_job(spec, backend="local")       # or backend="kubernetes", options=...
>>> elastic = TrainSpec(name="ddp", workers=2, api="pytorchjob",
...     api_options=PyTorchJobOptions(elastic_min_replicas=1, elastic_max_replicas=4))
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the same names, for type checkers and editors
    from components.launcher.api_options import (
        MPIJobOptions,
        PyTorchJobOptions,
        RayJobOptions,
        TFJobOptions,
        TrainJobOptions,
        XGBoostJobOptions,
    )
    from components.launcher.apis import JOB_APIS, JobApi, build_manifest, job_api
    from components.launcher.launcher import run_job
    from components.launcher.mpijob import build_mpijob
    from components.launcher.options import BACKENDS, KubernetesOptions, LocalOptions, options_for
    from components.launcher.pytorchjob import admission_errors, build_pytorchjob
    from components.launcher.rayjob import build_rayjob
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
    from components.launcher.xgboostjob import build_xgboostjob

_HOME = {
    "PyTorchJobOptions": "components.launcher.api_options",
    "TFJobOptions": "components.launcher.api_options",
    "TrainJobOptions": "components.launcher.api_options",
    "XGBoostJobOptions": "components.launcher.api_options",
    "JOB_APIS": "components.launcher.apis",
    "JobApi": "components.launcher.apis",
    "build_manifest": "components.launcher.apis",
    "job_api": "components.launcher.apis",
    "run_job": "components.launcher.launcher",
    "BACKENDS": "components.launcher.options",
    "KubernetesOptions": "components.launcher.options",
    "LocalOptions": "components.launcher.options",
    "options_for": "components.launcher.options",
    "admission_errors": "components.launcher.pytorchjob",
    "build_pytorchjob": "components.launcher.pytorchjob",
    "JobCancelled": "components.launcher.result",
    "JobExists": "components.launcher.result",
    "JobFailed": "components.launcher.result",
    "JobResult": "components.launcher.result",
    "JobTimeout": "components.launcher.result",
    "PreflightError": "components.launcher.result",
    "APIS": "components.launcher.spec",
    "PvcMount": "components.launcher.spec",
    "SpecError": "components.launcher.spec",
    "TrainSpec": "components.launcher.spec",
    "build_tfjob": "components.launcher.tfjob",
    "build_trainjob": "components.launcher.trainjob",
    "build_xgboostjob": "components.launcher.xgboostjob",
    "build_rayjob": "components.launcher.rayjob",
    "build_mpijob": "components.launcher.mpijob",
    "MPIJobOptions": "components.launcher.api_options",
    "RayJobOptions": "components.launcher.api_options",
}
"""Where each public name lives. Loaded on first use (PEP 562): importing one module of the
package (``components.launcher.spec``, say) must not import the cluster clients behind
``apis`` (~1.3 s), which the CLI's start-up and the pipeline compiler do not need."""


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME[name]), name)
    globals()[name] = value
    return value


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
    "PyTorchJobOptions",
    "SpecError",
    "TFJobOptions",
    "TrainJobOptions",
    "TrainSpec",
    "XGBoostJobOptions",
    "RayJobOptions",
    "MPIJobOptions",
    "admission_errors",
    "build_manifest",
    "build_pytorchjob",
    "build_tfjob",
    "build_trainjob",
    "build_xgboostjob",
    "build_rayjob",
    "build_mpijob",
    "job_api",
    "options_for",
    "run_job",
]
