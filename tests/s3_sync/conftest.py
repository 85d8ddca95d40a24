"""Fixtures for the S3 tests: a real SeaweedFS server (session) and a moto server.

``s3_server`` (the session's SeaweedFS), ``s3_env`` and ``bucket`` live in tests/conftest.py:
other areas use them too.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kfp_ddp.free_ports import free_port


@pytest.fixture(scope="session")
def moto_server() -> Iterator[str]:
    """Endpoint URL of moto's S3 server on 127.0.0.1: it stores keys SeaweedFS refuses (``..``)."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()
