"""How much a training pod asks for, when the spec does not say: CPU, memory, /dev/shm, disk.

Every pod requests CPU and memory (a pod without requests is BestEffort: the first evicted, and
refused by a namespace with a ResourceQuota), its /dev/shm stays below its memory request (shm
is memory, counted against the pod), and its node-local disk is bounded: the staging volume's
``sizeLimit`` and the pod's ``ephemeral-storage`` request and limit come from the data set's size.

=====================  ==========================================================================
CPU request            4 per GPU; 1 per process without GPUs
memory request         16Gi per GPU; 4Gi per process without GPUs; plus an explicit shm_size
/dev/shm (auto)        2Gi per process, at most half the memory request (or limit)
staging volume         1.1 x the data set's bytes, rounded up to whole GiB, + checkpoint_space
                       (20Gi); unknown size: 100Gi + checkpoint_space
/tmp, HOME             emptyDirs of 1Gi and 2Gi (the root file system is read-only)
ephemeral-storage      the staging volume + /tmp + HOME + 1Gi for the logs: the staging volume
                       + 4Gi; 4Gi without staging
=====================  ==========================================================================
"""

from __future__ import annotations

import math

CPU_PER_GPU = 4
MEMORY_PER_GPU_GI = 16
CPU_PER_PROCESS = 1
MEMORY_PER_PROCESS_GI = 4
SHM_PER_PROCESS_GI = 2
"""``shm_size="auto"``: GiB of /dev/shm per process (its DataLoader workers' batches)."""
STAGE_HEADROOM = 1.1
"""The staging volume holds the data set plus 10% (file system overhead, a partial download)."""
UNKNOWN_DATA_GI = 100
"""The staging volume's data part when the data set's size is not known."""
TMP_GI = 1
"""/tmp's emptyDir: temporary files (Python's tempfile, torchrun's logs, the compilers')."""
HOME_GI = 2
"""HOME's emptyDir: its caches (Triton's and TorchInductor's compiled kernels, CUDA's JIT cache)."""
LOGS_GI = 1
"""Disk a pod needs besides its volumes: its containers' logs (their root file systems are
read-only, so they write nothing else)."""
GI = 2**30


def processes_per_node(
    nproc_per_node: int | None, gpus_per_worker: int, *, one_per_pod: bool = False
) -> int:
    """Trainer processes per node: ``nproc_per_node`` when set (not 0), else one per GPU, else
    one. ``one_per_pod``: the program runs once per pod whatever its GPUs (a TFJob's process
    drives every GPU of its pod; an XGBoost program starts its own workers)."""
    if nproc_per_node:
        return nproc_per_node
    return gpus_per_worker if gpus_per_worker > 0 and not one_per_pod else 1


def default_cpu(gpus: int, processes: int) -> str:
    return str(CPU_PER_GPU * gpus if gpus else CPU_PER_PROCESS * processes)


def default_memory(gpus: int, processes: int, shm: str | None = None) -> str:
    """16Gi per GPU (4Gi per process without GPUs), plus an explicit /dev/shm (it is memory)."""
    base = (MEMORY_PER_GPU_GI * gpus if gpus else MEMORY_PER_PROCESS_GI * processes) * GI
    if shm is None:
        return gibibytes(base)
    try:
        return gibibytes(base + quantity(shm))
    except ValueError:  # a bad shm_size is reported by its own check
        return gibibytes(base)


def quantity(text: str) -> float:
    from kubernetes.utils import parse_quantity

    return float(parse_quantity(text))


def gibibytes(size: float) -> str:
    """``size`` bytes as a whole number of GiB, rounded up (``"12Gi"``)."""
    return f"{max(1, math.ceil(size / GI))}Gi"


def auto_shm(processes: int, memory: str | None) -> str:
    """2Gi per process, at most half of ``memory`` (the request, or the limit)."""
    size = SHM_PER_PROCESS_GI * max(processes, 1) * GI
    if memory is not None:
        size = min(size, int(quantity(memory)) // 2)
    return f"{size // 2**20}Mi" if size % GI else f"{size // GI}Gi"


def stage_volume_size(data_bytes: int | None, checkpoint_space: str) -> str:
    """The staging volume's sizeLimit: the data set with its headroom, plus checkpoint room."""
    data = UNKNOWN_DATA_GI * GI if data_bytes is None else math.ceil(data_bytes * STAGE_HEADROOM)
    data_gi = math.ceil(data / GI)
    return gibibytes((data_gi * GI) + quantity(checkpoint_space))


def ephemeral_storage(stage_volume: str | None) -> str:
    """The pod's disk: its staging volume (if any), its /tmp and HOME, and its logs."""
    volume = quantity(stage_volume) if stage_volume else 0
    return gibibytes(volume + (TMP_GI + HOME_GI + LOGS_GI) * GI)
