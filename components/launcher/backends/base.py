"""What a backend does with a ``TrainSpec``: ``Backend`` (dry run, submit, follow, cancel).

``run_job`` is the one caller: it submits, then follows, with SIGTERM (a cancelled KFP run) as
an event the follow watches, and a follow that sees it cancels the job and raises
``JobCancelled``. ``kubernetes`` (``backends.kubernetes.KubernetesBackend``) creates the job's
object on the cluster and follows its pods; ``local`` (``backends.local.LocalBackend``) starts
the nodes as processes under the API's environment contract.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from components.launcher.backends.common import sigterm_event
from components.launcher.result import JobResult
from components.launcher.spec import TrainSpec


@dataclass(frozen=True)
class DryRun:
    """What a backend would start for a spec, built without starting or touching anything."""

    backend: str
    api: str
    """The API whose contract it follows (``auto``: the one it renders, a TrainJob)."""
    documents: list[dict[str, Any]] = field(default_factory=list)
    """The cluster objects (kubernetes: the job and its monitoring objects), or one document per
    node (local: its replica name, command and the environment contract it gets)."""


class Backend(Protocol):
    """A place jobs run. ``submit`` returns the backend's own handle of the started job, which
    ``follow`` and ``cancel`` take."""

    name: ClassVar[str]

    def dry_run(self, spec: TrainSpec) -> DryRun:
        """What ``submit`` would start (no cluster, no process)."""
        ...

    def submit(self, spec: TrainSpec) -> Any:
        """Start the job (a permanent problem raises before anything is allocated)."""
        ...

    def follow(self, job: Any, cancelled: threading.Event) -> JobResult:
        """Wait for the job's end: its result, or ``JobFailed`` (``JobTimeout``, and
        ``JobCancelled`` once ``cancelled`` is set: the job is cancelled first)."""
        ...

    def cancel(self, job: Any, reason: str) -> None:
        """Stop the job and free what it holds."""
        ...


def run_on(backend: Backend, spec: TrainSpec, *, handle_sigterm: bool = True) -> JobResult:
    """Submit ``spec`` on ``backend`` and follow it; SIGTERM while it runs (main thread, with
    ``handle_sigterm``) makes the follow cancel the job and raise ``JobCancelled``."""
    with sigterm_event(handle_sigterm) as cancelled:
        return backend.follow(backend.submit(spec), cancelled)
