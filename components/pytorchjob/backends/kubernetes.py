"""Kubernetes backend: submit the PyTorchJob to the Training Operator, follow it, clean up.

pre-flight (CRD served, RBAC via SelfSubjectAccessReview, namespace) → create (409 from the same
run → re-attach) → follow: every replica's log with a ``[master-0]``/``[worker-1]`` prefix as soon
as its container starts, the job's conditions through a watch, a watchdog for pods stuck Pending
and for silent replicas → Succeeded: result; Failed: the failing pod's reason (pod status and
events) and its last log lines in ``JobFailed``; past ``timeout_s``: delete, ``JobTimeout``;
SIGTERM (pipeline cancelled): delete, ``JobCancelled``. ``cleanup`` decides whether a finished
job is deleted.

Talks to the API with kubeflow-training's ``TrainingClient`` (create/get/delete/pods; waits are our
own loop, so the SDK's ``wait_timeout`` vs ``timeout`` mix-up that broke the old KFP launcher
cannot bite) and the ``kubernetes`` client (watches, logs, events, access reviews).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from components.pytorchjob.backends.common import LogFn, ReplicaLogs, sigterm_event
from components.pytorchjob.manifest import CONTAINER_NAME, build_pytorchjob_model, job_labels
from components.pytorchjob.result import (
    JobCancelled,
    JobExists,
    JobFailed,
    JobResult,
    JobTimeout,
    PreflightError,
    read_summary,
)
from components.pytorchjob.spec import RUN_ID_LABEL, TASK_LABEL, SpecError, TrainSpec

GROUP, VERSION, PLURAL = "kubeflow.org", "v1", "pytorchjobs"
JOB_NAME_LABEL = "training.kubeflow.org/job-name"
REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"

REQUIRED_PERMISSIONS: tuple[tuple[str, str, str], ...] = (
    # (API group, resource, verb): exactly what this backend calls, namespaced (rbac.yaml Role).
    ("kubeflow.org", "pytorchjobs", "create"),
    ("kubeflow.org", "pytorchjobs", "get"),
    ("kubeflow.org", "pytorchjobs", "list"),
    ("kubeflow.org", "pytorchjobs", "watch"),
    ("kubeflow.org", "pytorchjobs", "delete"),
    ("", "pods", "get"),
    ("", "pods", "list"),
    ("", "pods", "watch"),
    ("", "pods/log", "get"),
    ("", "events", "list"),
)
CLUSTER_PERMISSIONS: tuple[tuple[str, str, str], ...] = (
    # Cluster-scoped: a ClusterRole in rbac.yaml (a Role cannot grant it).
    ("authorization.k8s.io", "selfsubjectaccessreviews", "create"),
)
CLEANUP_MODES = ("always", "on-success", "never")
WAITING_ERRORS = {
    "ImagePullBackOff",
    "ErrImagePull",
    "InvalidImageName",
    "CrashLoopBackOff",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
}


def _api_status(exc: BaseException) -> int | None:
    """HTTP status of an ApiException (also when wrapped by TrainingClient's RuntimeError)."""
    from kubernetes.client.rest import ApiException

    while exc is not None:
        if isinstance(exc, ApiException):
            return exc.status
        exc = exc.__cause__ or exc.__context__
    return None


def replica_of(pod: Any) -> str:
    """``master-0`` / ``worker-1`` from the operator's pod labels (falls back to the pod name)."""
    labels = pod.metadata.labels or {}
    rtype, index = labels.get(REPLICA_TYPE_LABEL), labels.get(REPLICA_INDEX_LABEL)
    if rtype is not None and index is not None:
        return f"{rtype.lower()}-{index}"
    return pod.metadata.name


def _container_status(pod: Any) -> Any | None:
    for cs in (pod.status and pod.status.container_statuses) or []:
        if cs.name == CONTAINER_NAME:
            return cs
    return None


def _started(pod: Any) -> bool:
    cs = _container_status(pod)
    if cs is None or cs.state is None:
        return False
    return bool(cs.state.running or cs.state.terminated)


@dataclass
class _PodState:
    pod: Any
    first_seen: float
    streamed_restart_count: int | None = None
    streaming: bool = False
    max_restarts: int = 0


@dataclass
class _Follow:
    pods: dict[str, _PodState] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)
    first_running_at: float | None = None
    uids: dict[str, set[str]] = field(default_factory=dict)
    """Pod name → the uids seen: a recreated pod (ExitCode policy) is a restart too."""


