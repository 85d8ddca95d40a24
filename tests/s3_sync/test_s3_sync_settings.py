"""Every connection setting comes from botocore (its sources and precedence), against the real
server: endpoint, region, addressing style, credentials (static and refreshable), retries."""

from __future__ import annotations

import sys
import textwrap

import pytest

from components.s3_sync import S3SyncUsageError, sync
from components.s3_sync.connection import DEFAULT_MAX_ATTEMPTS, S3Connection
from components.s3_sync.listing import list_objects
from components.s3_sync.s3_uri import parse_s3_uri
from tests.s3_sync.s3_helpers import put_objects

ENV_NAMES = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS",
    "AWS_DEFAULT_REGION",
    "AWS_REGION",
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_MAX_ATTEMPTS",
    "AWS_RETRY_MODE",
    "AWS_USE_FIPS_ENDPOINT",
    "AWS_USE_DUALSTACK_ENDPOINT",
    "AWS_CA_BUNDLE",
)


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """No AWS settings at all, and config/credentials files that do not exist (yet)."""
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "aws-credentials"))
    monkeypatch.setenv("S3SYNC_CACHE_DIR", str(tmp_path / "cache"))
    return monkeypatch


def _connect(**kw) -> S3Connection:
    args = {"endpoint_url": None, "region": None, "addressing_style": None, "max_concurrency": 4}
    return S3Connection(**{**args, **kw})


def _with_keys(env, server=None) -> None:
    env.setenv("AWS_ACCESS_KEY_ID", server.access_key if server else "AKIDEXAMPLE")
    env.setenv("AWS_SECRET_ACCESS_KEY", server.secret_key if server else "secret-example")


def test_endpoint_precedence_is_botocores(clean_env, s3_server, tmp_path):
    """AWS_ENDPOINT_URL_S3 before AWS_ENDPOINT_URL; the argument before both."""
    _with_keys(clean_env, s3_server)
    bucket = s3_server.create_bucket("endpoint-precedence")
    s3_server.client().put_object(Bucket=bucket, Key="d/a.txt", Body=b"a")
    clean_env.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    clean_env.setenv("AWS_ENDPOINT_URL_S3", s3_server.endpoint_url)
    assert _connect().endpoint == s3_server.endpoint_url
    assert sync(f"s3://{bucket}/d", tmp_path / "one").transferred == 1
    clean_env.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9")
    report = sync(f"s3://{bucket}/d", tmp_path / "two", endpoint_url=s3_server.endpoint_url)
    assert report.transferred == 1


def test_endpoint_from_a_services_section_of_the_aws_config(clean_env, s3_server, tmp_path):
    _with_keys(clean_env, s3_server)
    bucket = s3_server.create_bucket("services-section")
    s3_server.client().put_object(Bucket=bucket, Key="d/a.txt", Body=b"a")
    (tmp_path / "aws-config").write_text(
        "[default]\nservices = local\nregion = eu-north-1\n\n"
        f"[services local]\ns3 =\n  endpoint_url = {s3_server.endpoint_url}\n"
    )
    conn = _connect()
    assert (conn.endpoint, conn.region) == (s3_server.endpoint_url, "eu-north-1")
    assert sync(f"s3://{bucket}/d", tmp_path / "out").transferred == 1
    assert (tmp_path / "out" / "a.txt").read_bytes() == b"a"


def test_region_and_attempts_follow_botocores_precedence(clean_env, tmp_path):
    _with_keys(clean_env)
    clean_env.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9")
    conn = _connect()
    assert (conn.region, conn.settings.max_attempts) == ("us-east-1", DEFAULT_MAX_ATTEMPTS)
    (tmp_path / "aws-config").write_text(
        "[default]\nregion = eu-north-1\nmax_attempts = 6\n\n[profile dev]\nregion = sa-east-1\n"
    )
    conn = _connect()
    assert (conn.region, conn.settings.max_attempts) == ("eu-north-1", 6)
    assert conn.client.meta.config.retries["total_max_attempts"] == 6
    clean_env.setenv("AWS_PROFILE", "dev")
    assert _connect().region == "sa-east-1"
    clean_env.setenv("AWS_DEFAULT_REGION", "us-west-2")  # the env wins over the profile
    clean_env.setenv("AWS_MAX_ATTEMPTS", "2")
    conn = _connect()
    assert (conn.region, conn.settings.max_attempts) == ("us-west-2", 2)
    assert _connect(region="ap-south-1").region == "ap-south-1"  # the argument wins


@pytest.mark.parametrize(
    ("config", "style", "want_host"),
    [
        ("", None, "localhost:{port}"),  # a custom endpoint: path style, as botocore does
        ("[default]\ns3 =\n  addressing_style = virtual\n", None, "data.localhost:{port}"),
        ("[default]\ns3 =\n  addressing_style = virtual\n", "path", "localhost:{port}"),
        ("", "virtual", "data.localhost:{port}"),
    ],
    ids=["default", "profile-virtual", "argument-wins", "argument-virtual"],
)
def test_addressing_style_from_the_profile_or_the_argument(
    clean_env, tmp_path, config, style, want_host
):
    _with_keys(clean_env)
    (tmp_path / "aws-config").write_text(config)
    conn = _connect(endpoint_url="http://localhost:9000", addressing_style=style)
    host, path = conn.bucket_base("data")
    assert host == want_host.format(port=9000)
    assert path == ("/" if host.startswith("data.") else "/data/")


