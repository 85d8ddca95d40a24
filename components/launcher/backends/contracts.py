"""What each controller gives each pod of a job, on loopback: the local backend's env contracts.

Pure: the replicas of a spec (their names, in the controller's order) and the variables each one
gets, given one free port per replica (``ports``) — no processes here. The local backend starts
the replicas with these; ``dry_run`` shows them.

- **trainjob**, ``torch`` runtime (``torch-distributed``; also ``auto``): ``node-0..N-1`` with
  ``PET_NNODES``, ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK``, ``PET_MASTER_ADDR``,
  ``PET_MASTER_PORT``; torchrun in each node turns them into RANK/WORLD_SIZE/LOCAL_RANK.
- **trainjob**, ``mpi`` runtime (``kfp-ddp-mpi``, ``deepspeed-distributed``...), and
  **mpijob**: one replica, ``launcher-0``, with the ``OMPI_MCA_orte_default_hostfile`` the
  runtime or the MPI Operator gives (here ``localhost`` with every slot) and a free
  ``MASTER_PORT``.
- **trainjob**, ``xgboost`` runtime (``xgboost-distributed``): ``node-0..N-1`` with
  ``DMLC_TRACKER_URI`` (node 0, which runs XGBoost's tracker), ``DMLC_TRACKER_PORT``,
  ``DMLC_TASK_ID`` (the node's index) and ``DMLC_NUM_WORKER``, as Trainer's XGBoost plugin sets
  them (one worker per node: a CPU node, or a node of one GPU).
- **pytorchjob**: Workers only by default, ``worker-0..``, with the operator's ``PET_NNODES`` /
  ``PET_NPROC_PER_NODE`` and the c10d rendezvous (``PET_RDZV_*``); with ``pytorch_master``,
  ``master-0``, ``worker-0..`` with MASTER_ADDR/MASTER_PORT, WORLD_SIZE, RANK and the PET_*
  variables. Elastic jobs: Workers only, the elastic policy's variables.
- **tfjob**: ``chief-0``, ``worker-0..``, ``ps-0..``, each with its ``TF_CONFIG``
  (``tf_config``).
- **xgboostjob**: ``master-0``, ``worker-0..``, with the Training Operator's MASTER_ADDR,
  MASTER_PORT (the master's ``xgboostjob-port``: XGBoost's tracker), WORLD_SIZE, RANK (master 0,
  worker i: i + 1) and, with more than one replica, WORKER_ADDRS and WORKER_PORT (for LightGBM);
  and the DMLC_* contract the pod's command sets from them.
- **rayjob**: ``submitter`` (the Ray job's driver: the entrypoint, once the Ray cluster is up),
  ``head-0`` (a Ray head that trains nothing), ``worker-0..`` (Ray nodes of ``nproc_per_node``
  CPUs), each with ``RAY_ADDRESS`` (the head's GCS on loopback), as KubeRay gives its pods;
  the job succeeds when the driver does (``ray_local``: the commands).
"""

from __future__ import annotations

from pathlib import Path

from components.launcher.backends.tf_config import tf_config_env, tf_tasks
from components.launcher.spec import TrainSpec

LOOPBACK = "127.0.0.1"
FIRST_REPLICA_SUCCEEDS = ("tfjob", "xgboostjob", "rayjob")
"""APIs whose job succeeds when its first replica (the Chief, the Master, the Ray job's driver)
does: the controller's success policy; replicas still running then are stopped."""
CONTRACT_VARIABLES = (
    "TF_CONFIG",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORKER_ADDRS",
    "WORKER_PORT",
    "DMLC_TRACKER_URI",
    "DMLC_TRACKER_PORT",
    "DMLC_TASK_ID",
    "DMLC_NUM_WORKER",
    "RAY_ADDRESS",
)
"""Set by some contract: never inherited from the launcher's own environment (nor PET_*)."""


def local_api(spec: TrainSpec) -> str:
    """The env contract to emulate: the spec's API; ``auto`` is the API of its options, else a
    TrainJob (Kubeflow's current)."""
    if spec.api == "auto":
        return spec.api_options.API if spec.api_options is not None else "trainjob"
    return spec.api


def mpi_launcher(spec: TrainSpec) -> bool:
    """Whether the job is one mpirun launcher here (an MPIJob, a TrainJob on an MPI runtime)."""
    api = local_api(spec)
    return api == "mpijob" or (api == "trainjob" and local_policy(spec) == "mpi")


def local_policy(spec: TrainSpec) -> str:
    """A TrainJob's runtime policy here: given or known from the runtime's name, else ``torch``
    (there is no cluster to read the runtime from)."""
    return spec.runtime.policy or "torch"


def with_master(spec: TrainSpec) -> bool:
    """A PyTorchJob with a Master replica (not Workers only)."""
    options = spec.pytorchjob
    return bool(options and options.pytorch_master and not options.elastic)


def replica_names(spec: TrainSpec) -> list[str]:
    """Pod suffixes in node order: node-0.. (TrainJob; launcher-0 on an MPI runtime);
    worker-0.. (PyTorchJob; master-0, worker-0.. with ``pytorch_master``); chief-0,
    worker-0.., ps-0.. (TFJob); master-0, worker-0.. (XGBoostJob); submitter, head-0,
    worker-0.. (RayJob)."""
    api = local_api(spec)
    if api == "rayjob":
        return ["submitter", "head-0", *(f"worker-{i}" for i in range(spec.workers))]
    if api == "tfjob":
        return [task.name for task in tf_tasks(spec)]
    if mpi_launcher(spec):
        return ["launcher-0"]
    if api == "trainjob":
        return [f"node-{i}" for i in range(spec.workers)]
    if api == "xgboostjob" or with_master(spec):
        return ["master-0"] + [f"worker-{i}" for i in range(spec.workers - 1)]
    return [f"worker-{i}" for i in range(spec.workers)]


