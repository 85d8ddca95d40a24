"""Fixtures for the S3 tests: a real SeaweedFS server (session) and a moto server.

``s3_server`` (the session's SeaweedFS) lives in tests/conftest.py: other areas use it too.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def moto_server() -> Iterator[str]:
    """Endpoint URL of moto's S3 server on 127.0.0.1: it stores keys SeaweedFS refuses (``..``)."""
    from moto.server import ThreadedMotoServer

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3_env(s3_server, monkeypatch, tmp_path_factory):
    """The standard AWS env vars point at ``s3_server`` (and nothing else leaks in)."""
    monkeypatch.setenv("S3SYNC_CACHE_DIR", str(tmp_path_factory.mktemp("s3sync-cache")))
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_SESSION_TOKEN", "AWS_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/aws-config")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/aws-credentials")
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    return s3_server


@pytest.fixture
def bucket(s3_env, request) -> str:
    """A fresh bucket on ``s3_server``, named after the test."""
    name = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:50]
    name = f"t-{name}-{id(request) % 10000}".strip("-")
    return s3_env.create_bucket(name)
