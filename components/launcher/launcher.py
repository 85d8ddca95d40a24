"""``run_job(spec, backend=..., options=...)``: the one entry point to run a TrainSpec."""

from __future__ import annotations

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
    if isinstance(options, LocalOptions):
        # Each backend is imported when it runs: the local one needs no Kubernetes client (~1 s),
        # the kubernetes one none of the local process machinery.
        from components.launcher.backends.local import run_local

        return run_local(spec, options)
    from components.launcher.backends.kubernetes import run_kubernetes  # (see run_local)

    assert isinstance(options, KubernetesOptions)  # checked above against the backend

    return run_kubernetes(spec, options)
