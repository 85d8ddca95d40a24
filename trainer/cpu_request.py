"""The training container's CPU request, as the launcher's pods hand it to the trainer.

A pod without a CPU limit sees every core of its node, which other pods use too: its request is
its share. The launcher sets ``KFP_DDP_CPU_REQUEST`` from the Downward API (``resourceFieldRef:
requests.cpu``, divisor 1: whole CPUs, rounded up) in the training container of every API, and
:func:`trainer.distributed.configure_cpu_threads` keeps the compute threads within it.

Ranks that ``mpirun`` starts over SSH do not see their pod's environment (sshd gives them a
clean one), and the launcher pod's own request is not theirs: the launcher renders the node
pods' request as ``KFP_DDP_NODE_CPU_REQUEST`` in the MPI launcher's container, and
``trainer.mpirun`` hands it to every rank as ``KFP_DDP_CPU_REQUEST``.

No torch here: the launcher (which never trains) names the variables from this module.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

CPU_REQUEST_ENV = "KFP_DDP_CPU_REQUEST"
"""The training container's CPU request in whole CPUs, rounded up (set by the launcher's pods)."""
NODE_CPU_REQUEST_ENV = "KFP_DDP_NODE_CPU_REQUEST"
"""The node pods' CPU request in whole CPUs, rounded up, in an MPI launcher's container (the
ranks' ``CPU_REQUEST_ENV``, which ``trainer.mpirun`` sets for them)."""


def requested_cpus(environ: Mapping[str, str] = os.environ) -> int | None:
    """The pod's CPU request in whole CPUs (``CPU_REQUEST_ENV``), or None: not set, or not a
    positive whole number."""
    text = environ.get(CPU_REQUEST_ENV, "").strip()
    return int(text) if text.isdigit() and int(text) > 0 else None
