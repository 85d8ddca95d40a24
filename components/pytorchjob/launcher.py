"""``run_job(spec, backend=...)``: the one entry point to run a TrainSpec."""

from __future__ import annotations

from typing import Any

from components.pytorchjob.result import JobResult
from components.pytorchjob.spec import SpecError, TrainSpec

BACKENDS = ("local", "kubernetes")


def run_job(spec: TrainSpec, *, backend: str = "local", **options: Any) -> JobResult:
    """Run ``spec`` on ``backend`` and return its JobResult; raise JobFailed if it fails.

    ``options`` go to the backend: see ``backends.local.LocalRun`` (path_map, workdir, timeout_s,
    grace_period_s, output_dir, log, on_event, ...) and ``backends.kubernetes.KubernetesRun``
    (client_configuration, config_file, context, timeout_s, cleanup, pending_timeout_s,
    silence_timeout_s, watchdog_fails, poll_interval_s, output_dir, log, ...).
    """
    if backend == "local":
        from components.pytorchjob.backends.local import run_local

        return run_local(spec, **options)
    if backend == "kubernetes":
        from components.pytorchjob.backends.kubernetes import run_kubernetes

        return run_kubernetes(spec, **options)
    raise SpecError(f"backend={backend!r} is not supported; allowed: {', '.join(BACKENDS)}")
