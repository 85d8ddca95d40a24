"""Point this process's S3 clients (and the processes it starts) at a local S3 server."""

from __future__ import annotations

from pathlib import Path

import pytest

from kfp_ddp.local_s3 import LocalS3Server


def use_s3_server(env: pytest.MonkeyPatch, server: LocalS3Server, cache_dir: Path) -> None:
    """The standard AWS variables point at ``server`` and nothing else leaks in (no profile,
    config file or other endpoint of this machine's); the sync cache is ``cache_dir``."""
    use_s3_variables(env, server.env(), cache_dir)


def use_s3_variables(env: pytest.MonkeyPatch, variables: dict[str, str], cache_dir: Path) -> None:
    """The AWS ``variables`` (endpoint, key pair...) and nothing else of this machine's; the sync
    cache is ``cache_dir``."""
    env.setenv("S3SYNC_CACHE_DIR", str(cache_dir))
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_SESSION_TOKEN", "AWS_REGION"):
        env.delenv(name, raising=False)
    env.setenv("AWS_CONFIG_FILE", "/nonexistent/aws-config")
    env.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/aws-credentials")
    for name, value in variables.items():
        env.setenv(name, value)
