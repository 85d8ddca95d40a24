"""The choice of a transfer engine (``engine.py`` describes both): ``crt`` when the AWS CRT is
installed, else ``classic``."""

from __future__ import annotations

from components.s3_sync.classic_engine import ClassicEngine
from components.s3_sync.connection import S3Connection
from components.s3_sync.crt_engine import CrtEngine  # imports awscrt (optional) only when used
from components.s3_sync.engine import Engine
from components.s3_sync.errors import S3SyncUsageError


def crt_available() -> bool:
    """Whether the AWS CRT (``awscrt``, installed with ``botocore[crt]``) is importable."""
    try:
        import awscrt.s3  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_engine(engine: str) -> str:
    """``auto`` → ``crt`` when awscrt is installed, else ``classic``; ``crt`` needs awscrt."""
    if engine == "auto":
        return "crt" if crt_available() else "classic"
    if engine == "crt" and not crt_available():
        raise S3SyncUsageError(
            "engine='crt' needs the AWS CRT: pip install 'botocore[crt]' (or use engine='classic')"
        )
    return engine


def make_engine(conn: S3Connection, *, engine: str, max_concurrency: int) -> Engine:
    """The engine named ``engine`` (``crt`` or ``classic``; see ``resolve_engine``)."""
    if resolve_engine(engine) == "crt":
        return CrtEngine(conn, max_concurrency=max_concurrency)
    return ClassicEngine(conn, max_concurrency=max_concurrency)
