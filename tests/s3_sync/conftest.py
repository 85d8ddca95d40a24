"""Fixtures for the S3 tests: a real SeaweedFS server (session) and a moto server.

``s3_server`` (the session's SeaweedFS), ``s3_env`` and ``bucket`` live in tests/conftest.py:
other areas use them too.
"""

from __future__ import annotations

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
