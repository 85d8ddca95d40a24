"""A stand-in Kubernetes API server on 127.0.0.1 for the launcher's tests (no cluster exists here).

Serves what the kubernetes backend calls, with real API JSON shapes, so the real ``kubernetes``
client and kubeflow-training's ``TrainingClient`` talk to it unchanged: API discovery of
kubeflow.org/v1, SelfSubjectAccessReview, namespace get, pytorchjobs create/get/list/watch/delete,
pods get/list/watch, pod logs (with follow), events list. Watches follow Kubernetes semantics: a
watch without resourceVersion first replays the current objects as ADDED, then streams changes
until ``timeoutSeconds``. The Training Operator is simulated by a scenario function the test
passes: it runs in a thread once the job is created and drives pods, logs and conditions through
``Operator``'s helpers. Every request is recorded as (API group, resource, verb) for RBAC checks.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
import threading
import time
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

from components.pytorchjob.manifest import admission_errors

Scenario = Callable[["Operator"], None]
JOBS = "/apis/kubeflow.org/v1/namespaces/(?P<ns>[^/]+)/pytorchjobs"
PODS = "/api/v1/namespaces/(?P<ns>[^/]+)/pods"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def _matches(obj: dict[str, Any], query: dict[str, str]) -> bool:
    meta = obj["metadata"]
    for sel in filter(None, query.get("fieldSelector", "").split(",")):
        key, _, value = sel.partition("=")
        if key == "metadata.name" and meta["name"] != value:
            return False
        if key == "involvedObject.name" and obj.get("involvedObject", {}).get("name") != value:
            return False
    labels = meta.get("labels") or {}
    for sel in filter(None, query.get("labelSelector", "").split(",")):
        key, _, value = sel.partition("=")
        if labels.get(key) != value:
            return False
    return True


class FakeKubeAPI:
    """The server: ``with FakeKubeAPI(scenario=...) as api:`` → ``api.url``, ``configuration()``.

    Started and stopped by the test, on a free port of 127.0.0.1.
    """

    def __init__(
        self,
        *,
        scenario: Scenario | None = None,
        crd_installed: bool = True,
        denied: set[tuple[str, str]] = frozenset(),
        namespaces: tuple[str, ...] = ("default", "ml"),
        namespace_forbidden: bool = False,
    ):
        self.scenario = scenario
        self.crd_installed = crd_installed
        self.denied = set(denied)  # (verb, resource) pairs SSAR answers "no" to
        self.namespaces = set(namespaces)
        self.namespace_forbidden = namespace_forbidden
        self.objects: dict[str, dict[tuple[str, str], dict[str, Any]]] = {"jobs": {}, "pods": {}}
        self.history: list[tuple[int, str, str, dict[str, Any]]] = []
        self.logs: dict[tuple[str, str], list[str]] = {}
        self.logs_closed: set[tuple[str, str]] = set()
        self.events: list[dict[str, Any]] = []
        self.calls: set[tuple[str, str, str]] = set()
        self.created: list[str] = []
        self.deleted: list[str] = []
        self.rejected: list[str] = []
        self.scenario_errors: list[BaseException] = []
        self.cond = threading.Condition()
        self.rv = itertools.count(1)
        self.stopping = False
        self.httpd: ThreadingHTTPServer | None = None

    # -- lifecycle -----------------------------------------------------------------------------

    def __enter__(self) -> FakeKubeAPI:
        api = self

        class Handler(_Handler):
            server_api = api

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        assert self.httpd is not None
        self.httpd.shutdown()
        self.httpd.server_close()

    @property
    def url(self) -> str:
        assert self.httpd is not None
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def configuration(self):
        from kubernetes import client

        cfg = client.Configuration()
        cfg.host = self.url
        return cfg

    # -- store ---------------------------------------------------------------------------------

    def put(self, kind: str, obj: dict[str, Any], event: str) -> dict[str, Any]:
        with self.cond:
            rv = next(self.rv)
            obj["metadata"]["resourceVersion"] = str(rv)
            key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
            if event == "DELETED":
                self.objects[kind].pop(key, None)
            else:
                self.objects[kind][key] = obj
            self.history.append((rv, kind, event, copy.deepcopy(obj)))
            self.cond.notify_all()
        return obj

    def get(self, kind: str, ns: str, name: str) -> dict[str, Any] | None:
        with self.cond:
            obj = self.objects[kind].get((ns, name))
            return copy.deepcopy(obj) if obj else None

    def job(self, name: str, ns: str = "default") -> dict[str, Any] | None:
        return self.get("jobs", ns, name)

    def delete_job(self, ns: str, name: str) -> bool:
        job = self.get("jobs", ns, name)
        if job is None:
            return False
        self.deleted.append(name)
        self.put("jobs", job, "DELETED")
        with self.cond:
            pods = [p for (pns, _), p in self.objects["pods"].items() if pns == ns]
        for pod in pods:
            if pod["metadata"]["labels"].get("training.kubeflow.org/job-name") == name:
                self.put("pods", copy.deepcopy(pod), "DELETED")
                self.close_log(ns, pod["metadata"]["name"])
        return True

    def close_log(self, ns: str, pod: str) -> None:
        with self.cond:
            self.logs_closed.add((ns, pod))
            self.cond.notify_all()

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError("fake API server: condition not reached in time")
            time.sleep(0.05)

    def _start_scenario(self, job: dict[str, Any]) -> None:
        if self.scenario is None:
            return
        op = Operator(self, job["metadata"]["namespace"], job["metadata"]["name"])

        def run() -> None:
            try:
                self.scenario(op)
            except op.Gone:
                pass
            except BaseException as exc:  # surfaced by the test through scenario_errors
                self.scenario_errors.append(exc)

        threading.Thread(target=run, daemon=True).start()


class Operator:
    """What a scenario uses to play the Training Operator (and the kubelet) for one job."""

    class Gone(Exception):
        """The job was deleted: the scenario stops."""

    def __init__(self, api: FakeKubeAPI, ns: str, name: str):
        self.api, self.ns, self.name = api, ns, name

    def _job(self) -> dict[str, Any]:
        job = self.api.get("jobs", self.ns, self.name)
        if job is None:
            raise self.Gone
        return job

    def condition(self, ctype: str, reason: str = "", message: str = "") -> None:
        job = self._job()
        status = job.setdefault("status", {})
        conds = [c for c in status.get("conditions", []) if c["type"] != ctype]
        for c in conds:
            if ctype in ("Running", "Succeeded", "Failed", "Restarting"):
                c["status"] = "False" if c["type"] in ("Running", "Restarting") else c["status"]
        conds.append(
            {
                "type": ctype,
                "status": "True",
                "reason": reason or f"PyTorchJob{ctype}",
                "message": message or f"PyTorchJob {self.name} is {ctype.lower()}.",
                "lastTransitionTime": _now(),
                "lastUpdateTime": _now(),
            }
        )
        status["conditions"] = conds
        self.api.put("jobs", job, "MODIFIED")

    def pod_name(self, rtype: str, index: int) -> str:
        return f"{self.name}-{rtype.lower()}-{index}"

    def add_pod(self, rtype: str, index: int) -> str:
        self._job()
        name = self.pod_name(rtype, index)
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": self.ns,
                "uid": str(uuid.uuid4()),
                "creationTimestamp": _now(),
                "labels": {
                    "training.kubeflow.org/job-name": self.name,
                    "training.kubeflow.org/replica-type": rtype.lower(),
                    "training.kubeflow.org/replica-index": str(index),
                    "training.kubeflow.org/operator-name": "pytorchjob-controller",
                },
            },
            "spec": {"containers": [{"name": "pytorch", "image": "img"}]},
            "status": {"phase": "Pending", "conditions": []},
        }
        with self.api.cond:  # a new pod (also a recreated one) starts with an empty log
            self.api.logs[(self.ns, name)] = []
            self.api.logs_closed.discard((self.ns, name))
        self.api.put("pods", pod, "ADDED")
        return name

    def delete_pod(self, name: str) -> None:
        """The operator deletes a failed pod (ExitCode policy) to create it again."""
        self.api.put("pods", self._pod(name), "DELETED")
        self.api.close_log(self.ns, name)

    def _pod(self, name: str) -> dict[str, Any]:
        pod = self.api.get("pods", self.ns, name)
        if pod is None:
            raise self.Gone
        return pod

    def _container(self, ready: bool, state: dict, restarts: int = 0, last: dict | None = None):
        return {
            "name": "pytorch",
            "image": "img",
            "imageID": "",
            "ready": ready,
            "restartCount": restarts,
            "state": state,
            "lastState": last or {},
        }

    def unschedulable(self, name: str, message: str) -> None:
        pod = self._pod(name)
        pod["status"]["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": message,
            }
        ]
        self.api.put("pods", pod, "MODIFIED")
        self.event(name, "FailedScheduling", message)

    def waiting(self, name: str, reason: str, message: str = "") -> None:
        pod = self._pod(name)
        pod["status"]["containerStatuses"] = [
            self._container(False, {"waiting": {"reason": reason, "message": message}})
        ]
        self.api.put("pods", pod, "MODIFIED")

    def running(self, name: str, restarts: int = 0) -> None:
        pod = self._pod(name)
        pod["status"]["phase"] = "Running"
        pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "True"}]
        pod["status"]["containerStatuses"] = [
            self._container(True, {"running": {"startedAt": _now()}}, restarts)
        ]
        self.api.put("pods", pod, "MODIFIED")

    def log(self, name: str, *lines: str) -> None:
        self._pod(name)
        with self.api.cond:
            self.api.logs[(self.ns, name)].extend(lines)
            self.api.cond.notify_all()

    def terminate(self, name: str, exit_code: int = 0, reason: str = "Completed") -> None:
        pod = self._pod(name)
        pod["status"]["phase"] = "Succeeded" if exit_code == 0 else "Failed"
        term = {"exitCode": exit_code, "reason": reason, "finishedAt": _now()}
        restarts = max(
            [c["restartCount"] for c in pod["status"].get("containerStatuses", [])] or [0]
        )
        pod["status"]["containerStatuses"] = [
            self._container(False, {"terminated": term}, restarts)
        ]
        self.api.put("pods", pod, "MODIFIED")
        self.api.close_log(self.ns, name)

    def event(self, pod: str, reason: str, message: str, etype: str = "Warning") -> None:
        self.api.events.append(
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": f"{pod}.{uuid.uuid4().hex[:8]}", "namespace": self.ns},
                "involvedObject": {"kind": "Pod", "name": pod, "namespace": self.ns},
                "reason": reason,
                "message": message,
                "type": etype,
            }
        )

    def sleep(self, seconds: float) -> None:
        """Sleep, but stop the scenario as soon as the job is deleted."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self._job()
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))


