"""A stand-in Kubeflow Pipelines v2beta1 API server for CLI tests (loopback, free port, threads).

It serves what ``kfp.Client`` 2.17 calls for upload / run / schedule: healthz, pipelines list,
pipelines/upload (multipart ``uploadfile``), pipelines/upload_version, experiments list/create,
runs create and recurringruns create. Every request is recorded (method, path, query, headers,
decoded body) so tests can assert on exactly what the client sent. ``token`` makes every request
without ``Authorization: Bearer <token>`` fail with 401; ``forbidden`` answers 403 to everything;
``reject`` answers chosen routes with chosen errors; ``tag_name`` is the release healthz reports
(like the real server's TAG_NAME: ``2.17.0``, ``master``, ``unknown``; None leaves it out).
"""

from __future__ import annotations

import email.parser
import email.policy
import json
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

API = "/apis/v2beta1"
CREATED_AT = "2026-11-22T00:00:00Z"


@dataclass
class RecordedRequest:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    json: Any = None
    files: dict[str, bytes] = field(default_factory=dict)


def _parse_multipart(content_type: str, body: bytes) -> dict[str, bytes]:
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + body
    )
    files: dict[str, bytes] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if name:
            files[name] = part.get_payload(decode=True) or b""
    return files


class FakeKfpServer:
    """``with FakeKfpServer() as server:`` → ``server.url``, ``server.requests``, state dicts."""

    def __init__(
        self,
        *,
        token: str | None = None,
        forbidden: bool = False,
        reject: dict[str, tuple[int, str]] | None = None,
        tag_name: str | None = "2.17.0",
    ) -> None:
        self.token = token
        self.tag_name = tag_name
        self.forbidden = forbidden
        self.reject = dict(reject or {})
        """``{"POST /runs": (400, "message")}``: answer that route with that error."""
        self.requests: list[RecordedRequest] = []
        self.pipelines: dict[str, dict] = {}  # id → {"display_name", "versions": [...]}
        self.experiments: dict[str, dict] = {}
        self.runs: list[dict] = []
        self.recurring_runs: list[dict] = []
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._httpd is not None
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> FakeKfpServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # keep test output quiet
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                split = urlsplit(self.path)
                recorded = RecordedRequest(
                    method=self.command,
                    path=split.path,
                    query=parse_qs(split.query),
                    headers={k.lower(): v for k, v in self.headers.items()},
                )
                content_type = self.headers.get("Content-Type", "")
                if body and content_type.startswith("multipart/form-data"):
                    recorded.files = _parse_multipart(content_type, body)
                elif body:
                    recorded.json = json.loads(body)
                with server._lock:
                    server.requests.append(recorded)
                    status, payload = server._route(recorded)
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = do_PATCH = _handle

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    # ------------------------------------------------------------------ helpers for tests
    def requests_to(self, method: str, path: str) -> list[RecordedRequest]:
        return [r for r in self.requests if r.method == method and r.path == API + path]

    # ------------------------------------------------------------------ routing
    @staticmethod
    def _error(status: int, message: str) -> tuple[int, dict]:
        return status, {"error_message": message, "message": message, "code": status}

    def _route(self, r: RecordedRequest) -> tuple[int, dict]:
        if self.forbidden:
            return self._error(403, "user is not authorized to access kubeflow pipelines")
        if self.token is not None and r.headers.get("authorization") != f"Bearer {self.token}":
            return self._error(401, "Unauthenticated: missing or invalid bearer token")
        route = f"{r.method} {r.path.removeprefix(API)}"
        rejected = self.reject.get(route)
        if rejected:
            return self._error(*rejected)
        handler = self._ROUTES.get(route) if r.path.startswith(API) else None
        if handler is None:
            return self._error(404, f"stand-in server has no route {r.method} {r.path}")
        return handler(self, r)

    def _healthz(self, r: RecordedRequest) -> tuple[int, dict]:
        healthz = {"commit_sha": "stand-in", "tag_name": self.tag_name, "multi_user": False}
        return 200, {key: value for key, value in healthz.items() if value is not None}

    def _list_pipelines(self, r: RecordedRequest) -> tuple[int, dict]:
        wanted = _filter_value(r.query)
        found = [
            self._pipeline_json(pid)
            for pid, p in self.pipelines.items()
            if wanted is None or p["display_name"] == wanted
        ]
        return 200, {"pipelines": found, "total_size": len(found)} if found else {}

    def _upload_pipeline(self, r: RecordedRequest) -> tuple[int, dict]:
        name = r.query.get("name", [""])[0]
        if any(p["display_name"] == name for p in self.pipelines.values()):
            return self._error(409, f"Pipeline with name {name!r} already exists")
        pid = str(uuid.uuid4())
        self.pipelines[pid] = {"display_name": name, "versions": [r.files.get("uploadfile")]}
        return 200, self._pipeline_json(pid)

    def _upload_version(self, r: RecordedRequest) -> tuple[int, dict]:
        pid = r.query.get("pipelineid", [""])[0]
        if pid not in self.pipelines:
            return self._error(404, f"pipeline {pid!r} not found")
        self.pipelines[pid]["versions"].append(r.files.get("uploadfile"))
        return 200, {
            "pipeline_id": pid,
            "pipeline_version_id": str(uuid.uuid4()),
            "display_name": r.query.get("name", [""])[0],
            "created_at": CREATED_AT,
        }

    def _list_experiments(self, r: RecordedRequest) -> tuple[int, dict]:
        wanted = _filter_value(r.query)
        found = [e for e in self.experiments.values() if e["display_name"] == wanted]
        return 200, {"experiments": found, "total_size": len(found)} if found else {}

    def _create_experiment(self, r: RecordedRequest) -> tuple[int, dict]:
        eid = str(uuid.uuid4())
        self.experiments[eid] = {
            "experiment_id": eid,
            "display_name": r.json["display_name"],
            "created_at": CREATED_AT,
        }
        return 200, self.experiments[eid]

    def _create_run(self, r: RecordedRequest) -> tuple[int, dict]:
        problem = _check_parameters(r.json)
        if problem:
            return self._error(400, problem)
        run = {**r.json, "run_id": str(uuid.uuid4()), "state": "PENDING"}
        self.runs.append(run)
        return 200, {
            "run_id": run["run_id"],
            "display_name": run.get("display_name"),
            "experiment_id": run.get("experiment_id"),
            "state": "PENDING",
            "created_at": CREATED_AT,
        }

    def _create_recurring_run(self, r: RecordedRequest) -> tuple[int, dict]:
        problem = _check_parameters(r.json)
        if problem:
            return self._error(400, problem)
        recurring = {**r.json, "recurring_run_id": str(uuid.uuid4())}
        self.recurring_runs.append(recurring)
        return 200, {
            "recurring_run_id": recurring["recurring_run_id"],
            "display_name": recurring.get("display_name"),
            "status": "ENABLED",
            "created_at": CREATED_AT,
        }

    _ROUTES: dict[str, Callable[[FakeKfpServer, RecordedRequest], tuple[int, dict]]] = {
        "GET /healthz": _healthz,
        "GET /pipelines": _list_pipelines,
        "POST /pipelines/upload": _upload_pipeline,
        "POST /pipelines/upload_version": _upload_version,
        "GET /experiments": _list_experiments,
        "POST /experiments": _create_experiment,
        "POST /runs": _create_run,
        "POST /recurringruns": _create_recurring_run,
    }
    """``"METHOD /path"`` under ``API`` → handler (the keys ``reject`` uses too)."""

    def _pipeline_json(self, pid: str) -> dict:
        return {
            "pipeline_id": pid,
            "display_name": self.pipelines[pid]["display_name"],
            "created_at": CREATED_AT,
        }


def _filter_value(query: dict[str, list[str]]) -> str | None:
    raw = query.get("filter", [None])[0]
    if not raw:
        return None
    predicates = json.loads(raw).get("predicates", [])
    return predicates[0].get("stringValue") if predicates else None


def _check_parameters(body: dict) -> str | None:
    """Like the real server: runtime parameters must be declared by the pipeline spec."""
    spec = body.get("pipeline_spec") or {}
    spec = spec.get("pipeline_spec", spec)
    declared = spec.get("root", {}).get("inputDefinitions", {}).get("parameters", {})
    given = (body.get("runtime_config") or {}).get("parameters") or {}
    unknown = sorted(set(given) - set(declared))
    if unknown:
        return f"Invalid input error: unrecognized input parameter(s) {unknown}"
    return None
