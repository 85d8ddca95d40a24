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


@dataclass
class PodState:
    """What the follower knows about one pod."""

    pod: Any
    first_seen: float
    streamed_restart_count: int | None = None
    streaming: bool = False
    max_restarts: int = 0


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

    def start(self) -> None:
        threading.Thread(target=self._watch, name="pod-watch", daemon=True).start()

    def snapshot(self) -> list[PodState]:
        with self.lock:
            return list(self.pods.values())

    def restarts(self) -> int:
        """Container restarts plus pods recreated by the controller."""
        with self.lock:
            counted = sum(s.max_restarts for s in self.pods.values())
            return counted + sum(len(uids) - 1 for uids in self.uids.values())

    # -- the watch -----------------------------------------------------------------------------

    def _watch(self) -> None:
        from kubernetes import watch

        selector = f"{self.api.pod_job_label}={self.job_name}"
        while not self.stop.is_set():
            try:
                stream = watch.Watch()
                for event in stream.stream(
                    self.clients.core.list_namespaced_pod,
                    self.namespace,
                    label_selector=selector,
                    timeout_seconds=max(1, int(self.poll_interval_s)),
                ):
                    self.on_pod(event["type"], event["object"])
                    if self.stop.is_set():
                        stream.stop()
            except Exception as exc:  # noqa: BLE001 - keep following; the main loop decides
                if not self.stop.is_set():
                    self.logs.note(f"pod watch interrupted ({exc}); retrying")
                    self.stop.wait(self.poll_interval_s)

    def on_pod(self, kind: str, pod: Any) -> None:
        """Record a pod event; start streaming its log once its container started."""
        name = pod.metadata.name
        with self.lock:
            if kind == "DELETED":
                self.pods.pop(name, None)
                return
            replica = self.api.replica_of(pod)
            self.uids.setdefault(replica, set()).add(pod.metadata.uid or name)
            state = self.pods.get(name)
            if state is None:
                state = self.pods[name] = PodState(pod=pod, first_seen=time.monotonic())
            state.pod = pod
            status = container_status(pod, self.api.container)
            restart_count = status.restart_count if status else 0
            state.max_restarts = max(state.max_restarts, restart_count or 0)
            if not started(pod, self.api.container):
                return
            if self.first_running_at is None:
                self.first_running_at = time.monotonic()
            if state.streaming or state.streamed_restart_count == restart_count:
                return
            state.streaming = True
            state.streamed_restart_count = restart_count
        threading.Thread(target=self._stream_log, args=(name, replica), daemon=True).start()

    # -- logs ----------------------------------------------------------------------------------

    def _stream_log(self, pod_name: str, replica: str) -> None:
        try:
            response = self.clients.core.read_namespaced_pod_log(
                pod_name,
                self.namespace,
                container=self.api.container,
                follow=True,
                _preload_content=False,
            )
            self._pump(response, replica)
        except Exception as exc:  # noqa: BLE001 - ApiException, urllib3 errors when a pod goes
            if not self.stop.is_set():
                self.logs.note(f"log stream of {replica} ended: {exc}")
        finally:
            with self.lock:
                state = self.pods.get(pod_name)
                if state is not None:
                    state.streaming = False
            if state is not None and not self.stop.is_set():
                # The container may have restarted while this stream was ending.
                self.on_pod("MODIFIED", state.pod)

    def _pump(self, response: Any, replica: str) -> None:
        buffer = b""
        for chunk in response.stream(amt=None, decode_content=False):
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                self.logs.line(replica, line.decode("utf-8", errors="replace"))
            if self.stop.is_set():
                break
        if buffer:
            self.logs.line(replica, buffer.decode("utf-8", errors="replace"))
        response.release_conn()