class KubernetesRun:
    """One submit-and-follow of a spec; ``run()`` returns a JobResult or raises."""

    def __init__(
        self,
        spec: TrainSpec,
        *,
        client_configuration: Any = None,
        config_file: str | None = None,
        context: str | None = None,
        timeout_s: float | None = None,
        cleanup: str = "always",
        pending_timeout_s: float | None = 600.0,
        silence_timeout_s: float | None = 1800.0,
        watchdog_fails: bool = False,
        poll_interval_s: float = 2.0,
        output_dir: str | None = None,
        log: LogFn | None = None,
        handle_sigterm: bool = True,
        preflight: bool = True,
        tail_lines: int = 20,
    ):
        if cleanup not in CLEANUP_MODES:
            raise SpecError(f"cleanup={cleanup!r} is not allowed; use one of {CLEANUP_MODES}")
        self.spec = spec
        self.timeout_s = timeout_s
        self.cleanup = cleanup
        self.pending_timeout_s = pending_timeout_s
        self.silence_timeout_s = silence_timeout_s
        self.watchdog_fails = watchdog_fails
        self.poll_interval_s = poll_interval_s
        self.output_dir = output_dir or spec.trainer_flag("--output-dir")
        self.logs = ReplicaLogs(log)
        self.handle_sigterm = handle_sigterm
        self.do_preflight = preflight
        self.tail_lines = tail_lines
        self.watchdog_reports: list[str] = []
        self._setup_clients(client_configuration, config_file, context)

    # -- clients -------------------------------------------------------------------------------

    def _setup_clients(self, configuration: Any, config_file: str | None, context: str | None):
        from kubeflow.training import TrainingClient
        from kubernetes import client, config

        if configuration is None:
            try:
                if config_file or context:
                    config.load_kube_config(config_file=config_file, context=context)
                else:
                    try:
                        config.load_incluster_config()
                    except config.ConfigException:
                        config.load_kube_config()
            except (config.ConfigException, OSError) as exc:
                raise PreflightError(
                    f"no Kubernetes credentials: {exc}. Run inside a pod with a service account, "
                    "or set KUBECONFIG / config_file"
                ) from exc
            configuration = client.Configuration.get_default_copy()
        self.host = configuration.host
        api = client.ApiClient(configuration)
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.authz = client.AuthorizationV1Api(api)
        self.training = TrainingClient(
            client_configuration=configuration, namespace=self.spec.namespace
        )

    # -- pre-flight ----------------------------------------------------------------------------

    def preflight(self) -> None:
        """Fail early, with the fix, when the cluster cannot run the job."""
        from kubernetes import client
        from kubernetes.client.rest import ApiException
        from urllib3.exceptions import HTTPError

        ns = self.spec.namespace
        try:
            resources = self.custom.get_api_resources(GROUP, VERSION)
        except ApiException as exc:
            if exc.status == 404:
                raise PreflightError(
                    "the PyTorchJob CRD (pytorchjobs.kubeflow.org/v1) is not installed on the "
                    f"cluster at {self.host}: install the Kubeflow Training Operator v1 "
                    "(kubectl apply --server-side -k "
                    '"github.com/kubeflow/training-operator.git/manifests/overlays/standalone'
                    '?ref=v1.9.0")'
                ) from exc
            raise PreflightError(f"API discovery of {GROUP}/{VERSION} failed: {exc}") from exc
        except HTTPError as exc:
            raise PreflightError(f"cannot reach the Kubernetes API at {self.host}: {exc}") from exc
        if not any(r.name == PLURAL for r in resources.resources or []):
            raise PreflightError(
                f"{GROUP}/{VERSION} is served but has no {PLURAL}: install the Training Operator "
                "v1 with its PyTorchJob CRD"
            )
        denied = []
        for group, resource, verb in REQUIRED_PERMISSIONS:
            resource_name, _, subresource = resource.partition("/")
            review = client.V1SelfSubjectAccessReview(
                spec=client.V1SelfSubjectAccessReviewSpec(
                    resource_attributes=client.V1ResourceAttributes(
                        namespace=ns,
                        group=group,
                        resource=resource_name,
                        subresource=subresource or None,
                        verb=verb,
                    )
                )
            )
            try:
                answer = self.authz.create_self_subject_access_review(review)
            except ApiException as exc:
                raise PreflightError(
                    f"cannot check permissions (SelfSubjectAccessReview: HTTP {exc.status}): bind "
                    "the ClusterRole from components/pytorchjob/rbac.yaml to this service account"
                ) from exc
            if not answer.status.allowed:
                denied.append(f"{verb} {resource}" + (f" ({group})" if group else ""))
        if denied:
            raise PreflightError(
                f"this service account may not: {', '.join(denied)} in namespace {ns!r}. Apply "
                "components/pytorchjob/rbac.yaml (Role + RoleBinding for the pipeline's service "
                f"account) in {ns!r}"
            )
        try:
            self.core.read_namespace(ns)
        except ApiException as exc:
            if exc.status == 404:
                raise PreflightError(
                    f"namespace {ns!r} does not exist: create it or set TrainSpec.namespace"
                ) from exc
            if exc.status != 403:  # 403: may not read namespaces; create will tell (404) instead
                raise PreflightError(f"reading namespace {ns!r} failed: {exc}") from exc

    # -- create / re-attach --------------------------------------------------------------------

    def create(self) -> bool:
        """Create the job; True when an existing job of the same run was re-attached instead."""
        spec = self.spec
        try:
            self.training.create_job(job=build_pytorchjob_model(spec), namespace=spec.namespace)
            self.logs.note(f"created PyTorchJob {spec.namespace}/{spec.name}")
            return False
        except (RuntimeError, TimeoutError) as exc:
            status = _api_status(exc)
            if status == 409:
                return self._reattach()
            if status == 404:
                raise PreflightError(
                    f"namespace {spec.namespace!r} does not exist (create returned 404): create "
                    "it or set TrainSpec.namespace"
                ) from exc
            if status == 403:
                raise PreflightError(
                    f"forbidden to create pytorchjobs in {spec.namespace!r}: apply "
                    "components/pytorchjob/rbac.yaml"
                ) from exc
            raise JobFailed(
                f"creating PyTorchJob {spec.namespace}/{spec.name} failed: {exc}"
            ) from exc

    def _reattach(self) -> bool:
        spec = self.spec
        existing = self.training.get_job(spec.name, spec.namespace)
        theirs = existing.metadata.labels or {}
        ours = job_labels(spec)
        same = bool(spec.run_id) and all(
            theirs.get(k) == ours[k] for k in (RUN_ID_LABEL, TASK_LABEL)
        )
        if not same:
            raise JobExists(
                f"PyTorchJob {spec.namespace}/{spec.name} already exists and was not created by "
                f"this run (its labels {RUN_ID_LABEL}={theirs.get(RUN_ID_LABEL)!r}, "
                f"{TASK_LABEL}={theirs.get(TASK_LABEL)!r}; ours {ours[RUN_ID_LABEL]!r}, "
                f"{ours[TASK_LABEL]!r}): delete it (kubectl delete pytorchjob -n "
                f"{spec.namespace} {spec.name}) or choose another name"
            )
        self.logs.note(
            f"PyTorchJob {spec.namespace}/{spec.name} already exists for this run "
            f"({RUN_ID_LABEL}={ours[RUN_ID_LABEL]}): re-attaching instead of creating a duplicate"
        )
        return True

    def delete(self, why: str) -> None:
        from kubernetes import client

        spec = self.spec
        try:
            self.training.delete_job(
                spec.name,
                spec.namespace,
                delete_options=client.V1DeleteOptions(propagation_policy="Background"),
            )
            self.logs.note(f"deleted PyTorchJob {spec.namespace}/{spec.name} ({why})")
        except (RuntimeError, TimeoutError) as exc:
            if _api_status(exc) != 404:
                self.logs.note(f"could not delete PyTorchJob {spec.name}: {exc}")

    # -- following: pods and logs --------------------------------------------------------------

    def _watch_pods(self, follow: _Follow) -> None:
        from kubernetes import watch

        selector = f"{JOB_NAME_LABEL}={self.spec.name}"
        while not follow.stop.is_set():
            try:
                w = watch.Watch()
                for event in w.stream(
                    self.core.list_namespaced_pod,
                    self.spec.namespace,
                    label_selector=selector,
                    timeout_seconds=max(1, int(self.poll_interval_s)),
                ):
                    self._on_pod(follow, event["type"], event["object"])
                    if follow.stop.is_set():
                        w.stop()
            except Exception as exc:  # noqa: BLE001 - keep following; the main loop decides
                if not follow.stop.is_set():
                    self.logs.note(f"pod watch interrupted ({exc}); retrying")
                    follow.stop.wait(self.poll_interval_s)

    def _on_pod(self, follow: _Follow, kind: str, pod: Any) -> None:
        name = pod.metadata.name
        with follow.lock:
            if kind == "DELETED":
                follow.pods.pop(name, None)
                return
            follow.uids.setdefault(name, set()).add(pod.metadata.uid or "")
            state = follow.pods.get(name)
            if state is None:
                state = follow.pods[name] = _PodState(pod=pod, first_seen=time.monotonic())
            state.pod = pod
            cs = _container_status(pod)
            state.max_restarts = max(state.max_restarts, cs.restart_count if cs else 0)
            if not _started(pod):
                return
            if follow.first_running_at is None:
                follow.first_running_at = time.monotonic()
            restart_count = cs.restart_count if cs else 0
            if state.streaming or state.streamed_restart_count == restart_count:
                return
            state.streaming = True
            state.streamed_restart_count = restart_count
        threading.Thread(
            target=self._stream_logs, args=(follow, name, replica_of(pod)), daemon=True
        ).start()

    def _stream_logs(self, follow: _Follow, pod_name: str, replica: str) -> None:
        from kubernetes.client.rest import ApiException

        try:
            resp = self.core.read_namespaced_pod_log(
                pod_name,
                self.spec.namespace,
                container=CONTAINER_NAME,
                follow=True,
                _preload_content=False,
            )
            buffer = b""
            for chunk in resp.stream(amt=None, decode_content=False):
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    self.logs.line(replica, line.decode("utf-8", errors="replace"))
                if follow.stop.is_set():
                    break
            if buffer:
                self.logs.line(replica, buffer.decode("utf-8", errors="replace"))
            resp.release_conn()
        except (ApiException, OSError, ValueError) as exc:
            if not follow.stop.is_set():
                self.logs.note(f"log stream of {replica} ended: {exc}")
        except Exception as exc:  # noqa: BLE001 - urllib3 protocol errors when a pod goes away
            if not follow.stop.is_set():
                self.logs.note(f"log stream of {replica} ended: {exc}")
        finally:
            with follow.lock:
                state = follow.pods.get(pod_name)
                if state is not None:
                    state.streaming = False
            if state is not None and not follow.stop.is_set():
                # The container may have restarted while this stream was ending.
                self._on_pod(follow, "MODIFIED", state.pod)

    # -- diagnosis -----------------------------------------------------------------------------

    def _events(self, pod_name: str) -> list[str]:
        try:
            events = self.core.list_namespaced_event(
                self.spec.namespace, field_selector=f"involvedObject.name={pod_name}"
            ).items
        except Exception:  # noqa: BLE001 - diagnosis is best effort
            return []
        return [f"{e.reason}: {e.message}" for e in events if (e.type or "Warning") != "Normal"][
            -3:
        ]

    def _pod_problem(self, pod: Any) -> tuple[int, str]:
        """(severity, text) of what is wrong with ``pod``; severity 0 means nothing found."""
        status = pod.status
        cs = _container_status(pod)
        if cs is not None:
            for state, when in ((cs.state, ""), (cs.last_state, " (previous run)")):
                term = state.terminated if state else None
                if term is not None and term.exit_code:
                    reason = term.reason or "Error"
                    return 3, f"{reason} (exit code {term.exit_code}){when}"
            waiting = cs.state.waiting if cs.state else None
            if waiting is not None and waiting.reason in WAITING_ERRORS:
                return 3, f"{waiting.reason}: {waiting.message or ''}".rstrip(": ")
        if status is not None:
            if status.reason:
                return 2, f"{status.reason}: {status.message or ''}".rstrip(": ")
            for cond in status.conditions or []:
                if cond.type == "PodScheduled" and cond.status == "False":
                    return 2, f"{cond.reason or 'Unschedulable'}: {cond.message or ''}".rstrip(": ")
            if status.phase == "Failed":
                return 1, "pod Failed"
        return 0, ""

    def _fresh(self, pod: Any) -> Any:
        """The pod as the API has it now (falls back to what we have)."""
        try:
            return self.core.read_namespaced_pod(pod.metadata.name, self.spec.namespace)
        except Exception:  # noqa: BLE001 - diagnosis is best effort
            return pod

    def _diagnose(self, follow: _Follow) -> tuple[str, str]:
        """(reason, details) naming the failing pod, its reason, events and last log lines."""
        try:
            pods = self.training.get_job_pods(self.spec.name, self.spec.namespace)
        except Exception:  # noqa: BLE001
            with follow.lock:
                pods = [s.pod for s in follow.pods.values()]
        worst: tuple[int, str, Any] = (0, "", None)
        for listed in pods:
            pod = self._fresh(listed)
            severity, text = self._pod_problem(pod)
            if severity > worst[0]:
                worst = (severity, text, pod)
        if worst[2] is None:
            return "no failing pod found", ""
        pod = worst[2]
        replica = replica_of(pod)
        lines = self.logs.replica_tail(replica, self.tail_lines)
        if not lines:
            try:
                text = self.core.read_namespaced_pod_log(
                    pod.metadata.name,
                    self.spec.namespace,
                    container=CONTAINER_NAME,
                    tail_lines=self.tail_lines,
                )
                lines = text.splitlines()
            except Exception:  # noqa: BLE001
                lines = []
        reason = f"pod {pod.metadata.name} ({replica}): {worst[1]}"
        details = ""
        events = self._events(pod.metadata.name)
        if events:
            details += "\nEvents:\n" + "\n".join(f"  {e}" for e in events)
        if lines:
            details += f"\nLast log lines of {replica}:\n" + "\n".join(f"  {x}" for x in lines)
        return reason, details

    def _pending_report(self, follow: _Follow) -> str:
        with follow.lock:
            pods = [s.pod for s in follow.pods.values() if not _started(s.pod)]
        if not pods:
            return "no pods created yet (quota, Kueue admission or gang scheduling?)"
        parts = []
        for pod in pods:
            _, text = self._pod_problem(pod)
            events = self._events(pod.metadata.name)
            parts.append(
                f"{pod.metadata.name}: {text or 'Pending'}"
                + (f" [{'; '.join(events)}]" if events else "")
            )
        return "; ".join(parts)

    def _restarts(self, follow: _Follow, conditions_restarting: int) -> int:
        with follow.lock:
            counted = sum(s.max_restarts for s in follow.pods.values())
            counted += sum(len(uids) - 1 for uids in follow.uids.values())
        return max(counted, conditions_restarting)

    # -- the loop ------------------------------------------------------------------------------

    def _result(self, phase: str, start: float, restarts: int, reason: str = "", **kw) -> JobResult:
        return JobResult(
            name=self.spec.name,
            namespace=self.spec.namespace,
            backend="kubernetes",
            phase=phase,
            duration_s=round(time.monotonic() - start, 3),
            restarts=restarts,
            log_tail=self.logs.tail(),
            summary=read_summary(self.output_dir),
            reason=reason,
            watchdog=list(self.watchdog_reports),
            **kw,
        )

    def _watchdog(self, follow: _Follow, start: float, reported: set[str]) -> str | None:
        """A watchdog message if pods stay Pending or replicas stay silent too long."""
        now = time.monotonic()
        with follow.lock:
            states = list(follow.pods.values())
            running_since = follow.first_running_at
        waiting = [s for s in states if not _started(s.pod)]
        # Per pod, so a pod recreated late in a long run gets its own full allowance.
        stuck = [s for s in waiting if now - s.first_seen > (self.pending_timeout_s or 0)]
        if (
            self.pending_timeout_s is not None
            and ((not states and now - start > self.pending_timeout_s) or stuck)
            and "pending" not in reported
        ):
            reported.add("pending")
            return (
                f"pods still Pending after {self.pending_timeout_s:g} s "
                f"(pending_timeout_s): {self._pending_report(follow)}"
            )
        if self.silence_timeout_s is not None and running_since is not None and not waiting:
            last = max(running_since, self.logs.last_line_at or running_since)
            if now - last > self.silence_timeout_s and "silence" not in reported:
                reported.add("silence")
                return (
                    f"no replica logged anything for {self.silence_timeout_s:g} s "
                    "(silence_timeout_s): hanging at NCCL/gloo init or in a collective? Try "
                    "nccl_preset='debug'"
                )
        return None

    def _job_phase(self, job: dict[str, Any]) -> tuple[str | None, str, int]:
        conditions = (job.get("status") or {}).get("conditions") or []
        restarting = sum(1 for c in conditions if c.get("type") == "Restarting")
        for cond in reversed(conditions):
            if cond.get("status") == "True" and cond.get("type") in ("Succeeded", "Failed"):
                message = f"{cond.get('reason') or ''}: {cond.get('message') or ''}".strip(": ")
                return cond["type"], message, restarting
        return None, "", restarting

    def _watch_job_once(self, timeout: int) -> list[tuple[str, dict[str, Any]]]:
        """The job's watch events for up to ``timeout`` s (the first replays its current state).

        A broken watch falls back to one GET, so a flaky connection never ends the follow.
        """
        from kubernetes import watch
        from kubernetes.client.rest import ApiException

        events = []
        try:
            w = watch.Watch()
            for event in w.stream(
                self.custom.list_namespaced_custom_object,
                GROUP,
                VERSION,
                self.spec.namespace,
                PLURAL,
                field_selector=f"metadata.name={self.spec.name}",
                timeout_seconds=timeout,
            ):
                events.append((event["type"], event["object"]))
                if event["type"] == "DELETED" or self._job_phase(event["object"])[0]:
                    w.stop()
            return events
        except Exception as exc:  # noqa: BLE001 - ApiException, urllib3 errors, bad chunks
            self.logs.note(f"job watch interrupted ({exc}); reading the job instead")
        time.sleep(self.poll_interval_s)
        try:
            job = self.custom.get_namespaced_custom_object(
                GROUP, VERSION, self.spec.namespace, PLURAL, self.spec.name
            )
        except ApiException as exc:
            if exc.status == 404:
                return [("DELETED", {})]
            self.logs.note(f"reading the job failed ({exc.status}); retrying")
            return []
        except Exception as exc:  # noqa: BLE001
            self.logs.note(f"reading the job failed ({exc}); retrying")
            return []
        return [("MODIFIED", job)]

    def run(self) -> JobResult:
        spec = self.spec
        if self.do_preflight:
            self.preflight()
        start = time.monotonic()
        follow = _Follow()
        reattached = False
        restarting = 0
        reported: set[str] = set()
        with sigterm_event(self.handle_sigterm) as cancelled:
            try:
                reattached = self.create()
                threading.Thread(target=self._watch_pods, args=(follow,), daemon=True).start()
                while True:
                    if cancelled.is_set():
                        raise KeyboardInterrupt
                    if self.timeout_s is not None and time.monotonic() - start > self.timeout_s:
                        self.delete(f"timeout_s={self.timeout_s:g} exceeded")
                        reason = f"ran past timeout_s={self.timeout_s:g} s; the job was deleted"
                        result = self._result(
                            "Timeout", start, self._restarts(follow, restarting), reason
                        )
                        raise JobTimeout(
                            f"PyTorchJob {spec.namespace}/{spec.name} {reason}", result
                        )
                    message = self._watchdog(follow, start, reported)
                    if message:
                        self.watchdog_reports.append(message)
                        self.logs.note(f"watchdog: {message}")
                        if self.watchdog_fails:
                            self.delete("watchdog")
                            result = self._result(
                                "Failed", start, self._restarts(follow, restarting), message
                            )
                            raise JobFailed(
                                f"PyTorchJob {spec.namespace}/{spec.name}: watchdog: {message}; "
                                "the job was deleted",
                                result,
                            )
                    phase, cond_message = None, ""
                    for kind, job in self._watch_job_once(max(1, int(self.poll_interval_s))):
                        if kind == "DELETED":
                            raise JobFailed(
                                f"PyTorchJob {spec.namespace}/{spec.name} was deleted by someone "
                                "else while running",
                                self._result("Failed", start, 0, "deleted"),
                            )
                        phase, cond_message, restarting = self._job_phase(job)
                    if phase == "Succeeded":
                        time.sleep(min(1.0, self.poll_interval_s))  # let log streams drain
                        result = self._result(
                            "Succeeded",
                            start,
                            self._restarts(follow, restarting),
                            reattached=reattached,
                        )
                        follow.stop.set()
                        if self.cleanup == "always" or self.cleanup == "on-success":
                            self.delete("succeeded; cleanup=" + self.cleanup)
                        return result
                    if phase == "Failed":
                        time.sleep(min(1.0, self.poll_interval_s))
                        reason, details = self._diagnose(follow)
                        result = self._result(
                            "Failed",
                            start,
                            self._restarts(follow, restarting),
                            f"{cond_message}; {reason}".strip("; "),
                            reattached=reattached,
                        )
                        follow.stop.set()
                        if self.cleanup == "always":
                            self.delete("failed; cleanup=always")
                        raise JobFailed(
                            f"PyTorchJob {spec.namespace}/{spec.name} failed: {cond_message}. "
                            f"Failing {reason}{details}",
                            result,
                        )
            except KeyboardInterrupt:
                self.delete("cancelled (SIGTERM)")
                result = self._result(
                    "Cancelled", start, self._restarts(follow, restarting), "SIGTERM"
                )
                raise JobCancelled(
                    f"PyTorchJob {spec.namespace}/{spec.name} cancelled: deleted the job", result
                ) from None
            finally:
                follow.stop.set()


