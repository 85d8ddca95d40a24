"""Stand-ins for Kubeflow Trainer's status server (``pkg/statusserver`` of v2.3.0), on loopback.

- :class:`StatusServer`: HTTPS with a certificate of the given CA; every request is recorded and
  ``answer(request) -> (code, body)`` decides what it gets.
- :func:`trainer_status_server` is the real server's ``answer``: the bearer token must pass a
  TokenReview on the real API server for the TrainJob's audience (the released server verifies
  the same JWT with the cluster's OIDC keys; the KEP describes a TokenReview), then
  ``status.trainerStatus`` is server-side-applied to the TrainJob (field manager
  ``trainer-status``, forced, as the real one does), so that the CRD's schema and CEL rules judge
  what the trainer sent. Answers as the real one: 200 (the payload echoed), 403, 404, 422, 500.
- :class:`HangingServer`: accepts connections and never answers (not even the TLS handshake).
"""

from __future__ import annotations

import json
import re
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

STATUS_PATH = re.compile(
    r"/apis/trainer\.kubeflow\.org/v1alpha1/namespaces/([a-z0-9-]+)/trainjobs/([a-z0-9-]+)/status"
)
AUDIENCE_PREFIX = "trainer.kubeflow.org"


def status_path(namespace: str, name: str) -> str:
    """``StatusUrl`` of pkg/statusserver/utils.go."""
    return f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs/{name}/status"


def token_audience(namespace: str, name: str) -> str:
    """``TokenAudience`` of pkg/statusserver/utils.go: the audience of the projected token."""
    return f"{AUDIENCE_PREFIX}/v1alpha1/namespaces/{namespace}/trainjobs/{name}/status"


@dataclass(frozen=True)
class Request:
    """One request the server received."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    received_at: float
    """time.monotonic() when its body was read."""

    @property
    def token(self) -> str:
        scheme, _, credentials = self.headers.get("Authorization", "").partition(" ")
        return credentials.strip() if scheme.lower() == "bearer" else ""

    @property
    def payload(self) -> Any:
        return json.loads(self.body)

    @property
    def trainer_status(self) -> dict[str, Any]:
        return self.payload["trainerStatus"]


Answer = Callable[[Request], tuple[int, dict[str, Any]]]


def status_body(code: int, reason: str, message: str) -> dict[str, Any]:
    """The ``metav1.Status`` the real server answers refusals with."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def answering(code: int) -> Answer:
    """Every POST gets ``code`` (200: the payload echoed, as the real server does)."""

    def answer(request: Request) -> tuple[int, dict[str, Any]]:
        if code == 200:
            return 200, request.payload
        return code, status_body(code, "InternalError", "Internal error")

    return answer


class _Handler(BaseHTTPRequestHandler):
    server: _TLSServer

    def setup(self) -> None:
        self.request.settimeout(10)
        self.request.do_handshake()
        super().setup()

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length)
        request = Request("POST", self.path, dict(self.headers), body, time.monotonic())
        owner = self.server.owner
        owner.requests.append(request)
        code, answer = owner.answer(request)
        owner.codes.append(code)
        self._send(code, answer)

    def do_GET(self) -> None:  # noqa: N802
        self._send(404, status_body(404, "NotFound", "Not found"))

    def _send(self, code: int, answer: dict[str, Any]) -> None:
        data = json.dumps(answer).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass


class _TLSServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, owner: StatusServer, context: ssl.SSLContext):
        self.owner, self.context = owner, context
        super().__init__(("127.0.0.1", 0), _Handler)

    def get_request(self) -> tuple[socket.socket, Any]:
        connection, address = self.socket.accept()
        # The handshake runs in the request's thread (setup), not in the accepting one.
        wrapped = self.context.wrap_socket(
            connection, server_side=True, do_handshake_on_connect=False
        )
        return wrapped, address

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that gave up before its answer was written (the reporter's timeout is
        shorter than a slow answer) is no error of the server's; anything else is printed."""
        if isinstance(sys.exc_info()[1], (ConnectionError, ssl.SSLEOFError, TimeoutError)):
            return
        super().handle_error(request, client_address)


class StatusServer:
    """An HTTPS server on 127.0.0.1 whose ``answer`` decides; ``requests`` in arrival order."""

    def __init__(self, folder: Path, ca: Any, answer: Answer):
        pem = ca.server("trainer-status-server")
        pem.write(folder, "tls.crt", "tls.key")
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(folder / "tls.crt", folder / "tls.key")
        self.answer = answer
        self.requests: list[Request] = []
        self.codes: list[int] = []
        """The answer to each request, in the same order."""
        self._server = _TLSServer(self, context)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def url(self, namespace: str, name: str) -> str:
        return f"https://127.0.0.1:{self.port}{status_path(namespace, name)}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> StatusServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class HangingServer:
    """Accepts TCP connections on 127.0.0.1 and never sends a byte."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.connections: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return  # closed
            self.connections.append(connection)

    def url(self, namespace: str, name: str) -> str:
        return f"https://127.0.0.1:{self.port}{status_path(namespace, name)}"

    def close(self) -> None:
        self._listener.close()
        for connection in self.connections:
            connection.close()

    def __enter__(self) -> HangingServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------- the real server's answer
def trainer_status_server(plane: Any) -> Answer:
    """What Kubeflow Trainer's status server does with a request, against ``plane``."""
    from kubernetes.client.rest import ApiException

    def answer(request: Request) -> tuple[int, dict[str, Any]]:
        match = STATUS_PATH.fullmatch(request.path)
        if match is None:
            return 404, status_body(404, "NotFound", "Not found")
        namespace, name = match.groups()
        try:
            authorized = token_authorized(plane, request.token, namespace, name)
        except ApiException:
            return 500, status_body(500, "InternalError", "Internal error")
        if not authorized:
            return 403, status_body(403, "Forbidden", "Forbidden")
        try:
            payload = request.payload
        except ValueError:
            return 422, status_body(422, "Invalid", "Invalid payload")
        if not isinstance(payload, dict) or payload.get("trainerStatus") is None:
            return 200, payload
        try:
            trainer_status = decoded(payload["trainerStatus"])
        except ValueError:
            return 422, status_body(422, "Invalid", "Invalid payload")
        try:
            apply_trainer_status(plane, namespace, name, trainer_status)
        except ApiException as err:
            return _refusal(err)
        return 200, {"trainerStatus": trainer_status}

    return answer


