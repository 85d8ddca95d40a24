"""Failures give one clear message (no traceback, no secrets); the CLI exits non-zero."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from botocore.exceptions import ClientError

from components.s3_sync import S3SyncError, sync
from components.s3_sync.errors import S3SyncUsageError, translate
from kfp_ddp.free_ports import free_port
from kfp_ddp.local_s3 import LocalS3Server

READER = {"accessKey": "READERKEY0000000", "secretKey": "reader-secret-do-not-print"}


def _cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120):
    return subprocess.run(
        [sys.executable, "-m", "components.s3_sync", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def restricted_s3():
    """A server with a second identity that may only read and list bucket "readable"."""
    identity = {
        "name": "reader",
        "credentials": [READER],
        "actions": ["Read:readable", "List:readable"],
    }
    with LocalS3Server(extra_identities=[identity]) as server:
        server.create_bucket("readable")
        server.create_bucket("private")
        server.client().put_object(Bucket="readable", Key="a.txt", Body=b"a")
        yield server


def test_no_such_bucket(s3_env, tmp_path):
    with pytest.raises(S3SyncError) as err:
        sync("s3://no-such-bucket-here/x", tmp_path)
    msg = str(err.value)
    assert "no-such-bucket-here" in msg and "does not exist" in msg
    assert s3_env.endpoint_url in msg


@pytest.mark.parametrize("dry_run", [False, True])  # a dry run: how the data step lists
def test_a_source_that_is_one_object_is_named_not_synced_as_an_empty_folder(
    s3_env, bucket, tmp_path, dry_run
):
    """s3://bucket/datasets/flowers.zip is read as the prefix flowers.zip/: 0 files, said by
    nobody (the data step then found no train/ "(it has nothing)")."""
    client = s3_env.client()
    client.put_object(Bucket=bucket, Key="datasets/flowers.tar.gz", Body=b"\x1f\x8b" * 500)
    client.put_object(Bucket=bucket, Key="datasets/labels.csv", Body=b"a,b")
    with pytest.raises(S3SyncUsageError) as refused:
        sync(f"s3://{bucket}/datasets/flowers.tar.gz", tmp_path / "d", dry_run=dry_run)
    assert str(refused.value) == (
        f"s3://{bucket}/datasets/flowers.tar.gz is one object (an archive, 1,000 bytes), not a "
        "prefix of objects: a sync copies the objects under a prefix, and nothing is under "
        f"s3://{bucket}/datasets/flowers.tar.gz/; unpack it and upload its folders under a "
        f"prefix (e.g. unzip it, then `aws s3 sync ./folder s3://{bucket}/datasets/flowers/`) "
        "and name that prefix"
    )
    with pytest.raises(S3SyncUsageError, match=f"name the prefix that holds it .s3://{bucket}/da"):
        sync(f"s3://{bucket}/datasets/labels.csv/", tmp_path / "d", dry_run=dry_run)
    assert not (tmp_path / "d").exists()  # refused before anything is written
    assert sync(f"s3://{bucket}/nothing-here", tmp_path / "d", dry_run=dry_run).files == 0


def test_bad_credentials_message_names_what_to_check_without_secrets(s3_env, bucket, tmp_path):
    env = {**os.environ, "AWS_SECRET_ACCESS_KEY": "wrong-secret-value-xyz"}
    proc = _cli(f"s3://{bucket}/x", str(tmp_path), env=env)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert "credentials were rejected" in proc.stderr and "AWS_SECRET_ACCESS_KEY" in proc.stderr
    assert s3_env.endpoint_url in proc.stderr
    assert "wrong-secret-value-xyz" not in proc.stderr + proc.stdout
    assert s3_env.secret_key not in proc.stderr + proc.stdout
    # an unknown access key too
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "AKIANOTAKEY000000000"}
    proc = _cli(f"s3://{bucket}/x", str(tmp_path), env=env)
    assert proc.returncode == 1 and "InvalidAccessKeyId" in proc.stderr


def test_missing_credentials(s3_env, monkeypatch, tmp_path):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(S3SyncError, match="no S3 credentials found.*AWS_ACCESS_KEY_ID"):
        sync("s3://whatever-bucket/x", tmp_path)


def test_access_denied(restricted_s3, monkeypatch, tmp_path):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", READER["accessKey"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", READER["secretKey"])
    monkeypatch.setenv("S3SYNC_CACHE_DIR", str(tmp_path / "cache"))
    endpoint = restricted_s3.endpoint_url
    assert sync("s3://readable", tmp_path / "ok", endpoint_url=endpoint).transferred == 1
    with pytest.raises(S3SyncError) as err:
        sync("s3://private/data", tmp_path / "no", endpoint_url=endpoint)
    assert "access denied" in str(err.value) and "private" in str(err.value)
    src = tmp_path / "up"
    src.mkdir()
    (src / "f.txt").write_text("x")
    with pytest.raises(S3SyncError) as err:
        sync(src, "s3://readable/up", endpoint_url=endpoint)
    assert "access denied" in str(err.value) or "AccessDenied" in str(err.value)
    assert READER["secretKey"] not in str(err.value)


def test_unreachable_endpoint_cli(s3_env, tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    env = {**os.environ, "AWS_MAX_ATTEMPTS": "2"}
    proc = _cli("s3://some-bucket/data", str(tmp_path), "--endpoint-url", url, env=env)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "cannot reach the S3 endpoint" in proc.stderr and url in proc.stderr
    assert "--endpoint-url" in proc.stderr


def test_cli_success_summary_json_and_dry_run(s3_env, bucket, tmp_path):
    s3_env.client().put_object(Bucket=bucket, Key="d/a.txt", Body=b"hello")
    dry = _cli(f"s3://{bucket}/d", str(tmp_path / "out"), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.count("\n") == 1 and "would transfer 1 of 1" in dry.stdout
    assert not (tmp_path / "out").exists()
    proc = _cli(f"s3://{bucket}/d", str(tmp_path / "out"), "--include", "*.txt", "--delete")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("s3-sync: transferred 1 of 1 files")
    assert (tmp_path / "out" / "a.txt").read_bytes() == b"hello"
    out = _cli(f"s3://{bucket}/d", str(tmp_path / "out"), "--json")
    report = json.loads(out.stdout)
    assert report["transferred"] == 0 and report["skipped"] == 1 and len(report["digest"]) == 64
    assert s3_env.secret_key not in proc.stdout + proc.stderr + out.stdout + out.stderr


def test_cli_bad_arguments_exit_2(tmp_path):
    proc = _cli(str(tmp_path), str(tmp_path / "b"))
    assert proc.returncode == 2 and "exactly one side" in proc.stderr
    proc = _cli("s3://b/x")
    assert proc.returncode == 2


def test_a_clock_off_by_more_than_15_minutes_is_named_not_access_denied():
    """A node whose clock drifted: S3 answers 403 RequestTimeTooSkewed, which was reported as
    "access denied ... check the credentials' policy"; no permission would help."""
    skewed = ClientError(
        {
            "Error": {
                "Code": "RequestTimeTooSkewed",
                "Message": "The difference between the request time and the current time is "
                "too large.",
            },
            "ResponseMetadata": {"HTTPStatusCode": 403},
        },
        "ListObjectsV2",
    )
    message = str(translate(skewed, endpoint="https://s3.amazonaws.com", region="us-east-1",
                            bucket="data"))  # fmt: skip
    assert "(RequestTimeTooSkewed): this machine's clock is more than 15 minutes off" in message
    assert "access denied" not in message and "timedatectl set-ntp true" in message


def test_access_denied_carries_what_s3_said_beyond_access_denied():
    """AWS names the action and policy that denied a request: with SSE-KMS, kms:Decrypt, which
    no s3: permission gives. The message said only to check the s3: permissions."""
    said = (
        "User: arn:aws:sts::123456789012:assumed-role/trainer/pod is not authorized to perform: "
        "kms:Decrypt on resource: arn:aws:kms:eu-west-1:123456789012:key/1234 because no "
        "identity-based policy allows the kms:Decrypt action"
    )
    denied = ClientError(
        {
            "Error": {"Code": "AccessDenied", "Message": said},
            "ResponseMetadata": {"HTTPStatusCode": 403},
        },
        "GetObject",
    )
    message = str(translate(denied, endpoint="https://s3.eu-west-1.amazonaws.com",
                            region="eu-west-1", bucket="data", key="cats/1.jpg"))  # fmt: skip
    assert message.startswith("access denied to s3://data/cats/1.jpg at endpoint ")
    assert f"(AccessDenied): S3 says {said!r}: check that" in message
    assert "kms:Decrypt / kms:GenerateDataKey on the bucket's KMS key" in message
    plain = ClientError(
        {"Error": {"Code": "AccessDenied", "Message": "Access Denied."}}, "ListObjectsV2"
    )
    assert "S3 says" not in str(translate(plain, endpoint="e", region="r", bucket="b"))
