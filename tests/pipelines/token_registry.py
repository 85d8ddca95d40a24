"""A stand-in registry with Bearer token auth, the way ghcr.io and Docker Hub answer (loopback).

Every manifest request without ``Authorization: Bearer tok-123`` gets a 401 whose
``WWW-Authenticate: Bearer realm=".../token",service="stand-in",scope=...`` points at its own
token endpoint; ``/token`` hands out the token anonymously, or, with ``login`` set, only for that
user's basic credentials or (POST, docker's OAuth2 form) for ``refresh_token``. Manifests of
``tags`` exist, others are 404; ``status`` answers every manifest request with that code instead.
Every request is recorded (method, path, headers).
"""

from __future__ import annotations

import base64
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

TOKEN = "tok-123"
SERVICE = "stand-in"
REPOSITORY = "kfp-ddp/kfp-ddp"
INDEX = "application/vnd.oci.image.index.v1+json"


@dataclass
class TokenRegistry:
    """``with TokenRegistry(tags={"0.1.0"}) as registry:`` → ``registry.image("0.1.0")``."""

    tags: set[str]
    login: tuple[str, str] | None = None
    refresh_token: str | None = None
    status: int | None = None
    requests: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    host: str = ""
    _httpd: ThreadingHTTPServer | None = None

    def image(self, tag: str) -> str:
        return f"{self.host}/{REPOSITORY}:{tag}"

    def __enter__(self) -> TokenRegistry:
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._httpd.state = self  # type: ignore[attr-defined]
        host, port = self._httpd.server_address[:2]
        self.host = f"{host}:{port}"
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._httpd is not None
        self._httpd.shutdown()
        self._httpd.server_close()


class _Handler(BaseHTTPRequestHandler):
    @property
    def state(self) -> TokenRegistry:
        return self.server.state  # type: ignore[attr-defined]

    def _answer(self, code: int, body: bytes = b"", headers: dict | None = None) -> None:
        self.send_response(code)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _token(self, form: dict[str, list[str]]) -> None:
        query = parse_qs(urlsplit(self.path).query) | form
        assert query["service"] == [SERVICE], query
        assert query["scope"] == [f"repository:{REPOSITORY}:pull"], query
        login = self.state.login
        if login is not None:
            wanted = "Basic " + base64.b64encode(":".join(login).encode()).decode()
            refreshed = form.get("refresh_token") == [self.state.refresh_token]
            if self.headers.get("Authorization") != wanted and not refreshed:
                self._answer(401)
                return
        self._answer(200, json.dumps({"token": TOKEN}).encode())

    def _manifest(self) -> None:
        if self.state.status is not None:
            self._answer(self.state.status)
        elif self.headers.get("Authorization") != f"Bearer {TOKEN}":
            challenge = (
                f'Bearer realm="http://{self.state.host}/token",service="{SERVICE}",'
                f'scope="repository:{REPOSITORY}:pull"'
            )
            self._answer(401, b"{}", {"WWW-Authenticate": challenge})
        elif self.path.rsplit("/", 1)[-1] in self.state.tags:
            assert INDEX in self.headers.get("Accept", ""), self.headers
            self._answer(200, headers={"Content-Type": INDEX})
        else:
            self._answer(404)

    def _record(self) -> None:
        self.state.requests.append((self.command, self.path, dict(self.headers)))

    def do_HEAD(self) -> None:  # noqa: N802 (http.server's names)
        self._record()
        self._manifest()

    def do_GET(self) -> None:  # noqa: N802
        self._record()
        if self.path.startswith("/token"):
            self._token({})
        else:
            self._manifest()

    def do_POST(self) -> None:  # noqa: N802
        self._record()
        body = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
        self._token(parse_qs(body))

    def log_message(self, *args: object) -> None:
        pass