class _Handler(BaseHTTPRequestHandler):
    server_api: FakeKubeAPI
    protocol_version = "HTTP/1.1"  # streams are chunked, like the real API server's

    def log_message(self, *args: Any) -> None:  # keep pytest output clean
        pass

    # -- plumbing ------------------------------------------------------------------------------

    def _send(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)
        self.close_connection = True

    def _start_stream(self, content_type: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length) or b"{}")

    def _route(self, method: str) -> None:
        api = self.server_api
        url = urlparse(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        path = url.path
        watch = query.get("watch", "").lower() == "true"
        try:
            if path == "/apis/kubeflow.org/v1":
                return self._discovery()
            if path == "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews":
                api.calls.add(("authorization.k8s.io", "selfsubjectaccessreviews", "create"))
                return self._ssar(self._body())
            if m := re.fullmatch(r"/api/v1/namespaces/(?P<ns>[^/]+)", path):
                api.calls.add(("", "namespaces", "get"))
                return self._namespace(m["ns"])
            if m := re.fullmatch(JOBS, path):
                if method == "POST":
                    api.calls.add(("kubeflow.org", "pytorchjobs", "create"))
                    return self._create_job(m["ns"], self._body())
                verb = "watch" if watch else "list"
                api.calls.add(("kubeflow.org", "pytorchjobs", verb))
                return self._list("jobs", m["ns"], query, watch, "PyTorchJobList")
            if m := re.fullmatch(JOBS + "/(?P<name>[^/]+)", path):
                if method == "DELETE":
                    api.calls.add(("kubeflow.org", "pytorchjobs", "delete"))
                    if api.delete_job(m["ns"], m["name"]):
                        return self._send(200, _status(200, "", "deleted") | {"status": "Success"})
                    return self._send(404, _status(404, "NotFound", "not found"))
                api.calls.add(("kubeflow.org", "pytorchjobs", "get"))
                return self._get("jobs", m["ns"], m["name"])
            if m := re.fullmatch(PODS, path):
                api.calls.add(("", "pods", "watch" if watch else "list"))
                return self._list("pods", m["ns"], query, watch, "PodList")
            if m := re.fullmatch(PODS + "/(?P<name>[^/]+)/log", path):
                api.calls.add(("", "pods/log", "get"))
                return self._log(m["ns"], m["name"], query)
            if m := re.fullmatch(PODS + "/(?P<name>[^/]+)", path):
                api.calls.add(("", "pods", "get"))
                return self._get("pods", m["ns"], m["name"])
            if m := re.fullmatch(r"/api/v1/namespaces/(?P<ns>[^/]+)/events", path):
                api.calls.add(("", "events", "list"))
                items = [e for e in api.events if _matches(e, query)]
                return self._send(200, {"kind": "EventList", "metadata": {}, "items": items})
            return self._send(404, _status(404, "NotFound", f"no route {method} {path}"))
        except (BrokenPipeError, ConnectionResetError):
            return None

    def do_GET(self) -> None:  # noqa: N802
        self._route("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._route("POST")

    def do_DELETE(self) -> None:  # noqa: N802
        self._route("DELETE")

    # -- endpoints -----------------------------------------------------------------------------

    def _discovery(self) -> None:
        if not self.server_api.crd_installed:
            return self._send(404, _status(404, "NotFound", "the server could not find it"))
        verbs = ["create", "delete", "get", "list", "patch", "update", "watch"]
        self._send(
            200,
            {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": "kubeflow.org/v1",
                "resources": [
                    {
                        "name": "pytorchjobs",
                        "singularName": "pytorchjob",
                        "namespaced": True,
                        "kind": "PyTorchJob",
                        "verbs": verbs,
                    }
                ],
            },
        )

    def _ssar(self, body: dict[str, Any]) -> None:
        attrs = body["spec"]["resourceAttributes"]
        resource = attrs["resource"] + (
            f"/{attrs['subresource']}" if attrs.get("subresource") else ""
        )
        allowed = (attrs["verb"], resource) not in self.server_api.denied
        body["status"] = {"allowed": allowed} | ({} if allowed else {"reason": "no RBAC rule"})
        self._send(201, body)

    def _namespace(self, ns: str) -> None:
        api = self.server_api
        if api.namespace_forbidden:
            return self._send(403, _status(403, "Forbidden", "cannot get namespaces"))
        if ns not in api.namespaces:
            return self._send(404, _status(404, "NotFound", f'namespaces "{ns}" not found'))
        self._send(200, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})

    def _create_job(self, ns: str, job: dict[str, Any]) -> None:
        api = self.server_api
        name = job["metadata"]["name"]
        if ns not in api.namespaces:
            return self._send(404, _status(404, "NotFound", f'namespaces "{ns}" not found'))
        errors = admission_errors(job)
        if errors:
            api.rejected.append(name)
            return self._send(422, _status(422, "Invalid", "; ".join(errors)))
        if api.get("jobs", ns, name) is not None:
            msg = f'pytorchjobs.kubeflow.org "{name}" already exists'
            return self._send(409, _status(409, "AlreadyExists", msg))
        job["metadata"] |= {"uid": str(uuid.uuid4()), "creationTimestamp": _now()}
        job["metadata"]["namespace"] = ns
        job["status"] = {}
        api.created.append(name)
        api.put("jobs", job, "ADDED")
        self._send(201, api.get("jobs", ns, name))
        api._start_scenario(job)

    def _get(self, kind: str, ns: str, name: str) -> None:
        obj = self.server_api.get(kind, ns, name)
        if obj is None:
            return self._send(404, _status(404, "NotFound", f'"{name}" not found'))
        self._send(200, obj)

    def _list(self, kind: str, ns: str, query: dict[str, str], watch: bool, list_kind: str):
        api = self.server_api
        with api.cond:
            items = [
                copy.deepcopy(o)
                for (ons, _), o in api.objects[kind].items()
                if ons == ns and _matches(o, query)
            ]
            last_rv = api.history[-1][0] if api.history else 0
        if not watch:
            meta = {"resourceVersion": str(last_rv)}
            return self._send(200, {"kind": list_kind, "metadata": meta, "items": items})
        self._start_stream("application/json")
        for obj in items:
            self._event("ADDED", obj)
        deadline = time.monotonic() + float(query.get("timeoutSeconds") or 30)
        seen = last_rv
        while True:
            with api.cond:
                while not api.stopping and time.monotonic() < deadline:
                    fresh = [h for h in api.history if h[0] > seen]
                    if fresh:
                        break
                    api.cond.wait(timeout=max(0.0, deadline - time.monotonic()))
                else:
                    self._chunk(b"")
                    return None
                fresh = [h for h in api.history if h[0] > seen]
            for rv, hkind, etype, obj in fresh:
                seen = rv
                if hkind == kind and obj["metadata"]["namespace"] == ns and _matches(obj, query):
                    self._event(etype, obj)

    def _event(self, etype: str, obj: dict[str, Any]) -> None:
        self._chunk(json.dumps({"type": etype, "object": obj}).encode() + b"\n")

    def _log(self, ns: str, pod: str, query: dict[str, str]) -> None:
        api = self.server_api
        if api.get("pods", ns, pod) is None:
            return self._send(404, _status(404, "NotFound", f'pods "{pod}" not found'))
        follow = query.get("follow", "").lower() == "true"
        if not follow:
            lines = list(api.logs.get((ns, pod), []))
            if query.get("tailLines"):
                lines = lines[-int(query["tailLines"]) :]
            data = "".join(line + "\n" for line in lines).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)
            self.close_connection = True
            return None
        self._start_stream("text/plain")
        sent = 0
        while True:
            with api.cond:
                while (
                    len(api.logs[(ns, pod)]) == sent
                    and (ns, pod) not in api.logs_closed
                    and not api.stopping
                ):
                    api.cond.wait(timeout=1.0)
                lines = api.logs[(ns, pod)][sent:]
                done = (ns, pod) in api.logs_closed or api.stopping
            if lines:
                self._chunk("".join(line + "\n" for line in lines).encode())
            sent += len(lines)
            if done:
                self._chunk(b"")
                return None
