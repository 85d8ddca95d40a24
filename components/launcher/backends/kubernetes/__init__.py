"""Kubernetes backend: submit a TrainJob, PyTorchJob or TFJob, follow it to the end, clean up.

Parts both APIs share: ``discovery`` (which API the cluster serves), ``preflight``, ``pods`` (log
following), ``diagnosis``, ``watchdog`` and the wait loop in ``run``; what differs between the
APIs is described once in ``components.launcher.apis``.
"""

from components.launcher.backends.kubernetes.cleanup import delete_run_jobs
from components.launcher.backends.kubernetes.permissions import (
    granted_permissions,
    required_permissions,
)
from components.launcher.backends.kubernetes.run import KubernetesBackend, run_kubernetes

__all__ = [
    "KubernetesBackend",
    "delete_run_jobs",
    "granted_permissions",
    "required_permissions",
    "run_kubernetes",
]
