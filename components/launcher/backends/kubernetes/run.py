"""The cluster backend: ``KubernetesBackend(options)`` submits a spec and follows the job.

discovery (which API; ``auto`` picks TrainJob when Kubeflow Trainer v2 is served) → pre-flight →
create (HTTP 409 from the same run → re-attach) → follow: every node's log, the job's conditions
and reported progress (a TrainJob's ``status.trainerStatus``) through a watch, the watchdog →
Succeeded: result; Failed: the failing pod's reason, events and last log lines in ``JobFailed``;
past ``timeout_s``: delete, ``JobTimeout``; SIGTERM (pipeline cancelled): delete,
``JobCancelled``. ``cleanup`` decides whether a finished job is deleted.
The wait is our own loop (never an SDK's wait helper, whose timeouts broke the old KFP launcher).
"""

from __future__ import annotations

import threading
import time
from typing import Any, ClassVar

from components.launcher.apis import JobPhase, build_manifest, job_api
from components.launcher.backends.base import DryRun, run_on
from components.launcher.backends.common import ReplicaLogs
from components.launcher.backends.kubernetes.clients import Clients
from components.launcher.backends.kubernetes.diagnosis import Diagnosis
from components.launcher.backends.kubernetes.discovery import ApiChoice, choose_api
from components.launcher.backends.kubernetes.monitors import create_monitors
from components.launcher.backends.kubernetes.pods import PodFollower
from components.launcher.backends.kubernetes.preflight import preflight
from components.launcher.backends.kubernetes.submit import JobHandle
from components.launcher.backends.kubernetes.watchdog import Watchdog
from components.launcher.backends.kubernetes.watching import ResumableWatch
from components.launcher.monitoring_documents import monitoring_documents
from components.launcher.options import KubernetesOptions
from components.launcher.progress import ProgressLog
from components.launcher.result import (
    JobCancelled,
    JobFailed,
    JobResult,
    JobTimeout,
    read_summary,
)
from components.launcher.spec import TrainSpec


class KubernetesBackend:
    """The cluster backend (``Backend``): create the job's object, follow its pods, clean up."""

    name: ClassVar[str] = "kubernetes"

    def __init__(self, options: KubernetesOptions | None = None):
        self.options = options or KubernetesOptions()

    def dry_run(self, spec: TrainSpec) -> DryRun:
        """The job's manifest and its monitoring objects (``auto``: a TrainJob's)."""
        manifest = build_manifest(spec)
        api = spec.api if spec.api != "auto" else "trainjob"
        return DryRun("kubernetes", api, [manifest, *monitoring_documents(spec)])

    def submit(self, spec: TrainSpec) -> KubernetesJob:
        """Choose the API, pre-flight, create the job (a retried step re-attaches to its own)."""
        clients = Clients.connect(self.options)
        choice = choose(clients, spec, self.options)
        logs = ReplicaLogs(self.options.log)
        logs.note(f"submitting a {choice.api.kind}: {choice.why}")
        bound = spec.for_api(choice.api.name)  # refuses an option that API lacks
        if self.options.preflight:
            preflight(clients, bound, choice.api, logs.note)
        job = KubernetesJob(clients, self.options, logs, bound, choice, requested=spec)
        job.submit()
        return job

    def follow(self, job: KubernetesJob, cancelled: threading.Event) -> JobResult:
        return job.follow(cancelled)

    def cancel(self, job: KubernetesJob, reason: str) -> None:
        job.job.delete(reason)


def choose(clients: Clients, spec: TrainSpec, options: KubernetesOptions) -> ApiChoice:
    """The API to submit with (without pre-flight, a concrete API is taken as it is)."""
    if not options.preflight and spec.api != "auto":
        return ApiChoice(job_api(spec.api), "pre-flight off")
    return choose_api(clients, spec.api)


