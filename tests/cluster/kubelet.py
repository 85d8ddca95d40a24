"""The played kubelet: a Node, an HTTPS log endpoint, and pod status through the API.

The ``cluster`` planes have no real kubelet (one real node serves the tests marked ``node``:
tests/cluster/node.py); for them this plays one, the way a kubelet talks to the API
server: it registers a Node whose kubelet endpoint is its own HTTPS server on 127.0.0.1 (the API
server proxies ``pods/log`` there, as on a cluster), binds the pods it runs to that Node (what the
scheduler would do), patches their status (Running, terminated with an exit code, restarted,
waiting with a reason), posts Events, and finishes graceful deletions of its pods (SIGTERM → exit
143 → removed), as a kubelet does. Everything else — pods, Jobs, Services, conditions, garbage
collection — is the real controllers' work.

It stays where a real node here cannot do the scenario, or not in the suite's time:
GPU pods (``nvidia.com/gpu``: no device plugin or GPU on the node), pods of images the tests do
not build (a user's TensorFlow image of a TFJob, registry.example.com images), an exact order
of events between replicas (a crash of one while another logs, a preemption at a given line, a
log stream dropped and re-opened at a given point), phases held for minutes (pods Pending past
the watchdog's limit, a replica silent past its limit, a Kueue-suspended job), and a hundred
short scenarios of the launcher's logic that each take ~1 s played and ~30 s real. What the
played kubelet claims about a real one is checked on the real node: pods pulled and run as
UID 1000 under ``restricted``, staging in init containers, torchrun across pods through DNS,
exit codes 143/137/3 and the controllers' restarts, evictions, ErrImagePull, runAsNonRoot
refusals, ``pods/log`` through the API server (tests/launcher/test_real_node_jobs.py).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import re
import ssl
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any
from urllib.parse import parse_qs, urlparse

NODE_NAME = "test-kubelet"


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class ContainerLog:
    """One run of one container: its lines, and whether it has ended (a follow stops then)."""

    lines: list[str] = field(default_factory=list)
    ended: bool = False


class LogStore:
    """Every container run's log, by (namespace, pod, container); waiters are woken on change."""

    def __init__(self) -> None:
        self.runs: dict[tuple[str, str, str], list[ContainerLog]] = {}
        self.drops: dict[tuple[str, str, str], int] = {}
        """Per container: how many times its open follow streams were cut (a network drop)."""
        self.uids: dict[tuple[str, str], str] = {}
        """(namespace, pod name) → the uid whose logs ``runs`` holds."""
        self.changed = threading.Condition()

    def adopt(self, namespace: str, pod: str, uid: str) -> None:
        """A new pod under a name seen before (the Training Operator recreates pods under the
        same name) starts with no logs."""
        with self.changed:
            if self.uids.get((namespace, pod), uid) != uid:
                for key in [k for k in self.runs if k[:2] == (namespace, pod)]:
                    self.runs[key][-1].ended = True
                    del self.runs[key]
            self.uids[(namespace, pod)] = uid
            self.changed.notify_all()

    def current(self, key: tuple[str, str, str]) -> ContainerLog:
        runs = self.runs.setdefault(key, [])
        if not runs:
            runs.append(ContainerLog())
        return runs[-1]

    def new_run(self, key: tuple[str, str, str]) -> None:
        with self.changed:
            runs = self.runs.setdefault(key, [])
            if runs:
                runs[-1].ended = True
            runs.append(ContainerLog())
            self.changed.notify_all()

    def write(self, key: tuple[str, str, str], line: str) -> None:
        with self.changed:
            self.current(key).lines.append(line)
            self.changed.notify_all()

    def drop(self, key: tuple[str, str, str]) -> None:
        """Cut the open follow streams of ``key`` (the container keeps running)."""
        with self.changed:
            self.drops[key] = self.drops.get(key, 0) + 1
            self.changed.notify_all()

    def end(self, key: tuple[str, str, str]) -> None:
        with self.changed:
            if key in self.runs:
                self.runs[key][-1].ended = True
            self.changed.notify_all()

    def end_pod(self, namespace: str, pod: str) -> None:
        with self.changed:
            for key, runs in self.runs.items():
                if key[:2] == (namespace, pod):
                    runs[-1].ended = True
            self.changed.notify_all()