def run_kubernetes(spec: TrainSpec, **options: Any) -> JobResult:
    """Submit ``spec`` to the cluster and follow it; options as ``KubernetesRun``'s."""
    return KubernetesRun(spec, **options).run()


def delete_run_jobs(
    namespace: str,
    run_id: str,
    *,
    client_configuration: Any = None,
    log: Callable[[str], None] | None = None,
) -> list[str]:
    """Delete every PyTorchJob labelled with ``run_id`` in ``namespace``; return their names.

    Used by the pipeline's ExitHandler so a cancelled or failed run leaves no jobs behind.
    """
    from kubeflow.training import TrainingClient
    from kubernetes import client, config

    from components.pytorchjob.spec import label_safe

    if client_configuration is None:
        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        client_configuration = client.Configuration.get_default_copy()
    custom = client.CustomObjectsApi(client.ApiClient(client_configuration))
    training = TrainingClient(client_configuration=client_configuration, namespace=namespace)
    jobs = custom.list_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, label_selector=f"{RUN_ID_LABEL}={label_safe(run_id)}"
    )
    deleted = []
    for item in jobs.get("items", []):
        name = item["metadata"]["name"]
        try:
            training.delete_job(name, namespace)
            deleted.append(name)
        except RuntimeError as exc:
            if _api_status(exc) != 404:
                raise
        (log or print)(f"deleted PyTorchJob {namespace}/{name} (run {run_id})")
    return deleted
