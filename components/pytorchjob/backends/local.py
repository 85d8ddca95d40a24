"""Local backend: the TrainSpec's replicas as local processes with the operator's env contract.

For development and tests, not a scheduler. Each replica ("pod") gets what the Training Operator
would give it: MASTER_ADDR/MASTER_PORT, WORLD_SIZE, RANK (= pod rank: master 0, worker-i i+1),
PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR/PORT, PYTHONUNBUFFERED, and
GLOO_SOCKET_IFNAME=lo on Linux (gloo otherwise picks the host's first interface).

Default command: with ``nproc_per_node == 1`` (and no elastic policy) each replica runs
``python -m trainer.train`` directly, which reads RANK/WORLD_SIZE/MASTER_* like a pod without
torchrun does: one process per replica, no torchrun agent to start (about a second less per
replica) and the replica's exit code is the trainer's. With more processes per node it runs
``python -m trainer.torchrun -m trainer.train`` (torchrun with pod-level exit codes) which reads
the PET_* variables, exactly as in the pod. ``torchrun``/``python`` at the head of a custom
command become this interpreter.

Restart policy: a replica that exits non-zero stops the whole group (SIGTERM, then SIGKILL after
``grace_period_s``) and, if the policy says the failure is retryable and fewer than
``backoff_limit`` restarts happened, the group starts again on a fresh port; the trainer resumes
from its newest checkpoint by itself. ExitCode: 1-127 permanent, signals/128-255 retryable;
OnFailure/Always: any failure retryable; Never: none.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.pytorchjob.backends.common import LogFn, ReplicaLogs, sigterm_event
from components.pytorchjob.result import (
    JobCancelled,
    JobFailed,
    JobResult,
    JobTimeout,
    read_summary,
)
from components.pytorchjob.spec import TrainSpec

DEFAULT_BACKOFF_LIMIT = 6  # Kubernetes' own default when the spec leaves it unset.


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def replica_names(spec: TrainSpec) -> list[str]:
    """Operator pod suffixes in rank order: master-0, worker-0, worker-1, ..."""
    if spec.elastic:
        return [f"worker-{i}" for i in range(spec.workers)]
    return ["master-0"] + [f"worker-{i}" for i in range(spec.workers - 1)]


class PathMapper:
    """Rewrites container paths under PVC mount paths to local folders."""

    def __init__(self, spec: TrainSpec, path_map: dict[str, str] | None, workdir: Path):
        self.map: dict[str, str] = {}
        given = {k.rstrip("/") or "/": str(v) for k, v in (path_map or {}).items()}
        for pvc in spec.pvcs:
            mount = pvc.path.rstrip("/") or "/"
            target = given.get(mount) or str(workdir / "volumes" / pvc.claim)
            Path(target).mkdir(parents=True, exist_ok=True)
            self.map[mount] = target
        for mount, target in given.items():
            self.map.setdefault(mount, target)
        self._order = sorted(self.map, key=len, reverse=True)

    def __call__(self, value: str) -> str:
        if "=" in value and not value.startswith("/"):
            key, _, rest = value.partition("=")
            return f"{key}={self(rest)}"
        for mount in self._order:
            if value == mount or value.startswith(mount + "/"):
                return self.map[mount] + value[len(mount) :]
        return value


@dataclass
class _Replica:
    name: str
    rank: int
    proc: subprocess.Popen
    reader: threading.Thread


def _exit_code(returncode: int) -> int:
    """Popen's -N for a signal N as a shell/Kubernetes exit code (128 + N)."""
    return 128 - returncode if returncode < 0 else returncode


def _retryable(policy: str, code: int) -> bool:
    if policy == "Never":
        return False
    if policy == "ExitCode":
        return code >= 128
    return True