def decoded(trainer_status: Any) -> dict[str, Any]:
    """What the real server applies: the request decoded into its Go types (ValueError where Go's
    decoder fails) and encoded again (``toApplyConfig``): unknown fields dropped, int32s, metric
    names and values as strings, ``lastUpdatedTime`` as ``metav1.Time`` writes it (always sent:
    absent, it is ``null``, and the CRD's CEL rule refuses that)."""
    if not isinstance(trainer_status, dict):
        raise ValueError("trainerStatus is not an object")
    out: dict[str, Any] = {}
    for name in ("progressPercentage", "estimatedRemainingSeconds"):
        value = trainer_status.get(name)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or abs(value) > 2**31 - 1:
            raise ValueError(f"{name}: {value!r} is not an int32")
        out[name] = value
    metrics = trainer_status.get("metrics") or []
    if not isinstance(metrics, list):
        raise ValueError("metrics is not a list")
    for metric in metrics:
        if not isinstance(metric, dict):
            raise ValueError(f"metric {metric!r} is not an object")
        if any(not isinstance(metric.get(key, ""), str) for key in ("name", "value")):
            raise ValueError(f"metric {metric!r}: name and value must be strings")
    if metrics:
        out["metrics"] = [{"name": m.get("name", ""), "value": m.get("value", "")} for m in metrics]
    out["lastUpdatedTime"] = _metav1_time(trainer_status.get("lastUpdatedTime"))
    return out


def _metav1_time(value: Any) -> str | None:
    """``metav1.Time``: JSON null or an RFC 3339 string, written back in whole UTC seconds."""
    if value is None:
        return None
    if not isinstance(value, str) or "T" not in value:
        raise ValueError(f"lastUpdatedTime {value!r} is not RFC 3339")
    stamp = datetime.fromisoformat(value)
    if stamp.tzinfo is None:
        raise ValueError(f"lastUpdatedTime {value!r} has no time zone")
    return stamp.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _refusal(err: Any) -> tuple[int, dict[str, Any]]:
    if err.status in (400, 422):
        message = json.loads(err.body or "{}").get("message") or "Validation failed"
        return 422, status_body(422, "Invalid", message)
    if err.status == 404:
        return 404, status_body(404, "NotFound", "Train job not found")
    return 500, status_body(500, "InternalError", "Internal error")


def token_authorized(plane: Any, token: str, namespace: str, name: str) -> bool:
    """A TokenReview for the TrainJob's audience; the token's ServiceAccount in ``namespace``."""
    from kubernetes import client

    if not token:
        return False
    review = client.AuthenticationV1Api(plane.admin_client()).create_token_review(
        {"spec": {"token": token, "audiences": [token_audience(namespace, name)]}}
    )
    status = review.status
    if not status.authenticated:
        return False
    return status.user.username.startswith(f"system:serviceaccount:{namespace}:")


def apply_trainer_status(plane: Any, namespace: str, name: str, trainer_status: Any) -> None:
    """Server-side apply of ``status.trainerStatus`` (the status subresource)."""
    body = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": namespace},
        "status": {"trainerStatus": trainer_status},
    }
    plane.admin_client().call_api(
        f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs/{name}/status",
        "PATCH",
        query_params=[("fieldManager", "trainer-status"), ("force", "true")],
        header_params={
            "Content-Type": "application/apply-patch+yaml",
            "Accept": "application/json",
        },
        body=body,
        auth_settings=["BearerToken"],
        response_type="object",
        _return_http_data_only=True,
    )


def audience_token(plane: Any, namespace: str, service_account: str, audience: str) -> str:
    """A token of ``namespace/service_account`` for ``audience`` (TokenRequest), as the kubelet
    projects it into a TrainJob's pods (created if missing)."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    core = client.CoreV1Api(plane.admin_client())
    try:
        core.create_namespaced_service_account(namespace, {"metadata": {"name": service_account}})
    except ApiException as exc:
        if exc.status != 409:
            raise
    request = {"spec": {"audiences": [audience], "expirationSeconds": 600}}
    answer = core.create_namespaced_service_account_token(service_account, namespace, request)
    return answer.status.token