LOG_PATH = re.compile(r"^/containerLogs/(?P<ns>[^/]+)/(?P<pod>[^/]+)/(?P<container>[^/]+)$")


class LogHandler(BaseHTTPRequestHandler):
    """``GET /containerLogs/NS/POD/CONTAINER`` (follow, tailLines, previous), as a kubelet."""

    store: LogStore
    requests: list[str]

    def log_message(self, *args: object) -> None:  # quiet
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        url = urlparse(self.path)
        self.requests.append(self.path)
        match = LOG_PATH.match(url.path)
        if not match:
            self.send_error(404)
            return
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        key = (match["ns"], match["pod"], match["container"])
        run = self._run(key, query)
        with self.store.changed:
            lines = list(run.lines)
            drops = self.store.drops.get(key, 0)
        if "tailLines" in query:
            tail = int(query["tailLines"])
            lines = lines[-tail:] if tail else []
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        try:
            self._write(lines)
            if query.get("follow") == "true":
                self._follow(key, run, len(lines), drops)
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
            pass

    def _run(self, key: tuple[str, str, str], query: dict[str, str]) -> ContainerLog:
        """The container run asked for: the current one, or the one before (``previous``)."""
        with self.store.changed:
            runs = self.store.runs.get(key) or [ContainerLog()]
            return runs[-2] if query.get("previous") == "true" and len(runs) > 1 else runs[-1]

    def _write(self, lines: list[str]) -> None:
        if lines:
            self.wfile.write("".join(f"{line}\n" for line in lines).encode())
            self.wfile.flush()

    def _follow(self, key: tuple[str, str, str], run: ContainerLog, sent: int, drops: int) -> None:
        """Stream new lines as they are written, until the container run ends (or the
        connection is cut by ``LogStore.drop``)."""
        store = self.store
        while True:
            with store.changed:
                while len(run.lines) == sent and not run.ended and store.drops.get(key, 0) == drops:
                    store.changed.wait(0.5)
                if store.drops.get(key, 0) != drops:
                    return
                fresh, ended = run.lines[sent:], run.ended
            sent += len(fresh)
            self._write(fresh)
            if ended and not fresh:
                return


FRESH_WATCH_EVERY = 12
"""Of the played kubelet's 5-s pod watches, one in this many lists every pod again (once a
minute)."""


