"""``build_mpijob(spec)``: the MPI Operator's ``MPIJob`` (``kubeflow.org/v2beta1``) of a TrainSpec
(pure).

For clusters that run the MPI Operator v0.8 (Horovod-style training, or any program started by
``mpirun``). The operator makes the job's SSH key (a Secret), OpenMPI's hostfile (a ConfigMap:
``<job>-worker-N.<job>.<ns>.svc slots=<slotsPerWorker>``), a headless Service, the worker pods
and, once they are ready (``launcherCreationPolicy: WaitForWorkersReady``), the launcher Job,
whose pod runs ``mpirun``. The mapping:

- ``Worker``: ``workers`` pods, each as a node of the other APIs (GPUs, CPU/memory, the staging
  init container and volumes, pod security), running sshd alone (``SSHD``: UID 1000, port
  2222, no capability, a read-only root; the image's MPI variant, ``image/mpi/``), ready once
  sshd wrote its pid file (a startup probe: nothing runs in the pod after that);
  ``slotsPerWorker`` = ``nproc_per_node``;
- ``Launcher``: one pod in the same image with the spec's env (``trainer.mpirun`` forwards it
  to every rank), small fixed requests, no GPU: it trains nothing, it runs our trainer under
  mpirun on every slot (``python -m trainer.mpirun -m trainer.train FLAGS``) or the user's
  ``command`` and ``args``;
- ``sshAuthMountPath``: the image's user's ``~/.ssh`` (the job's key is the host key and the one
  key allowed in); ``ssh_auth_mount_path`` and ``mpi_worker_command`` say them for an image
  whose sshd is set up otherwise than ours;
- ``runPolicy``: backoff limit (the launcher Job's retries: 0 by default, a permanent error is
  never retried and a retried step resumes from the checkpoints), deadline, cleanPodPolicy,
  TTL, ``suspend`` for Kueue, and gang scheduling (honoured when the operator runs with
  ``--gang-scheduling``) of the workers: ``minAvailable`` = ``workers`` by default, since the
  launcher is created only once they are ready and so cannot be in their gang.

``mpiImplementation``: OpenMPI by default, the one our trainer runs under (``trainer.mpirun``
reads OpenMPI's hostfile variable); Intel MPI or MPICH for the user's command.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from components.launcher import pod_parts, training_operator
from components.launcher.pod_paths import IMAGE_HOME
from components.launcher.spec import TrainSpec

API_GROUP = "kubeflow.org"
API_VERSION = f"{API_GROUP}/v2beta1"
KIND = "MPIJob"
CONTAINER = "mpi"
"""The one container of every pod (launcher and workers)."""
REPLICA_TYPES = ("Launcher", "Worker")
SSH_AUTH_MOUNT_PATH = f"{IMAGE_HOME}/.ssh"
SSHD = ("/usr/sbin/sshd", "-De", "-f", "/etc/ssh/kfp-ddp/sshd_config")
"""The image's MPI variant's sshd (``image/mpi/sshd_config``: port 2222, its pid file in /tmp)."""
SSHD_PID_FILE = "/tmp/sshd.pid"
SSHD_START_S = 300
"""How long a worker's sshd may take to write its pid file before the kubelet restarts the
container (its startup probe's checks, one a second)."""
LAUNCHER_CPU = "500m"
LAUNCHER_MEMORY = "1Gi"
DEFAULT_BACKOFF_LIMIT = 0
DEFAULT_MPI_IMPLEMENTATION = "OpenMPI"
DEFAULT_LAUNCHER_RESTART_POLICY = "Never"


def _worker(spec: TrainSpec) -> dict[str, Any]:
    template = pod_parts.plain(training_operator.build_pod_template(spec, CONTAINER))
    (container,) = template["spec"]["containers"]
    container.pop("args", None)
    own = spec.mpi.mpi_worker_command
    if own is not None:  # the user's image's sshd: ready once it runs
        container["command"] = list(own)
        return template
    container["command"] = list(SSHD)
    # Ready once sshd listens (it writes its pid file after binding its port): a startup
    # probe, asked every second until then and never after (a readiness probe runs a process
    # in the pod at every period for the whole job); a tcpSocket probe would log a failed key
    # exchange every period.
    container["startupProbe"] = {
        "exec": {"command": ["test", "-s", SSHD_PID_FILE]},
        "periodSeconds": 1,
        "failureThreshold": SSHD_START_S,
    }
    return template


def _launcher(spec: TrainSpec) -> dict[str, Any]:
    # The launcher trains nothing: no data staged there, no GPU, no metrics port.
    plain = dataclasses.replace(
        spec, stage_data_uri=None, stage_data_digest=None, gpus_per_worker=0, metrics_port=0
    )
    template = pod_parts.plain(training_operator.build_pod_template(plain, CONTAINER))
    (container,) = template["spec"]["containers"]
    # The ranks' command line is the whole spec's (--device cuda with GPUs, the metrics flags).
    container["command"] = spec.container_command()
    args = spec.container_args()
    if args:
        container["args"] = args
    else:
        container.pop("args", None)
    container["resources"] = {
        "requests": {"cpu": LAUNCHER_CPU, "memory": LAUNCHER_MEMORY},
        "limits": {"memory": LAUNCHER_MEMORY},
    }
    return template


def build_mpijob(spec: TrainSpec) -> dict[str, Any]:
    """The MPIJob manifest of ``spec`` as a plain dict (pure; touches no cluster)."""
    if spec.api != "mpijob":
        spec = spec.for_api("mpijob")  # refuses what an MPIJob cannot express
    options = spec.mpi
    run_policy = pod_parts.plain(training_operator.run_policy(spec))
    backoff = options.backoff_limit
    run_policy["backoffLimit"] = DEFAULT_BACKOFF_LIMIT if backoff is None else backoff
    if spec.kueue_queue:
        run_policy["suspend"] = True  # Kueue admits it
    metadata = pod_parts.plain(training_operator.job_metadata(spec))
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": metadata,
        "spec": {
            "slotsPerWorker": spec.nproc_per_node or 1,
            "mpiImplementation": options.mpi_implementation or DEFAULT_MPI_IMPLEMENTATION,
            "sshAuthMountPath": options.ssh_auth_mount_path or SSH_AUTH_MOUNT_PATH,
            "launcherCreationPolicy": "WaitForWorkersReady",
            "runPolicy": run_policy,
            "mpiReplicaSpecs": {
                "Launcher": {
                    "replicas": 1,
                    "restartPolicy": options.restart_policy or DEFAULT_LAUNCHER_RESTART_POLICY,
                    "template": _launcher(spec),
                },
                "Worker": {
                    "replicas": spec.workers,
                    "restartPolicy": "Never",  # mpirun cannot take a restarted worker back
                    "template": _worker(spec),
                },
            },
        },
    }
