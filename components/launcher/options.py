"""Typed options of the two backends: ``KubernetesOptions`` and ``LocalOptions``.

The CLI, the KFP step (its ``backend_options`` JSON) and the tests build these objects; unknown
keys and bad values are refused on construction, naming the option and what is allowed.
"""

from __future__ import annotations

import dataclasses
import difflib
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from components.launcher.spec import SpecError

LogFn = Callable[[str], None]
"""Where a backend writes its lines (``print`` when not given)."""
CLEANUP_MODES = ("always", "on-success", "never")


@dataclass(kw_only=True)
class _Options:
    """Construction from plain data (the step's JSON), refusing unknown keys."""

    BACKEND: ClassVar[str] = ""

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Any:
        data = dict(data or {})
        known = cls.keys()
        unknown = sorted(set(data) - set(known))
        if unknown:
            nearest = {
                key: close[0]
                for key in unknown
                if (close := difflib.get_close_matches(key, known, n=1, cutoff=0.6))
            }
            guesses = [
                repr(guess) if len(unknown) == 1 else f"{guess!r} for {key!r}"
                for key, guess in nearest.items()
            ]
            did_you_mean = f" (did you mean {', '.join(guesses)}?)" if guesses else ""
            raise SpecError(
                f"backend_options: unknown option(s) {unknown} for the {cls.BACKEND} backend"
                f"{did_you_mean}; valid: {', '.join(known)}"
            )
        return cls(**data)

    @classmethod
    def keys(cls) -> list[str]:
        """The options the step's JSON may set (not the code-only ones)."""
        return [f.name for f in dataclasses.fields(cls) if f.metadata.get("json", True)]

    def _positive(self, name: str, *, optional: bool = True) -> None:
        value = getattr(self, name)
        if value is None and optional:
            return
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise SpecError(
                f"backend_options.{name}={value!r} must be a positive number of seconds"
            )


_CODE_ONLY = {"json": False}
"""Options only Python callers can give (not the step's JSON)."""


@dataclass(kw_only=True)
class KubernetesOptions(_Options):
    """How the kubernetes backend submits, follows and cleans up a job."""

    BACKEND: ClassVar[str] = "kubernetes"

    timeout_s: float | None = None
    """Wall-clock limit of the whole job in seconds; past it the job is deleted (None: none)."""
    cleanup: str = "on-success"
    """Delete the finished job: on-success (keep a failed one, with its pods, to inspect),
    always or never."""
    pending_timeout_s: float | None = 600.0
    """Report pods Pending (or not created) for this long, with their scheduler events."""
    silence_timeout_s: float | None = 1800.0
    """Report when no replica logged anything for this long (a hang at init or in a collective)."""
    watchdog_fails: bool = False
    """A watchdog report fails the job (and deletes it) instead of only logging."""
    poll_interval_s: float = 2.0
    """Seconds between watch reconnects and status reads."""
    config_file: str | None = None
    """A kubeconfig file (None: in-cluster config, else the default kubeconfig)."""
    context: str | None = None
    """A kubeconfig context."""
    tail_lines: int = 20
    """Log lines of the failing pod shown in a failure."""
    output_dir: str | None = None
    """Where the trainer writes summary.json (None: its --output-dir flag)."""
    preflight: bool = True
    """Check the API, the runtime, the permissions and the namespace before submitting."""
    handle_sigterm: bool = field(default=True, metadata=_CODE_ONLY)
    """On SIGTERM delete the job and raise JobCancelled (main thread only)."""
    client_configuration: Any = field(default=None, metadata=_CODE_ONLY)
    """A ``kubernetes.client.Configuration`` to use instead of loading one."""
    log: LogFn | None = field(default=None, metadata=_CODE_ONLY)
    """Where log lines go (None: stdout, flushed)."""

    def __post_init__(self) -> None:
        if self.cleanup not in CLEANUP_MODES:
            raise SpecError(
                f"backend_options.cleanup={self.cleanup!r} is not allowed; use one of "
                f"{', '.join(CLEANUP_MODES)}"
            )
        for name in ("timeout_s", "pending_timeout_s", "silence_timeout_s"):
            self._positive(name)
        self._positive("poll_interval_s", optional=False)


@dataclass(kw_only=True)
class LocalOptions(_Options):
    """How the local backend runs the replicas as processes."""

    BACKEND: ClassVar[str] = "local"

    path_map: dict[str, str] = field(default_factory=dict)
    """Container mount path → local folder (unmapped PVC mounts: WORKDIR/volumes/<claim>)."""
    workdir: str | Path | None = None
    """Working directory of the replicas (None: the current one)."""
    nodes_dir: str | Path | None = None
    """Where each node's own disk is (NODES_DIR/<replica>/stage: its staged data, its outputs
    without a shared volume). None: $KFP_DDP_LOCAL_NODES_DIR, else WORKDIR/nodes."""
    timeout_s: float | None = None
    """Wall-clock limit in seconds; past it the replicas are stopped."""
    grace_period_s: float = 10.0
    """Seconds between SIGTERM and SIGKILL when stopping replicas."""
    output_dir: str | None = None
    """Where the trainer writes summary.json (None: its --output-dir flag, path-mapped)."""
    extra_env: dict[str, str] = field(default_factory=dict)
    """More environment variables for every replica."""
    python: str = field(default=sys.executable, metadata=_CODE_ONLY)
    """The interpreter that runs python/torchrun commands."""
    handle_sigterm: bool = field(default=True, metadata=_CODE_ONLY)
    """Forward SIGTERM to the replicas and raise JobCancelled (main thread only)."""
    log: LogFn | None = field(default=None, metadata=_CODE_ONLY)
    """Where log lines go (None: stdout, flushed)."""
    on_event: Callable[[str, dict[str, Any]], None] | None = field(
        default=None, metadata=_CODE_ONLY
    )
    """Called with ("started" | "exited" | "restarting", details) (tests)."""

    def __post_init__(self) -> None:
        self._positive("timeout_s")
        self._positive("grace_period_s", optional=False)


BackendOptions = KubernetesOptions | LocalOptions
OPTIONS_OF_BACKEND: dict[str, type[KubernetesOptions] | type[LocalOptions]] = {
    "kubernetes": KubernetesOptions,
    "local": LocalOptions,
}
BACKENDS = tuple(OPTIONS_OF_BACKEND)


def options_for(backend: str, data: dict[str, Any] | None = None) -> BackendOptions:
    """The options object of ``backend`` from plain data (refuses unknown backends/keys)."""
    if backend not in OPTIONS_OF_BACKEND:
        raise SpecError(f"backend={backend!r} is not supported; allowed: {', '.join(BACKENDS)}")
    return OPTIONS_OF_BACKEND[backend].from_dict(data)