class FakeKubelet:
    """The kubelet of one Node of a ``ControlPlane`` (``start()``/``stop()``; one per plane)."""

    def __init__(self, plane: Any, node_name: str = NODE_NAME):
        from kubernetes import client

        self.plane = plane
        self.node_name = node_name
        self.api = plane.admin_client()
        self.core = client.CoreV1Api(self.api)
        self.logs = LogStore()
        self.log_requests: list[str] = []
        """Paths the API server asked this kubelet for (a test sees logs went through it)."""
        self._stop = threading.Event()
        self._server: ThreadingHTTPServer | None = None

    # -- start / stop --------------------------------------------------------------------------

    def start(self) -> FakeKubelet:
        folder = self.plane.folder / "kubelet"
        self.plane.ca.server("kubelet").write(folder)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(folder / "tls.crt", folder / "tls.key")
        handler = type(
            "Handler", (LogHandler,), {"store": self.logs, "requests": self.log_requests}
        )
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        server.daemon_threads = True
        server.socket = context.wrap_socket(server.socket, server_side=True)
        self._server = server
        threading.Thread(target=server.serve_forever, name="kubelet-logs", daemon=True).start()
        self._register_node(server.server_address[1])
        threading.Thread(
            target=self._finish_deletions, name="kubelet-deletions", daemon=True
        ).start()
        return self

    def stop(self) -> None:
        self._stop.set()
        with self.logs.changed:
            for runs in self.logs.runs.values():
                runs[-1].ended = True
            self.logs.changed.notify_all()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def _register_node(self, port: int) -> None:
        from kubernetes.client.rest import ApiException

        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.node_name,
                "labels": {"kubernetes.io/hostname": self.node_name},
            },
        }
        with contextlib.suppress(ApiException):
            self.core.create_node(node)
        status = {
            "status": {
                "addresses": [
                    {"type": "InternalIP", "address": "127.0.0.1"},
                    {"type": "Hostname", "address": self.node_name},
                ],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": port}},
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": "test kubelet",
                        "lastHeartbeatTime": _now(),
                        "lastTransitionTime": _now(),
                    }
                ],
                "capacity": {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "8"},
                "allocatable": {
                    "cpu": "64",
                    "memory": "512Gi",
                    "pods": "110",
                    "nvidia.com/gpu": "8",
                },
            }
        }
        self.core.patch_node_status(self.node_name, status)

    # -- pods ----------------------------------------------------------------------------------

    def pods(self, namespace: str, selector: str = "") -> list[Any]:
        """The pods of ``namespace`` matching ``selector``, by name."""
        pods = self.core.list_namespaced_pod(namespace, label_selector=selector).items
        return sorted(pods, key=lambda p: p.metadata.name)

    def wait_for_pods(
        self, namespace: str, selector: str = "", count: int = 1, timeout: float = 30.0
    ) -> list[Any]:
        """Wait until ``count`` live pods match (pods being deleted do not count)."""
        deadline = time.monotonic() + timeout
        while True:
            pods = [p for p in self.pods(namespace, selector) if not p.metadata.deletion_timestamp]
            if len(pods) >= count:
                return pods
            if time.monotonic() > deadline:
                names = [p.metadata.name for p in pods]
                raise TimeoutError(
                    f"{count} pods matching {selector!r} in {namespace} not created within "
                    f"{timeout:g} s (have {names})"
                )
            time.sleep(0.1)

    def bind(self, pod: Any) -> None:
        """Put ``pod`` on this Node, as the scheduler does (a Binding)."""
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        if pod.spec.node_name:
            return
        binding = client.V1Binding(
            metadata=client.V1ObjectMeta(name=pod.metadata.name),
            target=client.V1ObjectReference(kind="Node", name=self.node_name, api_version="v1"),
        )
        try:
            self.core.create_namespaced_pod_binding(
                pod.metadata.name, pod.metadata.namespace, binding, _preload_content=False
            )
        except ApiException as exc:
            if exc.status != 409:  # 409: bound already (``pod`` is an older copy)
                raise

    def _patch_status(self, pod: Any, status: dict[str, Any]) -> Any:
        return self.core.patch_namespaced_pod_status(
            pod.metadata.name, pod.metadata.namespace, {"status": status}
        )

    def _containers(self, pod: Any) -> list[Any]:
        return list(pod.spec.containers)

    def _init_statuses(self, pod: Any) -> list[dict[str, Any]]:
        """Every init container ran and exited 0."""
        return [
            {
                "name": c.name,
                "image": c.image,
                "imageID": "",
                "ready": True,
                "restartCount": 0,
                "state": {
                    "terminated": {
                        "exitCode": 0,
                        "reason": "Completed",
                        "startedAt": _now(),
                        "finishedAt": _now(),
                    }
                },
            }
            for c in pod.spec.init_containers or []
        ]

    def _status(
        self,
        pod: Any,
        phase: str,
        state: dict[str, Any],
        *,
        restarts: int = 0,
        last_state: dict[str, Any] | None = None,
        ready: bool = False,
    ) -> dict[str, Any]:
        containers = [
            {
                "name": c.name,
                "image": c.image,
                "imageID": "",
                "ready": ready,
                "started": "running" in state,
                "restartCount": restarts,
                "state": state,
                "lastState": last_state or {},
                **({"containerID": f"containerd://{uuid.uuid4().hex}"} if state else {}),
            }
            for c in self._containers(pod)
        ]
        return {
            "phase": phase,
            "hostIP": "127.0.0.1",
            "podIP": "10.244.0.10",
            "podIPs": [{"ip": "10.244.0.10"}],
            "startTime": _now(),
            "initContainerStatuses": self._init_statuses(pod),
            "containerStatuses": containers,
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": _now()},
                {"type": "Initialized", "status": "True", "lastTransitionTime": _now()},
                {"type": "Ready", "status": str(ready), "lastTransitionTime": _now()},
            ],
        }

    def run(self, pod: Any, *, restarts: int = 0, last_exit: int | None = None) -> Any:
        """Start ``pod``'s containers (bound to this Node first): phase Running.

        ``restarts``/``last_exit``: the kubelet restarted the container that many times, the last
        run having exited with ``last_exit``.
        """
        self.bind(pod)
        self.logs.adopt(pod.metadata.namespace, pod.metadata.name, pod.metadata.uid)
        for container in self._containers(pod):
            key = (pod.metadata.namespace, pod.metadata.name, container.name)
            if restarts:
                self.logs.new_run(key)
            else:
                self.logs.current(key)
        last = None
        if last_exit is not None:
            last = {"terminated": {"exitCode": last_exit, "reason": "Error", "finishedAt": _now()}}
        state = {"running": {"startedAt": _now()}}
        return self._patch_status(
            pod, self._status(pod, "Running", state, restarts=restarts, last_state=last, ready=True)
        )

    def log(self, pod: Any, line: str, container: str | None = None) -> None:
        """``line`` written by the pod's (first) container."""
        name = container or self._containers(pod)[0].name
        self.logs.write((pod.metadata.namespace, pod.metadata.name, name), line)

    def drop_log_streams(self, pod: Any, container: str | None = None) -> None:
        """Cut the pod's open log streams, as a network or API server hiccup does."""
        name = container or self._containers(pod)[0].name
        self.logs.drop((pod.metadata.namespace, pod.metadata.name, name))

    def exit(self, pod: Any, code: int = 0, *, reason: str | None = None, restarts: int = 0) -> Any:
        """The containers exit with ``code``: the pod Succeeded (0) or Failed (otherwise), as under
        ``restartPolicy: Never``; with OnFailure the kubelet would restart it (see ``restart``)."""
        self.bind(pod)
        reason = reason or ("Completed" if code == 0 else "Error")
        state = {
            "terminated": {
                "exitCode": code,
                "reason": reason,
                "startedAt": _now(),
                "finishedAt": _now(),
            }
        }
        for container in self._containers(pod):
            self.logs.end((pod.metadata.namespace, pod.metadata.name, container.name))
        phase = "Succeeded" if code == 0 else "Failed"
        return self._patch_status(pod, self._status(pod, phase, state, restarts=restarts))

    def crash(self, pod: Any, code: int, *, restarts: int = 1, reason: str = "Error") -> Any:
        """``restartPolicy: OnFailure``: the container exited with ``code`` and waits to be
        restarted (CrashLoopBackOff); the pod stays Running."""
        for container in self._containers(pod):
            self.logs.end((pod.metadata.namespace, pod.metadata.name, container.name))
        last = {"terminated": {"exitCode": code, "reason": reason, "finishedAt": _now()}}
        waiting = {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off restarting"}}
        return self._patch_status(
            pod, self._status(pod, "Running", waiting, restarts=restarts, last_state=last)
        )

    def waiting(self, pod: Any, reason: str, message: str) -> Any:
        """The containers cannot start (ImagePullBackOff, CreateContainerConfigError…)."""
        self.bind(pod)
        state = {"waiting": {"reason": reason, "message": message}}
        return self._patch_status(pod, self._status(pod, "Pending", state))

    def event(
        self, obj: Any, reason: str, message: str, *, kind: str = "Pod", type_: str = "Warning"
    ) -> None:
        """An Event about ``obj`` (a pod by default), as the kubelet or scheduler posts it."""
        meta = obj.metadata
        self.core.create_namespaced_event(
            meta.namespace,
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"generateName": f"{meta.name}.", "namespace": meta.namespace},
                "involvedObject": {
                    "kind": kind,
                    "apiVersion": "v1",
                    "name": meta.name,
                    "namespace": meta.namespace,
                    "uid": meta.uid,
                },
                "reason": reason,
                "message": message,
                "type": type_,
                "firstTimestamp": _now(),
                "lastTimestamp": _now(),
                "count": 1,
                "source": {"component": "kubelet", "host": self.node_name},
                "reportingComponent": "kubelet",
                "reportingInstance": self.node_name,
            },
        )

    def delete(self, pod: Any) -> None:
        """Evict/preempt ``pod``: a graceful delete (the kubelet then finishes it)."""
        from kubernetes.client.rest import ApiException

        with contextlib.suppress(ApiException):
            self.core.delete_namespaced_pod(pod.metadata.name, pod.metadata.namespace)

    # -- graceful deletion ---------------------------------------------------------------------

    def _finish_deletions(self) -> None:
        """A pod of this Node being deleted: its containers get SIGTERM and exit 143, then the
        kubelet removes it (grace period 0), as a kubelet does once they stopped."""
        from kubernetes import watch

        # A watch goes on from the last one's resource version: one without starts with an ADDED
        # event for every pod of the node (measured: the busiest loop of the suite's own
        # processes when every watch, each 5 s, started afresh). Every FRESH_WATCH_EVERY-th
        # starts afresh all the same: a pod whose finish failed is retried. Each event's pod
        # stays the API server's JSON (:meth:`_pods_of_this_node`); only a pod being deleted is
        # decoded into a V1Pod.
        version: str | None = None
        watches = 0
        while not self._stop.is_set():
            watches += 1
            if watches % FRESH_WATCH_EVERY == 0:
                version = None
            stream = watch.Watch()
            try:
                for event in stream.stream(
                    self._pods_of_this_node,
                    timeout_seconds=5,
                    **({"resource_version": version} if version else {}),
                ):
                    metadata = event["object"].get("metadata") or {}
                    version = metadata.get("resourceVersion") or version
                    if event["type"] != "DELETED" and metadata.get("deletionTimestamp"):
                        self._finish(self._decoded_pod(event["object"]))
                    if self._stop.is_set():
                        stream.stop()
            except Exception:  # noqa: BLE001 - keep playing the kubelet until stopped
                version = None  # expired (410) or failed: start afresh, with every pod
                self._stop.wait(0.5)

    def _pods_of_this_node(self, **kwargs: Any) -> Any:
        """The pods of this node (``list_pod_for_all_namespaces``). A kubernetes ``Watch``
        decodes each event's object into the model its function's docstring names as the
        return type; this one names none, so the events carry the JSON as dicts. Decoding every
        event into a V1Pod (~2 ms of CPU for a job's pod: ~60 nested models, each making a
        client Configuration) was the played kubelet's busiest work: the pods' status patches
        alone bring an event each."""
        return self.core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={self.node_name}", **kwargs
        )

    def _decoded_pod(self, pod: dict[str, Any]) -> Any:
        """The V1Pod of the API server's JSON ``pod``."""
        # As the Watch itself decodes an event: a response-like object whose ``data`` is JSON.
        return self.api.deserialize(SimpleNamespace(data=json.dumps(pod)), "V1Pod")

    def _finish(self, pod: Any) -> None:
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        self.logs.end_pod(pod.metadata.namespace, pod.metadata.name)
        with contextlib.suppress(ApiException):
            if pod.status.phase not in ("Succeeded", "Failed"):
                self._stop_containers(pod)
            self.core.delete_namespaced_pod(
                pod.metadata.name,
                pod.metadata.namespace,
                body=client.V1DeleteOptions(
                    grace_period_seconds=0,
                    preconditions=client.V1Preconditions(uid=pod.metadata.uid),
                ),
            )

    def _stop_containers(self, pod: Any) -> None:
        """SIGTERM: running containers exit 143; restart counts and last states stay."""
        statuses = self.api.sanitize_for_serialization(pod.status.container_statuses or [])
        for status in statuses:
            if "running" in (status.get("state") or {}):
                status["state"] = {
                    "terminated": {"exitCode": 143, "reason": "Error", "finishedAt": _now()}
                }
                status["ready"] = False
        self._patch_status(pod, {"phase": "Failed", "containerStatuses": statuses})