def test_credentials_from_a_profile_go_through_botocore(s3_env, bucket, tmp_path, monkeypatch):
    """Keys in the shared credentials file (not the env): botocore's chain finds them."""
    creds = tmp_path / "credentials"
    creds.write_text(
        f"[team]\naws_access_key_id = {s3_env.access_key}\n"
        f"aws_secret_access_key = {s3_env.secret_key}\n"
    )
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(creds))
    monkeypatch.setenv("AWS_PROFILE", "team")
    config = tmp_path / "config"
    config.write_text("[profile team]\ns3 =\n  addressing_style = path\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    conn = S3Connection(endpoint_url=None, region=None, addressing_style=None, max_concurrency=4)
    assert conn.endpoint == s3_env.endpoint_url
    s3_env.client().put_object(Bucket=bucket, Key="p/x.bin", Body=b"x" * 5000)
    report = sync(f"s3://{bucket}/p", tmp_path / "down")
    assert report.transferred == 1 and report.engine == "crt"
    assert (tmp_path / "down" / "x.bin").read_bytes() == b"x" * 5000
    (tmp_path / "down" / "y.bin").write_bytes(b"y")
    assert sync(tmp_path / "down", f"s3://{bucket}/p").transferred == 1
    assert s3_env.client().get_object(Bucket=bucket, Key="p/y.bin")["Body"].read() == b"y"


def test_refreshable_credentials_reach_the_crt_through_botocore(s3_env, bucket, tmp_path):
    """A credential_process with an expiry gives botocore refreshable credentials: the CRT asks
    botocore for them per request (SSO and assumed roles work the same way)."""
    script = tmp_path / "creds.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import json
            print(json.dumps({{"Version": 1, "AccessKeyId": {s3_env.access_key!r},
                               "SecretAccessKey": {s3_env.secret_key!r},
                               "Expiration": "2999-01-01T00:00:00Z"}}))
            """
        )
    )
    config = tmp_path / "config"
    config.write_text(f"[profile proc]\ncredential_process = {sys.executable} {script}\n")
    s3_env.client().put_object(Bucket=bucket, Key="r/a.bin", Body=b"r" * 3000)
    with pytest.MonkeyPatch.context() as env:
        env.delenv("AWS_ACCESS_KEY_ID")
        env.delenv("AWS_SECRET_ACCESS_KEY")
        env.setenv("AWS_CONFIG_FILE", str(config))
        env.setenv("AWS_PROFILE", "proc")
        conn = S3Connection(
            endpoint_url=None, region=None, addressing_style=None, max_concurrency=4
        )
        from botocore.credentials import RefreshableCredentials

        assert isinstance(conn.session.get_credentials(), RefreshableCredentials)
        report = sync(f"s3://{bucket}/r", tmp_path / "down", engine="crt")
        assert report.transferred == 1
        (tmp_path / "down" / "b.bin").write_bytes(b"b")
        assert sync(tmp_path / "down", f"s3://{bucket}/r", engine="crt").transferred == 1
    assert (tmp_path / "down" / "a.bin").read_bytes() == b"r" * 3000
    assert s3_env.client().get_object(Bucket=bucket, Key="r/b.bin")["Body"].read() == b"b"


@pytest.mark.parametrize(
    ("setting", "value", "named"),
    [
        ("AWS_PROFILE", "no-such-profile", "AWS_PROFILE"),
        ("endpoint_url", "not a url", "endpoint_url='not a url'"),
        ("AWS_MAX_ATTEMPTS", "many", "AWS_MAX_ATTEMPTS"),
    ],
)
def test_unusable_settings_are_usage_errors_that_name_them(
    clean_env, tmp_path, setting, value, named
):
    _with_keys(clean_env)
    clean_env.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9")
    kw = {}
    if setting == "endpoint_url":
        kw["endpoint_url"] = value
    else:
        clean_env.setenv(setting, value)
    with pytest.raises(S3SyncUsageError) as err:
        sync("s3://some-bucket/x", tmp_path / "out", **kw)
    assert named in str(err.value)
    assert not (tmp_path / "out").exists()


def test_listing_a_prefix_with_reserved_characters(s3_env, bucket, tmp_path):
    keys = {"my data+x/a=1&b.txt": b"1", "my data+x/ü/é.txt": b"2", "my data+xy/no.txt": b"3"}
    for key, body in keys.items():
        s3_env.client().put_object(Bucket=bucket, Key=key, Body=body)
    report = sync(f"s3://{bucket}/my data+x/", tmp_path)
    assert report.transferred == 2
    assert (tmp_path / "a=1&b.txt").read_bytes() == b"1"
    assert (tmp_path / "ü" / "é.txt").read_bytes() == b"2"


def test_both_listings_agree(s3_env, bucket):
    """The CRT listing (CRT engine) and botocore's (classic engine) see the same objects."""
    keys = [f"l/{i:04d} +%&=ü.txt" for i in range(1003)] + ["l/sub/\x01ctl.txt", "l/"]
    put_objects(s3_env.client(), bucket, {k: k.encode() for k in keys})
    conn = _connect()
    loc = parse_s3_uri(f"s3://{bucket}/l")
    crt = list_objects(conn, loc, engine="crt")
    classic = list_objects(conn, loc, engine="classic")
    assert sorted(crt) == sorted(classic) and len(crt) == len(keys)
    assert {o.key for o in crt} == set(keys)
