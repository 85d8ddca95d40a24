"""A stand-in Kubernetes API server on 127.0.0.1 for the launcher's tests (no cluster exists here).

Serves what the kubernetes backend calls, with real API JSON shapes, so the real ``kubernetes``
client talks to it unchanged: API discovery of kubeflow.org/v1 and trainer.kubeflow.org/v1alpha1
(each job kind served or not, per test), SelfSubjectAccessReview, namespace get,
(Cluster)TrainingRuntime get, trainjobs, pytorchjobs and tfjobs create/get/list/watch/delete,
pods get/list/watch, pod logs (with follow), events list; Services and the Prometheus Operator's
PodMonitors, ServiceMonitors and PrometheusRules create/get/list (``monitoring``: whether their
CRDs are installed). A created job or monitoring object is checked against the official CRD of
its kind (strict, from ``../shared/reference``; HTTP 422 like the API server) — never against our
own validation code. Deleting a job deletes the objects whose ``ownerReferences`` name its uid,
as Kubernetes' garbage collector does.
Watches follow Kubernetes semantics: a watch without resourceVersion first replays the current
objects as ADDED, then streams changes until ``timeoutSeconds``. The controller (Kubeflow Trainer
or the Training Operator) is simulated by a scenario function the test passes: it runs in a thread
once the job is created and drives pods, logs and conditions through ``Operator``'s helpers.
Every request is recorded as (API group, resource, verb) for RBAC checks.
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

from tests.crds import schema_errors
from tests.launcher.fake_controller import KINDS, Kind, Operator, now

Scenario = Callable[["Operator"], None]
PODS = "/api/v1/namespaces/(?P<ns>[^/]+)/pods"
MONITORING = {
    "podmonitors": "PodMonitor",
    "servicemonitors": "ServiceMonitor",
    "prometheusrules": "PrometheusRule",
}
OWNED = ("services", *MONITORING)
"""Stores whose objects the garbage collector deletes with their owner job."""


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

    Started and stopped by the test, on a free port of 127.0.0.1. ``served``: the job APIs whose
    CRDs are installed; ``runtimes``: the ClusterTrainingRuntimes that exist.
    """

    def __init__(
        self,
        *,
        scenario: Scenario | None = None,
        served: tuple[str, ...] = ("trainjob", "pytorchjob", "tfjob"),
        runtimes: tuple[str, ...] = ("torch-distributed",),
        namespaced_runtimes: tuple[tuple[str, str], ...] = (),
        runtime_forbidden: bool = False,
        denied: set[tuple[str, str]] = frozenset(),
        namespaces: tuple[str, ...] = ("default", "ml"),
        namespace_forbidden: bool = False,
        monitoring: bool = True,
    ):
        self.scenario = scenario
        self.served = {KINDS[name] for name in served}
        self.runtimes = set(runtimes)
        self.namespaced_runtimes = set(namespaced_runtimes)
        self.runtime_forbidden = runtime_forbidden
        self.denied = set(denied)  # (verb, resource): SSAR says no, and job requests get 403
        self.namespaces = set(namespaces)
        self.namespace_forbidden = namespace_forbidden
        self.monitoring = monitoring  # the Prometheus Operator's CRDs are installed
        self.objects: dict[str, dict[tuple[str, str], dict[str, Any]]] = {
            "pods": {},
            **{kind.plural: {} for kind in KINDS.values()},
            **{store: {} for store in OWNED},
        }
        self.history: list[tuple[int, str, str, dict[str, Any]]] = []
        self.logs: dict[tuple[str, str], list[str]] = {}
        self.logs_closed: set[tuple[str, str]] = set()
        self.events: list[dict[str, Any]] = []
        self.calls: set[tuple[str, str, str]] = set()
        self.created: list[str] = []
        self.created_manifests: list[dict[str, Any]] = []
        """The request bodies of successful creates, as the client sent them."""
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

    def put(self, store: str, obj: dict[str, Any], event: str) -> dict[str, Any]:
        with self.cond:
            rv = next(self.rv)
            obj["metadata"]["resourceVersion"] = str(rv)
            key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
            if event == "DELETED":
                self.objects[store].pop(key, None)
            else:
                self.objects[store][key] = obj
            self.history.append((rv, store, event, copy.deepcopy(obj)))
            self.cond.notify_all()
        return obj

    def get(self, store: str, ns: str, name: str) -> dict[str, Any] | None:
        with self.cond:
            obj = self.objects[store].get((ns, name))
            return copy.deepcopy(obj) if obj else None

    def job(self, name: str, ns: str = "default") -> dict[str, Any] | None:
        """The job of that name, of whichever kind."""
        for kind in KINDS.values():
            found = self.get(kind.plural, ns, name)
            if found is not None:
                return found
        return None

    def delete_job(self, kind: Kind, ns: str, name: str) -> bool:
        job = self.get(kind.plural, ns, name)
        if job is None:
            return False
        self.deleted.append(name)
        self.put(kind.plural, job, "DELETED")
        with self.cond:
            pods = [p for (pns, _), p in self.objects["pods"].items() if pns == ns]
        for pod in pods:
            if (
                pod["metadata"].get("annotations", {}).get("stand-in/job")
                == f"{kind.plural}/{name}"
            ):
                self.put("pods", copy.deepcopy(pod), "DELETED")
                self.close_log(ns, pod["metadata"]["name"])
        self._collect_garbage(job["metadata"]["uid"])
        return True

    def _collect_garbage(self, owner_uid: str) -> None:
        """Delete what the job owned (Kubernetes' garbage collector, background propagation)."""
        for store in OWNED:
            with self.cond:
                owned = [
                    o
                    for o in self.objects[store].values()
                    if owner_uid in {r.get("uid") for r in o["metadata"].get("ownerReferences", [])}
                ]
            for obj in owned:
                self.put(store, copy.deepcopy(obj), "DELETED")

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

    def _start_scenario(self, kind: Kind, job: dict[str, Any]) -> None:
        if self.scenario is None:
            return
        op = Operator(self, kind, job["metadata"]["namespace"], job["metadata"]["name"])

        def run() -> None:
            try:
                self.scenario(op)
            except op.Gone:
                pass
            except BaseException as exc:  # surfaced by the test through scenario_errors
                self.scenario_errors.append(exc)

        threading.Thread(target=run, daemon=True).start()


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
        url = urlparse(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        try:
            routes = (self._route_apis, self._route_jobs, self._route_owned, self._route_core)
            for handler in routes:
                if handler(method, url.path, query):
                    return None
            return self._send(404, _status(404, "NotFound", f"no route {method} {url.path}"))
        except (BrokenPipeError, ConnectionResetError):
            return None

    def _route_apis(self, method: str, path: str, query: dict[str, str]) -> bool:
        """Discovery, access reviews, runtimes."""
        api = self.server_api
        if path in {f"/apis/{kind.group}/{kind.version}" for kind in KINDS.values()}:
            self._discovery(path.removeprefix("/apis/"))
            return True
        if path == "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews":
            api.calls.add(("authorization.k8s.io", "selfsubjectaccessreviews", "create"))
            self._ssar(self._body())
            return True
        runtimes = "/apis/trainer.kubeflow.org/v1alpha1"
        if m := re.fullmatch(runtimes + "/clustertrainingruntimes/(?P<name>[^/]+)", path):
            api.calls.add(("trainer.kubeflow.org", "clustertrainingruntimes", "get"))
            self._runtime(m["name"] in api.runtimes, "ClusterTrainingRuntime", m["name"])
            return True
        pattern = runtimes + "/namespaces/(?P<ns>[^/]+)/trainingruntimes/(?P<name>[^/]+)"
        if m := re.fullmatch(pattern, path):
            api.calls.add(("trainer.kubeflow.org", "trainingruntimes", "get"))
            found = (m["ns"], m["name"]) in api.namespaced_runtimes
            self._runtime(found, "TrainingRuntime", m["name"])
            return True
        return False

    def _route_jobs(self, method: str, path: str, query: dict[str, str]) -> bool:
        api = self.server_api
        watch = query.get("watch", "").lower() == "true"
        for kind in KINDS.values():
            if m := re.fullmatch(kind.jobs_path, path):
                verb = {"POST": "create"}.get(method, "watch" if watch else "list")
                if kind not in api.served:
                    self._send(404, _status(404, "NotFound", "the server could not find it"))
                elif (verb, kind.plural) in api.denied:
                    message = (
                        f'{kind.plural}.{kind.group} is forbidden: cannot {verb} "{kind.plural}"'
                    )
                    self._send(403, _status(403, "Forbidden", message))
                elif method == "POST":
                    api.calls.add((kind.group, kind.plural, "create"))
                    self._create_job(kind, m["ns"], self._body())
                else:
                    api.calls.add((kind.group, kind.plural, "watch" if watch else "list"))
                    self._list(kind.plural, m["ns"], query, watch, f"{kind.kind}List")
                return True
            if m := re.fullmatch(kind.jobs_path + "/(?P<name>[^/]+)", path):
                if method == "DELETE":
                    api.calls.add((kind.group, kind.plural, "delete"))
                    if api.delete_job(kind, m["ns"], m["name"]):
                        self._send(200, _status(200, "", "deleted") | {"status": "Success"})
                    else:
                        self._send(404, _status(404, "NotFound", "not found"))
                else:
                    api.calls.add((kind.group, kind.plural, "get"))
                    self._get(kind.plural, m["ns"], m["name"])
                return True
        return False

    def _route_owned(self, method: str, path: str, query: dict[str, str]) -> bool:
        """Services and the Prometheus Operator's kinds: create (get, list)."""
        api = self.server_api
        services = r"/api/v1/namespaces/(?P<ns>[^/]+)/(?P<store>services)"
        monitors = r"/apis/monitoring.coreos.com/v1/namespaces/(?P<ns>[^/]+)/(?P<store>[a-z]+)"
        m = re.fullmatch(services, path) or re.fullmatch(monitors, path)
        if m is None or (m["store"] not in OWNED):
            return False
        group = "" if m["store"] == "services" else "monitoring.coreos.com"
        verb = "create" if method == "POST" else "list"
        api.calls.add((group, m["store"], verb))
        if group and not api.monitoring:
            self._send(404, _status(404, "NotFound", "the server could not find the resource"))
        elif (verb, m["store"]) in api.denied:
            message = f'{m["store"]} is forbidden: cannot {verb} "{m["store"]}"'
            self._send(403, _status(403, "Forbidden", message))
        elif method == "POST":
            self._create_owned(m["store"], m["ns"], self._body())
        else:
            self._list(m["store"], m["ns"], query, False, "List")
        return True

    def _create_owned(self, store: str, ns: str, obj: dict[str, Any]) -> None:
        api = self.server_api
        name = obj["metadata"]["name"]
        if store in MONITORING:
            errors = schema_errors(MONITORING[store].lower(), obj)  # the official CRD
            if errors:
                api.rejected.append(name)
                return self._send(422, _status(422, "Invalid", "; ".join(errors)))
        if api.get(store, ns, name) is not None:
            return self._send(409, _status(409, "AlreadyExists", f'{store} "{name}" exists'))
        api.created_manifests.append(copy.deepcopy(obj))
        obj["metadata"] |= {"uid": str(uuid.uuid4()), "creationTimestamp": now()}
        obj["metadata"]["namespace"] = ns
        api.put(store, obj, "ADDED")
        self._send(201, api.get(store, ns, name))

    def _route_core(self, method: str, path: str, query: dict[str, str]) -> bool:
        api = self.server_api
        watch = query.get("watch", "").lower() == "true"
        if m := re.fullmatch(r"/api/v1/namespaces/(?P<ns>[^/]+)", path):
            api.calls.add(("", "namespaces", "get"))
            self._namespace(m["ns"])
        elif m := re.fullmatch(PODS, path):
            api.calls.add(("", "pods", "watch" if watch else "list"))
            self._list("pods", m["ns"], query, watch, "PodList")
        elif m := re.fullmatch(PODS + "/(?P<name>[^/]+)/log", path):
            api.calls.add(("", "pods/log", "get"))
            self._log(m["ns"], m["name"], query)
        elif m := re.fullmatch(PODS + "/(?P<name>[^/]+)", path):
            api.calls.add(("", "pods", "get"))
            self._get("pods", m["ns"], m["name"])
        elif m := re.fullmatch(r"/api/v1/namespaces/(?P<ns>[^/]+)/events", path):
            api.calls.add(("", "events", "list"))
            items = [e for e in api.events if _matches(e, query)]
            self._send(200, {"kind": "EventList", "metadata": {}, "items": items})
        else:
            return False
        return True

    def do_GET(self) -> None:  # noqa: N802
        self._route("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._route("POST")

    def do_DELETE(self) -> None:  # noqa: N802
        self._route("DELETE")

    # -- endpoints -----------------------------------------------------------------------------

    def _discovery(self, group_version: str) -> None:
        """The served job kinds of one group/version (kubeflow.org/v1 holds two)."""
        kinds = [
            kind
            for kind in self.server_api.served
            if f"{kind.group}/{kind.version}" == group_version
        ]
        if not kinds:
            return self._send(404, _status(404, "NotFound", "the server could not find it"))
        verbs = ["create", "delete", "get", "list", "patch", "update", "watch"]
        resources = [
            {
                "name": kind.plural,
                "singularName": kind.kind.lower(),
                "namespaced": True,
                "kind": kind.kind,
                "verbs": verbs,
            }
            for kind in sorted(kinds, key=lambda k: k.plural)
        ]
        self._send(
            200,
            {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": group_version,
                "resources": resources,
            },
        )

    def _runtime(self, found: bool, kind: str, name: str) -> None:
        if self.server_api.runtime_forbidden:
            return self._send(403, _status(403, "Forbidden", f"cannot get {kind.lower()}s"))
        if not found:
            return self._send(404, _status(404, "NotFound", f'{kind.lower()}s "{name}" not found'))
        self._send(
            200,
            {
                "apiVersion": "trainer.kubeflow.org/v1alpha1",
                "kind": kind,
                "metadata": {"name": name},
                "spec": {"mlPolicy": {"numNodes": 1, "torch": {}}},
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

    def _create_job(self, kind: Kind, ns: str, job: dict[str, Any]) -> None:
        api = self.server_api
        name = job["metadata"]["name"]
        if ns not in api.namespaces:
            return self._send(404, _status(404, "NotFound", f'namespaces "{ns}" not found'))
        errors = schema_errors(kind.api, job)  # the official CRD, as the API server checks it
        if errors:
            api.rejected.append(name)
            return self._send(422, _status(422, "Invalid", "; ".join(errors)))
        if api.get(kind.plural, ns, name) is not None:
            msg = f'{kind.plural}.{kind.group} "{name}" already exists'
            return self._send(409, _status(409, "AlreadyExists", msg))
        api.created_manifests.append(copy.deepcopy(job))
        job["metadata"] |= {"uid": str(uuid.uuid4()), "creationTimestamp": now()}
        job["metadata"]["namespace"] = ns
        job["status"] = {}
        api.created.append(name)
        api.put(kind.plural, job, "ADDED")
        self._send(201, api.get(kind.plural, ns, name))
        api._start_scenario(kind, job)

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
