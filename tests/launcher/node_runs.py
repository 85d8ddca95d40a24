"""Jobs on the real node started together, each judged by a test of its own.

A module fixture starts them all with :func:`started_together`, each in a namespace of its own
that enforces ``restricted`` (the launcher's ServiceAccount bound to the rendered Role there), and
each test takes its :class:`NodeRun` and judges it. This pays where the jobs wait rather than
compute: the four failing jobs (an exit, an eviction, a pull, a refusal) took 22 s together
against 46 s one after another, the two training jobs of 2 pods 33 s against 41 s, and the two
XGBoost jobs 22 s against 29 s. Jobs that keep the node's 2 CPUs busy gain nothing, so those
run one after another: the two MPI jobs took 54 s either way (sshd, mpirun and the staging over
SSH); the two RayJobs' module alone 102 and 106.6 s together against 111.4-132 s one after the
other, but 119 s together within the whole node part against 108 s one after the other (the
spread of these runs is larger than the gain). A job that writes much to disk must not share the
node: the eviction's 1.1 GB write to /tmp, started beside the training jobs, stalled one's
checkpoint upload for 32 s.

Their requests must fit the node together (2 CPUs, and its disk: give the data set's size,
``stage_data_bytes``, or each staging pod asks for 124Gi), or some pods stay Pending: jobs that
each hold one pod of two wait for each other until they time out.

The tests still ask for ``node_cluster``: it keeps the node up from one test to the next
(``tests/cluster/node_plugin.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

from components.launcher import run_job
from components.launcher.spec import TrainSpec
from tests.cluster.node_plugin import NodeCluster
from tests.cluster.plugin import Namespace, new_namespace
from tests.launcher.k8s_helpers import options

WAIT_AT_END_S = 600
SHARED_CPU = "250m"
"""A pod's CPU request when jobs share the node: four such pods fit with room to spare. Their
trainers still run one thread (``KFP_DDP_CPU_REQUEST`` rounds up to whole CPUs), as at 500m."""


@dataclass
class Planned:
    """What a module fixture starts in a namespace: the job, the launcher's options, and the
    ``s3://`` bucket of the data set it reads (for the test)."""

    job: TrainSpec
    options: dict[str, Any]
    dataset: str | None = None


@dataclass
class NodeRun:
    """A job started by :func:`started_together`: the launcher runs it in a thread."""

    ns: Namespace
    job: TrainSpec
    lines: list[str]
    """The launcher's log lines so far."""
    outcome: Future
    """``run_job``'s result, or its exception."""
    began: float
    dataset: str | None

    @property
    def log(self) -> str:
        return "\n".join(self.lines)

    def failure(self, timeout: float = 300) -> BaseException:
        """The exception the launcher raised (the test fails if the job succeeded)."""
        error = self.outcome.exception(timeout=timeout)
        assert error is not None, f"the job did not fail: {self.outcome.result()}"
        return error


def in_background(function: Callable[..., Any], *args: Any, **kw: Any) -> Future:
    pool = ThreadPoolExecutor(1)
    future = pool.submit(function, *args, **kw)
    pool.shutdown(wait=False)
    return future


@contextmanager
def started_together(
    node_cluster: NodeCluster, plans: dict[str, Callable[[Namespace], Planned]]
) -> Iterator[dict[str, NodeRun]]:
    """Start each plan's job in a new namespace (named after the plan), all at once; on exit the
    namespaces are cleared (their jobs and pods deleted) and the launcher threads waited for."""
    runs: dict[str, NodeRun] = {}
    try:
        with ExitStack() as namespaces:
            for name, plan in plans.items():
                ns = namespaces.enter_context(
                    new_namespace(node_cluster.cluster, name, pod_security="restricted")
                )
                planned = plan(ns)
                lines: list[str] = []
                launched = options(ns, lines, **planned.options)
                outcome = in_background(
                    run_job, planned.job, backend="kubernetes", options=launched
                )
                runs[name] = NodeRun(
                    ns, planned.job, lines, outcome, time.monotonic(), planned.dataset
                )
            yield runs
    finally:  # a job its test left running is deleted by now; its launcher then stops
        wait([run.outcome for run in runs.values()], timeout=WAIT_AT_END_S)
