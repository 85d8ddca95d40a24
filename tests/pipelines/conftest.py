"""Fixtures for the pipeline and CLI tests: a clean KFP environment and the stand-in API server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.pipelines.kfp_api_server import FakeKfpServer

KFP_ENV_VARS = (
    "KFP_HOST",
    "KF_PIPELINES_ENDPOINT",
    "KF_PIPELINES_UI_ENDPOINT",
    "KFP_TOKEN",
    "KF_PIPELINES_SA_TOKEN_PATH",
    "KFP_COOKIES",
    "KFP_DDP_IMAGE",
    "KFP_NAMESPACE",
    "KF_PIPELINES_DEFAULT_EXPERIMENT_NAME",
    "KF_PIPELINES_OVERRIDE_EXPERIMENT_NAME",
    "KF_PIPELINES_IAP_OAUTH2_CLIENT_ID",
    "KF_PIPELINES_APP_OAUTH2_CLIENT_ID",
    "KF_PIPELINES_APP_OAUTH2_CLIENT_SECRET",
)


@pytest.fixture(autouse=True)
def _clean_kfp_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No KFP host, token or experiment override leaks in from the developer's shell."""
    for name in KFP_ENV_VARS:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def kfp_server() -> Iterator[FakeKfpServer]:
    """A stand-in KFP v2beta1 API server on 127.0.0.1 (free port), stopped after the test."""
    with FakeKfpServer() as server:
        yield server


@pytest.fixture
def s3(s3_env):
    """The test S3 server in this test's environment (AWS_* variables, a sync cache of its own):
    the suite's ``s3_env``, by the name these tests use."""
    return s3_env


def upload_folder(s3, folder: Path, bucket: str, name: str) -> str:
    """``folder`` synced to ``s3://<bucket>/<name>`` (the bucket created if missing); its URI."""
    from components.s3_sync import sync

    uri = f"s3://{s3.create_bucket(bucket)}/{name}"
    sync(str(folder), uri)
    return uri
