"""The Training Operator's ``TF_CONFIG`` for each replica of a TFJob, on loopback (local backend).

What the operator (v1.9, its TFJob controller) gives the ``tensorflow`` container of every replica
of a distributed TFJob (more than one replica in all)::

    TF_CONFIG={"cluster": {"chief": ["<job>-chief-0.<ns>.svc:2222"],
                           "worker": ["<job>-worker-0.<ns>.svc:2222", ...],
                           "ps": [...]},
               "task": {"type": "worker", "index": 0},
               "environment": "cloud"}

Replica types lower-cased, one address per replica, in the builder's order (``tfjob``: Chief,
Worker, PS). Locally each replica gets ``127.0.0.1:<a free port of its own>``. A job of a single
replica gets no ``TF_CONFIG`` (TensorFlow then runs alone, as the operator leaves it).
"""

from __future__ import annotations

import json
from typing import NamedTuple

from components.launcher.spec import TrainSpec
from components.launcher.tfjob import replica_counts


class TfTask(NamedTuple):
    """One replica of a TFJob: its type as TF_CONFIG spells it, and its index."""

    type: str
    number: int
    """The replica's index in its type (TF_CONFIG's ``task.index``)."""

    @property
    def name(self) -> str:
        """``chief-0``, ``worker-1``, ``ps-0``: the pod-name suffix and the log prefix."""
        return f"{self.type}-{self.number}"


def tf_tasks(spec: TrainSpec) -> list[TfTask]:
    """The job's replicas in order: chief-0, worker-0.., ps-0.."""
    return [
        TfTask(rtype.lower(), index)
        for rtype, count in replica_counts(spec).items()
        for index in range(count)
    ]


def tf_config_env(tasks: list[TfTask], ports: list[int], task: TfTask) -> dict[str, str]:
    """The env the operator gives ``task``: ``TF_CONFIG`` on loopback, or nothing when alone."""
    if len(tasks) == 1:
        return {}
    cluster: dict[str, list[str]] = {}
    for each, port in zip(tasks, ports, strict=True):
        cluster.setdefault(each.type, []).append(f"127.0.0.1:{port}")
    config = {
        "cluster": cluster,
        "task": {"type": task.type, "index": task.number},
        "environment": "cloud",
    }
    return {"TF_CONFIG": json.dumps(config)}
