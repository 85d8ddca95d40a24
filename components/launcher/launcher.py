"""``run_job(spec, backend=..., options=...)``: the one entry point to run a TrainSpec.

It picks the backend (``backends.base.Backend``: dry run, submit, follow, cancel) its options are
for, logs the spec's warnings, then submits and follows the job.
"""

from __future__ import annotations

from components.launcher.backends.base import Backend, run_on
from components.launcher.options import (
    BACKENDS,
    BackendOptions,
    KubernetesOptions,
    LocalOptions,
    options_for,
)
from components.launcher.result import JobResult
from components.launcher.spec import SpecError, TrainSpec


def run_job(
    spec: TrainSpec, *, backend: str = "local", options: BackendOptions | None = None
) -> JobResult:
    """Run ``spec`` on ``backend`` and return its JobResult; raise JobFailed if it fails.

    ``options``: ``KubernetesOptions`` for ``kubernetes``, ``LocalOptions`` for ``local`` (None:
    the defaults).
    """
    if options is None:
        options = options_for(backend)
    expected = {"kubernetes": KubernetesOptions, "local": LocalOptions}.get(backend)
    if expected is None:
        raise SpecError(f"backend={backend!r} is not supported; allowed: {', '.join(BACKENDS)}")
    if not isinstance(options, expected):
        raise SpecError(
            f"backend={backend!r} takes {expected.__name__}, not {type(options).__name__}"
        )
    log = options.log or print
    for warning in spec.warnings():
        log(f"[launcher] warning: {warning}")
    return run_on(backend_for(options), spec, handle_sigterm=options.handle_sigterm)


def backend_for(options: BackendOptions) -> Backend:
    """The backend its options are for."""
    if isinstance(options, LocalOptions):
        # Each backend is imported when asked: the local one needs no Kubernetes client (~1 s),
        # the kubernetes one none of the local process machinery.
        from components.launcher.backends.local import LocalBackend

        return LocalBackend(options)
    from components.launcher.backends.kubernetes import KubernetesBackend  # (see LocalBackend)

    return KubernetesBackend(options)