def node_contract(
    spec: TrainSpec, rank: int, ports: list[int], *, mpi_hostfile: Path, direct: bool = False
) -> dict[str, str]:
    """The variables the controller gives replica ``rank`` (``ports``: one per replica;
    ``direct``: a PyTorchJob Master/Worker running the trainer without torchrun)."""
    api, port = local_api(spec), ports[0]  # the torch contracts meet at replica 0's port
    if api == "tfjob":
        tasks = tf_tasks(spec)
        return tf_config_env(tasks, ports, tasks[rank])
    if api == "xgboostjob":
        return xgboostjob_contract(spec, rank, ports)
    if api == "rayjob":  # the head's GCS: the port of head-0 (replica 1), which serves it
        # Token auth off, as in a fresh pod: a token file in this user's ~/.ray (another Ray's)
        # would turn it on for some of the cluster's processes only.
        auth = {"RAY_AUTH_MODE": "disabled"}
        return auth if rank == 1 else auth | {"RAY_ADDRESS": f"{LOOPBACK}:{ports[1]}"}
    if mpi_launcher(spec):
        return _mpi_contract(spec, port, mpi_hostfile)
    if api == "trainjob":
        return _trainjob_contract(spec, rank, port, mpi_hostfile)
    if not with_master(spec):
        return _rendezvous_contract(spec, port)
    contract = _torch_contract(spec, rank, port) | {
        "MASTER_ADDR": LOOPBACK,
        "MASTER_PORT": str(port),
        "WORLD_SIZE": str(spec.world_size),
        "RANK": str(rank),
    }
    if direct:
        contract |= {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
    return contract


def _torch_contract(spec: TrainSpec, rank: int, port: int) -> dict[str, str]:
    return {
        "PET_NNODES": str(spec.workers),
        "PET_NPROC_PER_NODE": str(spec.nproc_per_node),
        "PET_NODE_RANK": str(rank),
        "PET_MASTER_ADDR": LOOPBACK,
        "PET_MASTER_PORT": str(port),
    }


def _mpi_contract(spec: TrainSpec, port: int, mpi_hostfile: Path) -> dict[str, str]:
    return {
        "OMPI_MCA_orte_default_hostfile": str(mpi_hostfile),
        "OMPI_MCA_orte_set_default_slots": str(spec.nproc_per_node),
        "MASTER_PORT": str(port),
    }


def _trainjob_contract(spec: TrainSpec, rank: int, port: int, mpi_hostfile: Path) -> dict[str, str]:
    policy = local_policy(spec)
    if policy == "xgboost":
        return {
            "DMLC_TRACKER_URI": LOOPBACK,
            "DMLC_TRACKER_PORT": str(port),
            "DMLC_TASK_ID": str(rank),
            "DMLC_NUM_WORKER": str(spec.workers),
        }
    if policy != "torch":
        raise ValueError(
            f"TrainSpec.ml_policy={policy!r}: the local backend runs torch, mpi and xgboost "
            "runtimes; run this one on a cluster (backend kubernetes)"
        )
    return _torch_contract(spec, rank, port)


def _rendezvous_contract(spec: TrainSpec, port: int) -> dict[str, str]:
    """A Workers-only PyTorchJob: torchrun's c10d rendezvous (its store on the first node to
    bind the port, as worker-0 hosts it in the cluster); no ranks, no master address."""
    contract = {
        "PET_NNODES": str(spec.workers),
        "PET_NPROC_PER_NODE": str(spec.nproc_per_node),
        "PET_RDZV_BACKEND": "c10d",
        "PET_RDZV_ENDPOINT": f"{LOOPBACK}:{port}",
        "PET_RDZV_ID": spec.name,
    }
    options = spec.pytorchjob
    if options is not None and options.elastic:
        low, high = options.elastic_min_replicas, options.elastic_max_replicas
        contract["PET_NNODES"] = f"{low}:{high}"
        if options.max_restarts is not None:
            contract["PET_MAX_RESTARTS"] = str(options.max_restarts)
    return contract


def xgboostjob_contract(spec: TrainSpec, rank: int, ports: list[int]) -> dict[str, str]:
    """The Training Operator's XGBoostJob env of replica ``rank`` (master-0 is rank 0), with the
    DMLC_* contract the pod's command sets from it."""
    contract = {
        "MASTER_ADDR": LOOPBACK,
        "MASTER_PORT": str(ports[0]),
        "WORLD_SIZE": str(spec.workers),
        "RANK": str(rank),
    }
    if spec.workers > 1:
        # On a cluster every worker listens on the same port of its own pod; here they share
        # one address, so each has its own port and WORKER_PORT is the first worker's.
        contract |= {
            "WORKER_ADDRS": ",".join([LOOPBACK] * (spec.workers - 1)),
            "WORKER_PORT": str(ports[1]),
        }
    # What the pod's sh line (xgboostjob.DMLC_FROM_OPERATOR) sets from them.
    contract |= {
        "DMLC_TRACKER_URI": contract["MASTER_ADDR"],
        "DMLC_TRACKER_PORT": contract["MASTER_PORT"],
        "DMLC_TASK_ID": contract["RANK"],
        "DMLC_NUM_WORKER": contract["WORLD_SIZE"],
    }
    return contract