class KubernetesJob:
    """One submitted job and its wait loop."""

    def __init__(
        self,
        clients: Clients,
        options: KubernetesOptions,
        logs: ReplicaLogs,
        spec: TrainSpec,
        choice: ApiChoice,
        *,
        requested: TrainSpec,
    ):
        self.clients = clients
        self.options = options
        self.spec = spec
        self.api = choice.api
        self.logs = logs
        self.output_dir = options.output_dir or requested.trainer_flag("--output-dir")
        self.watchdog_reports: list[str] = []
        self.job = JobHandle(clients, self.api, spec, logs.note)
        self.follower = PodFollower(
            clients=clients,
            api=self.api,
            namespace=spec.namespace,
            job_name=spec.name,
            logs=logs,
            poll_interval_s=options.poll_interval_s,
        )
        self.diagnosis = Diagnosis(clients, self.api, spec.namespace, options.tail_lines)
        self.suspended = False
        self.watchdog = Watchdog(
            pending_timeout_s=options.pending_timeout_s,
            silence_timeout_s=options.silence_timeout_s,
            container=self.api.container,
            describe_pending=lambda: self.diagnosis.pending(self.follower, self.suspended),
        )
        self.start = time.monotonic()
        self.reattached = False
        self.phase = JobPhase(None)
        self.latest: dict[str, Any] = {}
        """The job as last read."""
        self.retries_seen = 0
        self.progress = ProgressLog(logs.note)
        self.job_watch = ResumableWatch(
            clients.custom.list_namespaced_custom_object,
            (self.api.group, self.api.version, spec.namespace, self.api.plural),
            {"field_selector": f"metadata.name={spec.name}"},
            logs.note,
            "job",
        )

    # -- results -------------------------------------------------------------------------------

    def _result(self, phase: str, reason: str = "") -> JobResult:
        return JobResult(
            name=self.spec.name,
            api=self.api.name,
            namespace=self.spec.namespace,
            backend="kubernetes",
            phase=phase,
            duration_s=round(time.monotonic() - self.start, 3),
            restarts=max(self.follower.restarts(), self.phase.restarts),
            log_tail=self.logs.tail(),
            summary=read_summary(self.output_dir),
            reason=reason,
            reattached=self.reattached,
            watchdog=list(self.watchdog_reports),
            trainer_status=self.progress.status,
        )

    # -- the loop ------------------------------------------------------------------------------

    def submit(self) -> None:
        """Create the job, or re-attach to an earlier attempt's (failing now if it failed for
        good), and its monitoring objects."""
        try:
            self.reattached = self.job.create()
            if self.reattached:
                self._previous_attempt()
            create_monitors(self.clients, self.spec, self.api, self.job.created, self.logs.note)
        except KeyboardInterrupt:
            raise self._cancelled() from None

    def follow(self, cancelled: threading.Event) -> JobResult:
        """Follow the pods and the job's conditions to the end (``cancelled``: delete it)."""
        try:
            self.follower.start()
            return self._loop(cancelled)
        except KeyboardInterrupt:
            raise self._cancelled() from None
        finally:
            self.follower.stop.set()

    def _cancelled(self) -> JobCancelled:
        self.job.delete("cancelled (SIGTERM)")
        return JobCancelled(
            f"{self.job.title} cancelled: deleted the job", self._result("Cancelled", "SIGTERM")
        )

    def _previous_attempt(self) -> None:
        """A retried step found the job of an earlier attempt. Failed for good (recorded, or a
        program exit 1-127): fail now, naming why, allocating nothing. Failed for a retryable
        reason (preemption, node loss, signals): create it again. Otherwise: follow it."""
        job = self.job.created or {}
        recorded = self.api.permanent_failure(job)
        if recorded is None and self.api.phase(job).phase == "Failed":
            worst = self.diagnosis.worst_pod(self.follower)
            code = worst[1].exit_code if worst else None
            said = self.api.program_exit_code(self.api.phase(job))
            if worst and code is not None and 0 < code < 128:
                recorded = f"pod {worst[0].metadata.name} exited with permanent code {code}"
                self.job.record_failure(recorded, suspend=False)
            elif said is not None and 0 < said < 128:
                recorded = f"the program exited with permanent code {said}"
                self.job.record_failure(recorded, suspend=False)
            else:
                self.job.recreate(
                    f"an earlier attempt's job failed ({self.api.phase(job).message})"
                )
                self.reattached = False
                return
        if recorded is not None:
            raise JobFailed(
                f"{self.job.title}: an earlier attempt of this step failed for good ({recorded}); "
                f"not retried, nothing allocated. {self.job.kept_note()}",
                self._result("Failed", recorded),
            )

    def _loop(self, cancelled: threading.Event) -> JobResult:
        while True:
            if cancelled.is_set():
                raise KeyboardInterrupt
            self._check_timeout()
            self._check_watchdog()
            self._read_phase()
            if self.phase.phase == "Succeeded":
                return self._succeeded()
            if self.phase.phase == "Failed":
                raise self._failed()
            self._check_permanent_exit()

    def _check_timeout(self) -> None:
        timeout = self.options.timeout_s
        if timeout is None or time.monotonic() - self.start <= timeout:
            return
        self.job.delete(f"timeout_s={timeout:g} exceeded")
        reason = f"ran past timeout_s={timeout:g} s; the job was deleted"
        raise JobTimeout(f"{self.job.title} {reason}", self._result("Timeout", reason))

    def _check_watchdog(self) -> None:
        message = self.watchdog.check(self.follower, self.start)
        if not message:
            return
        self.watchdog_reports.append(message)
        self.logs.note(f"watchdog: {message}")
        if self.options.watchdog_fails:
            self.job.delete("watchdog")
            raise JobFailed(
                f"{self.job.title}: watchdog: {message}; the job was deleted",
                self._result("Failed", message),
            )

    def _read_phase(self) -> None:
        for kind, job in self._watch_job_once(max(1, int(self.options.poll_interval_s))):
            if kind == "DELETED":
                raise JobFailed(
                    f"{self.job.title} was deleted by someone else while running",
                    self._result("Failed", "deleted"),
                )
            self.progress.observe(job)
            self.suspended = self.api.suspended(job)
            self.phase = self.api.phase(job)
            self.latest = job
            self._note_retry(job)

    def _note_retry(self, job: dict[str, Any]) -> None:
        """Say when the controller runs the whole job again (KubeRay's ``backoffLimit``)."""
        retries, why = self.api.retries(job)
        if retries > self.retries_seen:
            self.retries_seen = retries
            after = f" after: {why}" if why else ""
            title = self.job.title
            self.logs.note(f"{title}: its controller runs it again (retry {retries}){after}")

    def _check_permanent_exit(self) -> None:
        """A node that failed for good stops the job now: its program exited 1-127 (bad config,
        bad data), or it was evicted for writing more than its disk allows (it would again).

        A PyTorchJob with the ExitCode policy stops by itself on an exit 1-127; a TrainJob's Jobs
        (and a v1 job with OnFailure/Always, and every API after an eviction) would restart it on
        every GPU again and again, so once its reason and log tail are read the job is suspended
        (its pods deleted) and kept, with the reason recorded: a retry of the step fails at once
        instead of allocating the GPUs again.
        """
        self._check_permanent_program()
        found = self.diagnosis.permanent_exit(self.follower)
        if found is None:
            return
        pod, problem = found
        stops_itself = (
            problem.exit_code is not None
            and self.api.name == "pytorchjob"
            and (self.spec.operator.restart_policy or "ExitCode") in ("ExitCode", "Never")
        )
        if stops_itself:
            return  # the controller marks the job Failed; the loop reports it then
        time.sleep(min(1.0, self.options.poll_interval_s))  # let its last log lines arrive
        reason, details = self.diagnosis.failure(self.follower)
        if problem.exit_code is not None:
            what = f"exited with permanent code {problem.exit_code}"
            cause = f"permanent exit code {problem.exit_code}"
        else:
            what, cause = "was evicted for its own disk use", "evicted for its own disk use"
        message = f"{self.job.title}: a node {what} ({reason}); not retried"
        self.follower.stop.set()
        self.job.record_failure(f"{reason}; {cause}", suspend=True)
        raise JobFailed(
            f"{message}{details}\n{self.job.kept_note()}", self._result("Failed", message)
        )

    def _check_permanent_program(self) -> None:
        """A program that failed for good in a job its controller would run again (a RayJob with
        ``backoffLimit`` left: a new Ray cluster, whatever the code): the job is suspended now
        (its pods deleted, no new ones) and kept with the reason, so neither the controller nor
        a retry of the step allocates anything again."""
        code = self.api.permanent_code_before_retry(self.latest)
        if code is None:
            return
        time.sleep(min(1.0, self.options.poll_interval_s))  # let its last log lines arrive
        reason = f"the program exited with permanent code {code}"
        message = f"{self.job.title}: {reason}; not retried"
        self.follower.stop.set()
        self.job.record_failure(reason, suspend=True)
        raise JobFailed(f"{message}\n{self.job.kept_note()}", self._result("Failed", message))

    def _succeeded(self) -> JobResult:
        time.sleep(min(1.0, self.options.poll_interval_s))  # let log streams drain
        result = self._result("Succeeded")
        self.follower.stop.set()
        if self.options.cleanup in ("always", "on-success"):
            self.job.delete(f"succeeded; cleanup={self.options.cleanup}")
        return result

    def _failed(self) -> JobFailed:
        time.sleep(min(1.0, self.options.poll_interval_s))
        reason, details = self.diagnosis.failure(self.follower)
        message = self.phase.message
        worst = self.diagnosis.worst_pod(self.follower)
        if self.api.pods_exit_as_the_program:
            code = worst[1].exit_code if worst else None
        else:  # a RayJob's driver runs in no pod of its own: its code is in the job's status
            code = self.api.program_exit_code(self.phase)
        if code is not None and 0 < code < 128 and self.options.cleanup != "always":
            self.job.record_failure(f"{reason}; permanent exit code {code}", suspend=False)
        result = self._result("Failed", f"{message}; {reason}".strip("; "))
        self.follower.stop.set()
        if self.options.cleanup == "always":
            self.job.delete("failed; cleanup=always")
            kept = ""
        else:
            kept = f"\n{self.job.kept_note()}"
        return JobFailed(
            f"{self.job.title} failed: {message}. Failing {reason}{details}{kept}", result
        )

    def _watch_job_once(self, timeout: int) -> list[tuple[str, dict[str, Any]]]:
        """The job's watch events for up to ``timeout`` s (continuing the previous request).

        A broken watch falls back to one GET, so a flaky connection never ends the follow.
        """
        events = []
        try:
            for kind, job in self.job_watch.events(timeout):
                events.append((kind, job))
                if kind == "DELETED" or self.api.phase(job).phase:
                    break
            return events
        except Exception as exc:  # noqa: BLE001 - ApiException, urllib3 errors, bad chunks
            self.logs.note(f"job watch interrupted ({exc}); reading the job instead")
        time.sleep(self.options.poll_interval_s)
        try:
            job = self.job.get()
        except Exception as exc:  # noqa: BLE001
            self.logs.note(f"reading the job failed ({exc}); retrying")
            return []
        return [("DELETED", {})] if job is None else [("MODIFIED", job)]


def run_kubernetes(spec: TrainSpec, options: KubernetesOptions | None = None) -> JobResult:
    """Submit ``spec`` to the cluster and follow it (SIGTERM: delete it, ``JobCancelled``)."""
    backend = KubernetesBackend(options)
    return run_on(backend, spec, handle_sigterm=backend.options.handle_sigterm)
