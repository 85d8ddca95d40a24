"""Follow a job's pods: a watch on them, and every node's log streamed as soon as it starts.

``PodFollower`` keeps what was seen of each pod (``PodState``), counts restarts (container
restarts and pods the controller recreated), and prefixes each node's lines with its replica
name (``[node-1]``, ``[worker-0]``) through ``ReplicaLogs``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from components.launcher.apis import JobApi
from components.launcher.backends.common import ReplicaLogs
from components.launcher.backends.kubernetes.clients import Clients
from components.launcher.backends.kubernetes.watching import ResumableWatch


def container_status(pod: Any, container: str) -> Any | None:
    """The status of ``container`` in ``pod`` (None before it has one)."""
    for status in (pod.status and pod.status.container_statuses) or []:
        if status.name == container:
            return status
    return None


def started(pod: Any, container: str) -> bool:
    """Whether the container runs or ran (its log can be read)."""
    status = container_status(pod, container)
    if status is None or status.state is None:
        return False
    return bool(status.state.running or status.state.terminated)


MAX_STREAM_FAILURES = 5
"""Log streams of one container run that may drop in a row (each is re-opened) before giving up."""


def running(pod: Any, container: str) -> bool:
    status = container_status(pod, container)
    return bool(status is not None and status.state is not None and status.state.running)


@dataclass
class PodState:
    """What the follower knows about one pod."""

    pod: Any
    first_seen: float
    streamed_restart_count: int | None = None
    """The container run (its restart count) whose log is followed."""
    streaming: bool = False
    max_restarts: int = 0
    lines_printed: int = 0
    """Lines of that run printed so far: a re-opened stream skips them."""
    run_complete: bool = False
    """That run's log was followed to its end (the container exited)."""
    stream_failures: int = 0
    """Streams of that run that dropped in a row while the container ran."""

    def follow_run(self, restart_count: int) -> bool:
        """Whether to open a stream for the container run ``restart_count`` now."""
        if self.streaming:
            return False
        if self.streamed_restart_count != restart_count:
            self.streamed_restart_count = restart_count
            self.lines_printed, self.run_complete, self.stream_failures = 0, False, 0
        elif self.run_complete or self.stream_failures >= MAX_STREAM_FAILURES:
            return False
        self.streaming = True
        return True


@dataclass
class PodFollower:
    """Watches the pods of one job and streams their logs until ``stop`` is set."""

    clients: Clients
    api: JobApi
    namespace: str
    job_name: str
    logs: ReplicaLogs
    poll_interval_s: float
    pods: dict[str, PodState] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)
    first_running_at: float | None = None
    uids: dict[str, set[str]] = field(default_factory=dict)
    """Replica → the pod uids seen: a pod the controller recreated is a restart too."""
    deleted: dict[str, PodState] = field(default_factory=dict)
    """The last state of pods since deleted (a failed Job's pods, the operator's
    cleanPodPolicy): their restarts still count, and a failure is still explained by them."""

    def start(self) -> None:
        threading.Thread(target=self._watch, name="pod-watch", daemon=True).start()

    def snapshot(self) -> list[PodState]:
        with self.lock:
            return list(self.pods.values())

    def restarts(self) -> int:
        """Container restarts plus pods recreated by the controller."""
        with self.lock:
            states = [*self.pods.values(), *self.deleted.values()]
            counted = sum(s.max_restarts for s in states)
            return counted + sum(len(uids) - 1 for uids in self.uids.values())

    def seen(self) -> list[PodState]:
        """Every pod seen: those that exist and the last state of those deleted since."""
        with self.lock:
            return [*self.pods.values(), *self.deleted.values()]

    # -- the watch -----------------------------------------------------------------------------

    def _watch(self) -> None:
        watch = ResumableWatch(
            self.clients.core.list_namespaced_pod,
            (self.namespace,),
            {"label_selector": f"{self.api.pod_job_label}={self.job_name}"},
            self.logs.note,
            "pod",
        )
        while not self.stop.is_set():
            try:
                for kind, pod in watch.events(max(1, int(self.poll_interval_s))):
                    self.on_pod(kind, pod)
                    if self.stop.is_set():
                        break
            except Exception as exc:  # noqa: BLE001 - keep following; the main loop decides
                if not self.stop.is_set():
                    self.logs.note(f"pod watch interrupted ({exc}); retrying")
                    self.stop.wait(self.poll_interval_s)

    def on_pod(self, kind: str, pod: Any) -> None:
        """Record a pod event; start streaming its log once its container started."""
        name = pod.metadata.name
        with self.lock:
            if kind == "DELETED":
                gone = self.pods.pop(name, None)
                if gone is not None:
                    self.deleted[f"{name}/{pod.metadata.uid}"] = gone
                return
            replica = self.api.replica_of(pod)
            self.uids.setdefault(replica, set()).add(pod.metadata.uid or name)
            state = self.pods.get(name)
            if state is None or state.pod.metadata.uid != pod.metadata.uid:
                # New, or recreated under the same name (the Training Operator does that).
                state = self.pods[name] = PodState(pod=pod, first_seen=time.monotonic())
            state.pod = pod
            status = container_status(pod, self.api.container)
            restart_count = status.restart_count if status else 0
            state.max_restarts = max(state.max_restarts, restart_count or 0)
            if not started(pod, self.api.container):
                return
            if self.first_running_at is None:
                self.first_running_at = time.monotonic()
            if not state.follow_run(restart_count or 0):
                return
        threading.Thread(target=self._stream_log, args=(state, replica), daemon=True).start()

    # -- logs ----------------------------------------------------------------------------------

    def _stream_log(self, state: PodState, replica: str) -> None:
        """Follow one container run's log to its end; a stream that drops while the container
        runs is re-opened (skipping the lines already printed), up to MAX_STREAM_FAILURES."""
        name = state.pod.metadata.name
        reached_end = False
        try:
            response = self.clients.core.read_namespaced_pod_log(
                name,
                self.namespace,
                container=self.api.container,
                follow=True,
                _preload_content=False,
            )
            self._pump(response, replica, state)
            reached_end = True
        except Exception as exc:  # noqa: BLE001 - ApiException, urllib3 errors when a pod goes
            if not self.stop.is_set():
                self.logs.note(f"log stream of {replica} ended: {exc}")
        with self.lock:
            state.streaming = False
            if reached_end and not running(state.pod, self.api.container):
                state.run_complete = True
            else:
                state.stream_failures += 1
        if not state.run_complete:
            self.stop.wait(min(1.0, self.poll_interval_s))  # then re-open it
        with self.lock:
            # Not if the pod is gone, or was recreated under its name (a state of its own).
            current = self.pods.get(name) is state and not self.stop.is_set()
        if current:
            # The container may also have restarted while this stream was ending.
            self.on_pod("MODIFIED", state.pod)

    def _pump(self, response: Any, replica: str, state: PodState) -> None:
        skip = state.lines_printed
        buffer = b""
        for chunk in response.stream(amt=None, decode_content=False):
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                if skip:
                    skip -= 1
                    continue
                self.logs.line(replica, line.decode("utf-8", errors="replace"))
                state.lines_printed += 1
                state.stream_failures = 0
            if self.stop.is_set():
                break
        if buffer and not skip:
            self.logs.line(replica, buffer.decode("utf-8", errors="replace"))
            state.lines_printed += 1
        response.release_conn()