class LocalRun:
    """One local run of a spec; ``run()`` returns a JobResult or raises JobFailed."""

    def __init__(
        self,
        spec: TrainSpec,
        *,
        path_map: dict[str, str] | None = None,
        workdir: str | Path | None = None,
        timeout_s: float | None = None,
        grace_period_s: float = 10.0,
        output_dir: str | Path | None = None,
        log: LogFn | None = None,
        on_event: Callable[[str, dict[str, Any]], None] | None = None,
        handle_sigterm: bool = True,
        python: str = sys.executable,
        extra_env: dict[str, str] | None = None,
    ):
        self.spec = spec
        self.workdir = Path(workdir or os.getcwd()).resolve()
        self.paths = PathMapper(spec, path_map, self.workdir)
        self.timeout_s = timeout_s
        self.grace_period_s = grace_period_s
        self.logs = ReplicaLogs(log)
        self.on_event = on_event or (lambda kind, info: None)
        self.handle_sigterm = handle_sigterm
        self.python = python
        self.extra_env = dict(extra_env or {})
        flag_dir = spec.trainer_flag("--output-dir")
        self.output_dir = output_dir or (self.paths(flag_dir) if flag_dir else None)

    # -- launching -----------------------------------------------------------------------------

    def command(self) -> list[str]:
        spec = self.spec
        if spec.command is None:
            if spec.nproc_per_node == 1 and not spec.elastic:
                head = [self.python, "-m", "trainer.train"]
            else:
                head = [self.python, "-m", "trainer.torchrun", "-m", "trainer.train"]
        else:
            head = list(spec.command)
            if head[0] == "torchrun":
                head[:1] = [self.python, "-m", "torch.distributed.run"]
            elif head[0] in ("python", "python3"):
                head[0] = self.python
        return [self.paths(a) for a in head + list(spec.args)]

    def replica_env(self, rank: int, port: int) -> dict[str, str]:
        spec = self.spec
        env = dict(os.environ)
        env.update({k: self.paths(v) for k, v in spec.merged_env().items()})
        env.update(self.extra_env)
        contract = {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "WORLD_SIZE": str(spec.world_size),
            "RANK": str(rank),
            "PET_NNODES": str(spec.workers),
            "PET_NPROC_PER_NODE": str(spec.nproc_per_node),
            "PET_NODE_RANK": str(rank),
            "PET_MASTER_ADDR": "127.0.0.1",
            "PET_MASTER_PORT": str(port),
            "PYTHONUNBUFFERED": "1",
        }
        if spec.elastic:
            contract |= {
                "PET_NNODES": f"{spec.elastic_min_replicas}:{spec.elastic_max_replicas}",
                "PET_RDZV_BACKEND": "c10d",
                "PET_RDZV_ENDPOINT": f"127.0.0.1:{port}",
            }
            if spec.max_restarts is not None:
                contract["PET_MAX_RESTARTS"] = str(spec.max_restarts)
        if spec.command is None and spec.nproc_per_node == 1 and not spec.elastic:
            contract |= {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
        if sys.platform.startswith("linux"):
            contract["GLOO_SOCKET_IFNAME"] = "lo"
        env.update(contract)
        return env

    def _start_group(self, attempt: int) -> list[_Replica]:
        port = free_port()
        cmd = self.command()
        replicas = []
        for rank, name in enumerate(replica_names(self.spec)):
            proc = subprocess.Popen(
                cmd,
                env=self.replica_env(rank, port),
                cwd=self.workdir,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: torchrun children stop with it
            )
            reader = threading.Thread(
                target=self._pump, args=(name, proc), name=f"log-{name}", daemon=True
            )
            reader.start()
            replicas.append(_Replica(name=name, rank=rank, proc=proc, reader=reader))
            self.on_event("started", {"replica": name, "pid": proc.pid, "attempt": attempt})
        self.logs.note(
            f"attempt {attempt}: started {len(replicas)} replica(s) on MASTER_PORT={port}: "
            + " ".join(cmd)
        )
        return replicas

    def _pump(self, name: str, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for raw in iter(proc.stdout.readline, b""):
            self.logs.line(name, raw.decode("utf-8", errors="replace"))
        proc.stdout.close()

    def _stop_group(self, replicas: list[_Replica], sig: int = signal.SIGTERM) -> None:
        for r in replicas:
            if r.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(r.proc.pid, sig)
        deadline = time.monotonic() + self.grace_period_s
        for r in replicas:
            with contextlib.suppress(subprocess.TimeoutExpired):
                r.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        for r in replicas:
            # Also stops what the replica started in its group (torchrun's workers).
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(r.proc.pid, signal.SIGKILL)
            r.proc.wait()
            r.reader.join(timeout=5)

    # -- running -------------------------------------------------------------------------------

    def _deadline(self, start: float) -> tuple[float | None, str]:
        limits = []
        if self.spec.active_deadline_seconds:
            limits.append((self.spec.active_deadline_seconds, "activeDeadlineSeconds"))
        if self.timeout_s:
            limits.append((self.timeout_s, "timeout_s"))
        if not limits:
            return None, ""
        seconds, knob = min(limits)
        return start + seconds, f"{knob}={seconds:g}"

    def _result(self, phase: str, start: float, restarts: int, reason: str = "") -> JobResult:
        return JobResult(
            name=self.spec.name,
            namespace=self.spec.namespace,
            backend="local",
            phase=phase,
            duration_s=round(time.monotonic() - start, 3),
            restarts=restarts,
            log_tail=self.logs.tail(),
            summary=read_summary(self.output_dir),
            reason=reason,
        )

    def run(self) -> JobResult:
        spec = self.spec
        limit = spec.backoff_limit if spec.backoff_limit is not None else DEFAULT_BACKOFF_LIMIT
        start = time.monotonic()
        deadline, deadline_knob = self._deadline(start)
        restarts = 0
        with sigterm_event(self.handle_sigterm) as cancelled:
            while True:
                replicas = self._start_group(restarts)
                failed: tuple[_Replica, int] | None = None
                while True:
                    if cancelled.is_set():
                        self.logs.note("SIGTERM: forwarding to every replica, then stopping")
                        self._stop_group(replicas)
                        reason = "cancelled by SIGTERM"
                        result = self._result("Cancelled", start, restarts, reason)
                        raise JobCancelled(f"local job {spec.name}: {reason}", result)
                    if deadline is not None and time.monotonic() > deadline:
                        self._stop_group(replicas)
                        reason = f"ran past {deadline_knob} s; replicas stopped"
                        result = self._result("Timeout", start, restarts, reason)
                        raise JobTimeout(f"local job {spec.name} {reason}", result)
                    codes = [r.proc.poll() for r in replicas]
                    bad = [(r, _exit_code(c)) for r, c in zip(replicas, codes, strict=True) if c]
                    if bad:
                        # A killed replica makes its peers fail too (gloo: "connection closed
                        # by peer"); when both show up in one poll, blame the signalled one.
                        failed = max(bad, key=lambda rc: rc[1] >= 128)
                        break
                    if all(c == 0 for c in codes):
                        break
                    time.sleep(0.1)
                if failed is None:
                    for r in replicas:
                        r.reader.join(timeout=5)
                    return self._result("Succeeded", start, restarts)
                replica, code = failed
                self.on_event("exited", {"replica": replica.name, "exit_code": code})
                self._stop_group(replicas)
                if _retryable(spec.restart_policy, code) and restarts < limit:
                    restarts += 1
                    self.logs.note(
                        f"{replica.name} exited with code {code}; restarting the group "
                        f"(restart {restarts} of backoff_limit={limit}, "
                        f"restart_policy={spec.restart_policy})"
                    )
                    self.on_event("restarting", {"replica": replica.name, "restarts": restarts})
                    continue
                why = (
                    f"restart_policy={spec.restart_policy} treats exit code {code} as permanent"
                    if not _retryable(spec.restart_policy, code)
                    else f"backoff_limit={limit} restarts used up"
                )
                reason = f"replica {replica.name} exited with code {code} ({why})"
                tail = "\n".join(
                    f"  [{replica.name}] {line}" for line in self.logs.replica_tail(replica.name)
                )
                result = self._result("Failed", start, restarts, reason)
                raise JobFailed(
                    f"local job {spec.name} failed: {reason}. Last log lines:\n{tail}", result
                )


def run_local(spec: TrainSpec, **options: Any) -> JobResult:
    """Run ``spec`` as local processes; options as ``LocalRun``'s keyword arguments."""
    return LocalRun(spec, **options).run()
