"""Local backend: the TrainSpec's nodes as local processes with the chosen API's env contract.

For development and tests, not a scheduler. Each node ("pod") gets what its controller would give
it, plus PYTHONUNBUFFERED=1 and GLOO_SOCKET_IFNAME=lo on Linux (gloo otherwise picks the host's
first interface) and the variables of ``contracts`` (TrainJob on a torch, MPI or XGBoost
runtime; PyTorchJob; TFJob; XGBoostJob). A PyTorchJob with ``pytorch_master`` and
``nproc_per_node == 1`` runs the default command as ``python -m trainer.train`` directly per
replica (one process, no torchrun agent: about a second less per replica, and the replica's exit
code is the trainer's). An MPI runtime's ``launcher-0`` gets a hostfile of this machine with every
slot; the nodes' sshd is not needed here. A TFJob or XGBoostJob succeeds when its Chief or Master
exits 0 (the operator's success policy); replicas still running then (parameter servers serve
until stopped) are stopped as the operator's cleanPodPolicy Running deletes their pods.

``torchrun``/``python`` at the head of a custom command become this interpreter. Each node gets a
``TMPDIR`` of its own (``NODES_DIR/<replica>/tmp``, emptied when it stops, as a pod's ``/tmp``
emptyDir), unless ``env`` sets one.

Restarts: a node that exits non-zero stops the whole group (SIGTERM, then SIGKILL after
``grace_period_s``) and, if the failure is retryable and the restart budget is not used up, the
group starts again on a fresh port; the trainer resumes from its newest checkpoint by itself.
The Training Operator's jobs: their restart policy (ExitCode, the PyTorchJob's default: 1-127
permanent, signals/128-255 retryable; OnFailure, the TFJob's default, and Always: any failure;
Never, the XGBoostJob's default: none) and ``backoff_limit`` (a restarted TensorFlow or XGBoost
program resumes from its own checkpoint). TrainJob: exit codes 1-127 are permanent (the launcher
fails such a job fast on a cluster too), signals are retried up to 6 times (a Kubernetes Job's
default backoffLimit).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from components.launcher import rayjob
from components.launcher.backends import ray_local
from components.launcher.backends.base import DryRun, run_on
from components.launcher.backends.common import ReplicaLogs
from components.launcher.backends.contracts import (
    CONTRACT_VARIABLES,
    FIRST_REPLICA_SUCCEEDS,
    local_api,
    mpi_launcher,
    node_contract,
    replica_names,
    with_master,
)
from components.launcher.names import label_safe
from components.launcher.options import LocalOptions
from components.launcher.result import (
    JobCancelled,
    JobFailed,
    JobResult,
    JobTimeout,
    read_summary,
)
from components.launcher.spec import STAGE_CACHE, STAGE_ROOT, TrainSpec
from components.launcher.torchrun_report import LINES_READ, failure_lines
from components.launcher.training_operator import default_restart_policy
from kfp_ddp.atomic_files import write_atomic
from kfp_ddp.free_ports import free_port
from kfp_ddp.parent_death import die_with_this_process

TAIL_SHOWN = 20
"""A failed node's last lines in the job's error (its program's own: torchrun's are left out)."""

DEFAULT_BACKOFF_LIMIT = 6  # Kubernetes' own default (a Job's backoffLimit) when none is set.
PYTORCHJOB_BACKOFF_LIMIT = 3  # the v1 builders' default (PyTorchJob, TFJob)
NODES_DIR_ENV = "KFP_DDP_LOCAL_NODES_DIR"
DRY_RUN_PORT = 29500
"""The first port a dry run shows (torch's default master port); a run takes free ones."""
"""The default of LocalOptions.nodes_dir (``kfp-ddp run-local`` points it into its workspace)."""
NODE_TAG_ENV = "KFP_DDP_LOCAL_NODE"
"""Set in every node's environment (and so in everything it starts): finds its processes."""


def tagged_pids(tag: str) -> list[int]:
    """The processes whose environment carries ``NODE_TAG_ENV=tag`` (Linux; elsewhere none)."""
    needle = f"{NODE_TAG_ENV}={tag}".encode() + b"\0"
    proc = Path("/proc")
    if not proc.is_dir():
        return []
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ + b"\0":
            found.append(int(entry.name))
    return found


def _kill_tagged(tag: str, sig: int) -> None:
    """Send ``sig`` to every process whose environment carries ``NODE_TAG_ENV=tag``."""
    for pid in tagged_pids(tag):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


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

    def with_mount(self, mount: str, target: str) -> PathMapper:
        """A copy that also maps ``mount`` (a node's own folder, e.g. its staging disk)."""
        copy = PathMapper.__new__(PathMapper)
        copy.map = dict(self.map) | {mount.rstrip("/") or "/": target}
        copy._order = sorted(copy.map, key=len, reverse=True)
        return copy

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


@dataclass(frozen=True)
class RestartRule:
    """When the local group restarts: the policy it follows and its budget."""

    policy: str
    limit: int

    @classmethod
    def of(cls, spec: TrainSpec) -> RestartRule:
        if local_api(spec) == "trainjob":
            return cls(policy="ExitCode", limit=DEFAULT_BACKOFF_LIMIT)
        if local_api(spec) == "rayjob":  # a new Ray cluster per retry, backoff_limit of them
            # KubeRay retries any failure; on a cluster the launcher stops it on a permanent
            # code (1-127), as here.
            retries = spec.ray.backoff_limit or rayjob.DEFAULT_BACKOFF_LIMIT
            return cls(policy="ExitCode" if retries else "Never", limit=retries)
        backoff = spec.operator.backoff_limit
        limit = PYTORCHJOB_BACKOFF_LIMIT if backoff is None else backoff
        return cls(policy=default_restart_policy(spec), limit=limit)

    def retryable(self, code: int) -> bool:
        return _retryable(self.policy, code)


class LocalRun:
    """One local run of a spec; ``run()`` returns a JobResult or raises JobFailed."""

    def __init__(self, spec: TrainSpec, options: LocalOptions | None = None):
        options = options or LocalOptions()
        self.api = local_api(spec)
        self.spec = spec = spec.for_api(self.api)  # refuses an option that API lacks
        self.options = options
        self.workdir = Path(options.workdir or os.getcwd()).resolve()
        self.paths = PathMapper(spec, options.path_map, self.workdir)
        self.logs = ReplicaLogs(options.log)
        self.on_event = options.on_event or (lambda kind, info: None)
        self.restart = RestartRule.of(spec)
        self.run_tag = f"{os.getpid()}-{secrets.token_hex(4)}"
        self._ray_dir: str | None = None
        flag_dir = spec.trainer_flag("--output-dir")
        self.output_dir = options.output_dir or (self.paths(flag_dir) if flag_dir else None)

    # -- launching -----------------------------------------------------------------------------

    def _direct(self) -> bool:
        """Run the trainer without torchrun (PyTorchJob contract, one process per node)."""
        spec = self.spec
        return (
            self.api == "pytorchjob"
            and with_master(spec)
            and spec.command is None
            and spec.nproc_per_node == 1
        )

    def command(self, paths: PathMapper | None = None) -> list[str]:
        """The node's command; with ``stage_data_uri`` the staging runs first in the same process
        (locally there is no init container), then execs the training command."""
        spec = self.spec
        paths = paths or self.paths
        head = ["python", "-m", "trainer.train"] if self._direct() else spec.container_command()
        head = self._local_program(head) + spec.container_args()
        staging = self._local_program(spec.stage_command())
        full = [*staging, "--", *head] if staging else head
        return [paths(a) for a in full]

    def replica_command(
        self, name: str, ports: list[int], paths: PathMapper, *, dry: bool = False
    ) -> list[str]:
        """Replica ``name``'s command: the node's (``command``), or a RayJob's Ray node or
        driver (``ray_local``); ``dry``: for a dry run (no Ray folder made)."""
        if self.api != "rayjob":
            return self.command(paths)
        python, spec = self.options.python, self.spec
        if name != "submitter":
            temp_dir = "$TMPDIR/kfp-ddp-ray-XXXX" if dry else self.ray_dir
            return ray_local.node_command(
                python, name, gcs_port=ports[1], cpus=spec.nproc_per_node or 1, temp_dir=temp_dir
            )
        entrypoint = self._local_program(rayjob.entrypoint(spec))
        driver = ray_local.after_nodes(python, spec.workers + 1, entrypoint)
        staging = self._local_program(spec.stage_command())
        full = [*staging, "--", *driver] if staging else driver
        return [paths(a) for a in full]

    @property
    def ray_dir(self) -> str:
        """A RayJob's Ray temp folder here: short (Ray's socket paths must stay under ~107
        characters), made at the start, removed at the end."""
        if self._ray_dir is None:
            self._ray_dir = tempfile.mkdtemp(prefix="kfp-ddp-ray-")
        return self._ray_dir

    def _local_program(self, command: list[str]) -> list[str]:
        """``python``/``torchrun`` at the head of a command become this interpreter."""
        python = self.options.python
        if command[:1] == ["torchrun"]:
            return [python, "-m", "torch.distributed.run", *command[1:]]
        if command[:1] in (["python"], ["python3"]):
            return [python, *command[1:]]
        return command

    @property
    def nodes_dir(self) -> Path:
        """Where the nodes' own disks are (and the records of failed jobs)."""
        return Path(
            self.options.nodes_dir or os.environ.get(NODES_DIR_ENV) or self.workdir / "nodes"
        )

    @property
    def failure_record(self) -> Path | None:
        """Where a job of a pipeline run (``run_id``) that failed for good records why: a
        retried step reads it and fails at once, as on a cluster (None without a run id)."""
        if not self.spec.run_id:
            return None
        return self.nodes_dir / "failed" / f"{label_safe(self.spec.run_id)}-{self.spec.name}.json"

    @property
    def mpi_hostfile(self) -> Path:
        """An MPI runtime's hostfile here: this machine with every slot (written at start)."""
        return self.nodes_dir / "mpi" / f"{self.spec.name}.hostfile"

    def _write_mpi_hostfile(self) -> None:
        slots = self.spec.workers * (self.spec.nproc_per_node or 1)
        self.mpi_hostfile.parent.mkdir(parents=True, exist_ok=True)
        line = f"localhost slots={slots}\n".encode()
        write_atomic(self.mpi_hostfile, lambda out: out.write(line))

    def node_paths(self, replica: str) -> PathMapper:
        """The path map of one node: the shared ones, plus its own staging disk (and the
        machine's cache folder, ``stage_cache_host_path``, which all nodes share)."""
        if not self.spec.stage_data_uri:
            return self.paths
        # A RayJob's driver stages once for every Ray node here: one machine, one disk.
        root = self.nodes_dir / ("ray" if self.api == "rayjob" else replica) / "stage"
        root.mkdir(parents=True, exist_ok=True)
        paths = self.paths.with_mount(STAGE_ROOT, str(root))
        if self.spec.stage_cache_host_path:
            Path(self.spec.stage_cache_host_path).mkdir(parents=True, exist_ok=True)
            paths = paths.with_mount(STAGE_CACHE, self.spec.stage_cache_host_path)
        return paths

    def _contract(self, rank: int, ports: list[int]) -> dict[str, str]:
        """The variables the controller gives node ``rank`` (``ports``: one per replica)."""
        return node_contract(
            self.spec, rank, ports, mpi_hostfile=self.mpi_hostfile, direct=self._direct()
        )

    def replica_env(self, rank: int, ports: list[int]) -> dict[str, str]:
        env = dict(os.environ)
        # Whatever this process inherited from a launcher of its own must not leak in.
        for name in [k for k in env if k.startswith("PET_")] + list(CONTRACT_VARIABLES):
            env.pop(name, None)
        env.update({k: self.paths(v) for k, v in self.spec.merged_env().items()})
        if self.spec.s3_endpoint:
            env["AWS_ENDPOINT_URL_S3"] = self.spec.s3_endpoint
        env.update(self.options.extra_env)
        env.update(self._contract(rank, ports))
        env["PYTHONUNBUFFERED"] = "1"
        if sys.platform.startswith("linux"):
            env["GLOO_SOCKET_IFNAME"] = "lo"
        return env

    def _start_group(self, attempt: int) -> list[_Replica]:
        names = replica_names(self.spec)
        ports = [free_port() for _ in names]
        replicas = []
        for rank, name in enumerate(names):
            cmd = self.replica_command(name, ports, self.node_paths(name))
            proc = subprocess.Popen(
                cmd,
                env=self.replica_env(rank, ports)
                | self._scratch(name)
                | {NODE_TAG_ENV: self._tag(name)},
                cwd=self.workdir,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: torchrun children stop with it
                preexec_fn=die_with_this_process(),  # SIGTERM if the launcher dies unannounced
            )
            reader = threading.Thread(
                target=self._pump, args=(name, proc), name=f"log-{name}", daemon=True
            )
            reader.start()
            replicas.append(_Replica(name=name, rank=rank, proc=proc, reader=reader))
            self.on_event("started", {"replica": name, "pid": proc.pid, "attempt": attempt})
        where = f"ports {ports}" if len(ports) > 1 else f"port {ports[0]}"
        self.logs.note(
            f"attempt {attempt}: started {len(replicas)} replica(s) on {where}: " + " ".join(cmd)
        )
        return replicas

    def _pump(self, name: str, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for raw in iter(proc.stdout.readline, b""):
            self.logs.line(name, raw.decode("utf-8", errors="replace"))
        proc.stdout.close()

    def stop_group(self, replicas: list[_Replica], sig: int = signal.SIGTERM) -> None:
        """Stop every node: SIGTERM (a chance to checkpoint), SIGKILL after the grace period.

        A node whose main process already died is a dead pod: whatever it left running (torchrun
        starts its workers in sessions of their own) is killed at once, as a pod's processes die
        with it. Nodes are found by a tag in their environment, which their children inherit.
        """
        for r in replicas:
            if r.proc.poll() is not None:
                _kill_tagged(self._tag(r.name), signal.SIGKILL)
            else:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(r.proc.pid, sig)
        deadline = time.monotonic() + self.options.grace_period_s
        for r in replicas:
            with contextlib.suppress(subprocess.TimeoutExpired):
                r.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        for r in replicas:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(r.proc.pid, signal.SIGKILL)
            _kill_tagged(self._tag(r.name), signal.SIGKILL)
            r.proc.wait()
            r.reader.join(timeout=5)
        self._remove_scratch(replicas)

    def _scratch(self, replica: str) -> dict[str, str]:
        """The node's own, fresh ``TMPDIR`` (a pod's ``/tmp`` emptyDir: torchrun's logs and
        every temporary file go there and go with the node), unless ``env`` sets one."""
        if "TMPDIR" in self.spec.env or "TMPDIR" in self.options.extra_env:
            return {}
        folder = self._tmp_of(replica)
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        return {"TMPDIR": str(folder)}

    def _tmp_of(self, replica: str) -> Path:
        return self.nodes_dir / replica / "tmp"

    def _remove_scratch(self, replicas: list[_Replica]) -> None:
        """Empty the stopped nodes' ``TMPDIR`` folders, as their pods' emptyDirs go (and a
        RayJob's Ray folder once its head is gone)."""
        for r in replicas:
            shutil.rmtree(self._tmp_of(r.name), ignore_errors=True)
        if self._ray_dir is not None and any(r.name == "head-0" for r in replicas):
            shutil.rmtree(self._ray_dir, ignore_errors=True)
            self._ray_dir = None

    def _tag(self, replica: str) -> str:
        return f"{self.run_tag}/{replica}"

    # -- running -------------------------------------------------------------------------------

    def _deadline(self, start: float) -> tuple[float | None, str]:
        limits: list[tuple[float, str]] = []
        if self.spec.active_deadline_seconds:
            limits.append((self.spec.active_deadline_seconds, "activeDeadlineSeconds"))
        if self.options.timeout_s:
            limits.append((self.options.timeout_s, "timeout_s"))
        if not limits:
            return None, ""
        seconds, knob = min(limits)
        return start + seconds, f"{knob}={seconds:g}"

    def _result(self, phase: str, start: float, restarts: int, reason: str = "") -> JobResult:
        return JobResult(
            name=self.spec.name,
            api=self.api,
            namespace=self.spec.namespace,
            backend="local",
            phase=phase,
            duration_s=round(time.monotonic() - start, 3),
            restarts=restarts,
            log_tail=self.logs.tail(),
            summary=read_summary(self.output_dir),
            reason=reason,
        )

    def _wait_group(self, replicas: list[_Replica], run: _RunClock, cancelled) -> _Exit | None:
        """Wait until every replica succeeded (None) or one failed; stop on SIGTERM/deadline."""
        while True:
            if cancelled.is_set():
                self.logs.note("SIGTERM: forwarding to every replica, then stopping")
                self.stop_group(replicas)
                reason = "cancelled by SIGTERM"
                result = self._result("Cancelled", run.start, run.restarts, reason)
                raise JobCancelled(f"local job {self.spec.name}: {reason}", result)
            if run.deadline is not None and time.monotonic() > run.deadline:
                self.stop_group(replicas)
                reason = f"ran past {run.deadline_knob} s; replicas stopped"
                result = self._result("Timeout", run.start, run.restarts, reason)
                raise JobTimeout(f"local job {self.spec.name} {reason}", result)
            codes = [r.proc.poll() for r in replicas]
            if self._succeeded(codes):
                self._stop_the_rest(replicas)
                for r in replicas:
                    r.reader.join(timeout=5)
                return None
            bad = [_Exit(r, _exit_code(c)) for r, c in zip(replicas, codes, strict=True) if c]
            if bad:
                # A killed replica makes its peers fail too (gloo: "connection closed by peer");
                # when both show up in one poll, blame the signalled one.
                return max(bad, key=lambda failure: failure.code >= 128)
            time.sleep(0.1)

    def _succeeded(self, codes: list[int | None]) -> bool:
        """Every replica exited 0; a TFJob or XGBoostJob: its Chief or Master did (the
        operator's success policy)."""
        if self.api in FIRST_REPLICA_SUCCEEDS:
            return codes[0] == 0  # chief-0, master-0
        return all(c == 0 for c in codes)

    def _stop_the_rest(self, replicas: list[_Replica]) -> None:
        """After success, stop what still runs (a TFJob's parameter servers serve until then)."""
        running = [r for r in replicas if r.proc.poll() is None]
        if running:
            self.logs.note(
                f"{replicas[0].name} succeeded, so the job did; stopping "
                f"{', '.join(r.name for r in running)} (cleanPodPolicy Running)"
            )
            self.stop_group(running)

    def _give_up(self, failure: _Exit, run: _RunClock) -> JobFailed:
        rule = self.restart
        name, code = failure.replica.name, failure.code
        why = (
            f"restart policy {rule.policy} treats exit code {code} as permanent"
            if not rule.retryable(code)
            else f"backoff limit {rule.limit} restarts used up"
        )
        said, lines = failure_lines(self.logs.replica_tail(name, LINES_READ), TAIL_SHOWN)
        reason = f"replica {name} exited with code {code} ({why})"
        if said:
            reason += f"; its torchrun says {said}"
        tail = "\n".join(f"  [{name}] {line}" for line in lines)
        result = self._result("Failed", run.start, run.restarts, reason)
        record = self.failure_record
        if record is not None and not rule.retryable(code):
            write_atomic(record, lambda out: out.write(json.dumps({"reason": reason}).encode()))
        return JobFailed(
            f"local job {self.spec.name} failed: {reason}. Last log lines:\n{tail}", result
        )

    def _earlier_failure(self) -> JobFailed | None:
        """The failure an earlier attempt of this step recorded (it failed for good)."""
        record = self.failure_record
        if record is None or not record.is_file():
            return None
        reason = json.loads(record.read_text()).get("reason", "?")
        return JobFailed(
            f"local job {self.spec.name}: an earlier attempt of this step failed for good "
            f"({reason}); not retried, nothing started (delete {record} to run it again)",
            self._result("Failed", time.monotonic(), 0, reason),
        )

    def start(self) -> LocalJob:
        """Start the first group of nodes (none when an earlier attempt failed for good)."""
        start = time.monotonic()
        deadline, knob = self._deadline(start)
        clock = _RunClock(start=start, deadline=deadline, deadline_knob=knob)
        earlier = self._earlier_failure()
        if earlier is not None:
            raise earlier
        self.logs.note(f"local {self.api} contract, {self.spec.workers} node(s)")
        if mpi_launcher(self.spec):
            self._write_mpi_hostfile()
        return LocalJob(self, clock, self._start_group(clock.restarts))

    def follow(self, job: LocalJob, cancelled: threading.Event) -> JobResult:
        """Wait for the nodes; restart the group as the API's restart policy says."""
        clock = job.clock
        while True:
            try:
                failure = self._wait_group(job.replicas, clock, cancelled)
            except BaseException:
                # Ctrl-C or any error here: the nodes run in their own sessions (as pods
                # would), so nothing else stops them. Never leave them behind.
                self.stop_group(job.replicas)
                raise
            if failure is None:
                self._remove_scratch(job.replicas)
                return self._result("Succeeded", clock.start, clock.restarts)
            self.on_event("exited", {"replica": failure.replica.name, "exit_code": failure.code})
            self.stop_group(job.replicas)
            if not self.restart.retryable(failure.code) or clock.restarts >= self.restart.limit:
                raise self._give_up(failure, clock)
            clock.restarts += 1
            self.logs.note(
                f"{failure.replica.name} exited with code {failure.code}; restarting the "
                f"group (restart {clock.restarts} of {self.restart.limit}, restart policy "
                f"{self.restart.policy})"
            )
            self.on_event(
                "restarting", {"replica": failure.replica.name, "restarts": clock.restarts}
            )
            job.replicas = self._start_group(clock.restarts)

    def dry_run(self) -> DryRun:
        """Each node's replica name, command and environment contract (the ports are examples:
        free ones are taken when the nodes start; paths are those of ``path_map``)."""
        names = replica_names(self.spec)
        ports = [DRY_RUN_PORT + index for index in range(len(names))]
        documents = [
            {
                "replica": name,
                "command": self.replica_command(name, ports, self.paths, dry=True),
                "env": self.spec.merged_env() | self._contract(rank, ports),
            }
            for rank, name in enumerate(names)
        ]
        return DryRun("local", self.api, documents)


@dataclass
class LocalJob:
    """A started local job: its run, its clock and the group of nodes now running."""

    run: LocalRun
    clock: _RunClock
    replicas: list[_Replica]


class LocalBackend:
    """The local backend (``Backend``): the nodes as processes of this machine."""

    name: ClassVar[str] = "local"

    def __init__(self, options: LocalOptions | None = None):
        self.options = options or LocalOptions()

    def dry_run(self, spec: TrainSpec) -> DryRun:
        return LocalRun(spec, self.options).dry_run()

    def submit(self, spec: TrainSpec) -> LocalJob:
        return LocalRun(spec, self.options).start()

    def follow(self, job: LocalJob, cancelled: threading.Event) -> JobResult:
        return job.run.follow(job, cancelled)

    def cancel(self, job: LocalJob, reason: str) -> None:
        job.run.logs.note(f"cancelling: {reason}")
        job.run.stop_group(job.replicas)


@dataclass
class _Exit:
    """A replica that exited non-zero, and its exit code (128 + N for signal N)."""

    replica: _Replica
    code: int


@dataclass
class _RunClock:
    """When the run started, when it must end, and how often it restarted."""

    start: float
    deadline: float | None
    deadline_knob: str
    restarts: int = 0


def run_local(spec: TrainSpec, options: LocalOptions | None = None) -> JobResult:
    """Run ``spec`` as local processes (SIGTERM: forwarded to the nodes, ``JobCancelled``)."""
    backend = LocalBackend(options)
    return run_on(backend, spec, handle_sigterm=backend.options.handle_sigterm)
