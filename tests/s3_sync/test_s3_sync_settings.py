"""How the connection settings are found: from the environment alone (no botocore) only when
that gives exactly what botocore would; otherwise botocore. Both ways against the real server."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from components.s3_sync import S3SyncError, sync
from components.s3_sync.transport import S3Connection, env_settings

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
    return monkeypatch


def _settings(**kw):
    return env_settings(
        endpoint_url=kw.get("endpoint_url"),
        region=kw.get("region"),
        addressing_style=kw.get("addressing_style"),
    )


def _with_keys(env) -> None:
    env.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    env.setenv("AWS_SECRET_ACCESS_KEY", "secret-example")


def test_env_decides_a_self_hosted_endpoint(clean_env):
    _with_keys(clean_env)
    clean_env.setenv("AWS_ENDPOINT_URL", "http://generic:1")
    clean_env.setenv("AWS_ENDPOINT_URL_S3", "http://s3-specific:2/")
    got = _settings()
    assert got is not None
    assert (got.endpoint, got.region, got.addressing_style) == (
        "http://s3-specific:2",
        "us-east-1",
        "path",
    )
    assert got.max_attempts == 4 and got.session_token is None
    assert _settings(endpoint_url="https://arg:3").endpoint == "https://arg:3"
    clean_env.delenv("AWS_ENDPOINT_URL_S3")
    assert _settings().endpoint == "http://generic:1"
    clean_env.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    clean_env.setenv("AWS_REGION", "ignored-by-botocore-for-s3")
    clean_env.setenv("AWS_MAX_ATTEMPTS", "7")
    clean_env.setenv("AWS_SESSION_TOKEN", "tok")
    got = _settings(addressing_style="virtual")
    assert (got.region, got.max_attempts, got.session_token) == ("eu-west-1", 7, "tok")
    assert got.addressing_style == "virtual"
    assert _settings(region="ap-south-1").region == "ap-south-1"


@pytest.mark.parametrize(
    "case",
    [
        "no-keys",
        "only-access-key",
        "aws-itself",
        "ignore-configured-endpoints",
        "auto-addressing",
        "fips",
        "bad-max-attempts",
        "missing-profile",
        "profile-with-s3-settings",
        "profile-with-role",
        "profile-with-endpoint",
    ],
)
def test_anything_else_is_left_to_botocore(clean_env, tmp_path, case):
    _with_keys(clean_env)
    clean_env.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9")
    config = tmp_path / "aws-config"
    kw = {}
    if case == "no-keys":
        clean_env.delenv("AWS_ACCESS_KEY_ID")
        clean_env.delenv("AWS_SECRET_ACCESS_KEY")
    elif case == "only-access-key":
        clean_env.delenv("AWS_SECRET_ACCESS_KEY")
    elif case == "aws-itself":
        clean_env.delenv("AWS_ENDPOINT_URL_S3")
    elif case == "ignore-configured-endpoints":
        clean_env.setenv("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "true")
    elif case == "auto-addressing":
        kw["addressing_style"] = "auto"
    elif case == "fips":
        clean_env.setenv("AWS_USE_FIPS_ENDPOINT", "true")
    elif case == "bad-max-attempts":
        clean_env.setenv("AWS_MAX_ATTEMPTS", "many")
    elif case == "missing-profile":
        clean_env.setenv("AWS_PROFILE", "nope")
    elif case == "profile-with-s3-settings":
        config.write_text("[default]\nregion = eu-west-1\ns3 =\n  addressing_style = virtual\n")
    elif case == "profile-with-role":
        clean_env.setenv("AWS_PROFILE", "dev")
        config.write_text("[profile dev]\nrole_arn = arn:aws:iam::1:role/x\nsource_profile = a\n")
    elif case == "profile-with-endpoint":
        config.write_text("[default]\nendpoint_url = http://elsewhere:1\n")
    assert _settings(**kw) is None


def test_a_profile_that_only_sets_a_region_is_read(clean_env, tmp_path):
    _with_keys(clean_env)
    clean_env.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9")
    (tmp_path / "aws-config").write_text(
        "[default]\nregion = eu-north-1\noutput = json\n\n[profile dev]\nregion = sa-east-1\n"
    )
    assert _settings().region == "eu-north-1"
    clean_env.setenv("AWS_PROFILE", "dev")
    assert _settings().region == "sa-east-1"
    clean_env.setenv("AWS_DEFAULT_REGION", "us-west-2")  # the env wins, as in botocore
    assert _settings().region == "us-west-2"


@pytest.mark.parametrize(
    ("endpoint", "style"),
    [
        ("http://127.0.0.1:9000", None),
        ("http://127.0.0.1:9000", "path"),
        ("http://minio.internal:9000/", "path"),
        ("http://minio.internal:9000", "virtual"),
        ("https://storage.example.com/s3", "path"),
        ("https://storage.example.com", "virtual"),
    ],
)
def test_bucket_addresses_equal_botocores(clean_env, endpoint, style):
    _with_keys(clean_env)
    kw = dict(endpoint_url=endpoint, region=None, addressing_style=style, max_concurrency=4)
    ours = S3Connection(**kw)
    assert ours.env is not None
    theirs = S3Connection(**kw, engine="classic")  # botocore resolves it
    assert theirs.env is None
    assert ours.region == theirs.region
    for bucket in ("data", "my-bucket-01"):
        assert ours.bucket_base(bucket) == theirs.bucket_base(bucket), bucket
    assert ours._client is None  # no botocore client was needed


def test_virtual_addressing_refuses_a_bucket_that_is_no_dns_name(clean_env):
    _with_keys(clean_env)
    conn = S3Connection(
        endpoint_url="https://storage.example.com",
        region=None,
        addressing_style="virtual",
        max_concurrency=4,
    )
    with pytest.raises(S3SyncError, match="addressing-style path"):
        conn.bucket_base("dotted.bucket.name")


def test_cli_never_loads_botocore_for_a_self_hosted_endpoint(s3_env, bucket, tmp_path):
    s3_env.client().put_object(Bucket=bucket, Key="d/a.txt", Body=b"a")
    s3_env.client().put_object(Bucket=bucket, Key="d/sub dir/b+c.txt", Body=b"bc")
    script = textwrap.dedent(
        f"""
        import sys
        from components.s3_sync.__main__ import main
        for _ in range(2):  # a download, then a no-op re-sync
            assert main(["--quiet", "s3://{bucket}/d", {str(tmp_path / "out")!r}]) == 0
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("botocore", "boto3"))
        print("LOADED", loaded)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "LOADED []" in proc.stdout
    assert "transferred 2 of 2" in proc.stdout and "transferred 0 of 2" in proc.stdout
    assert (tmp_path / "out" / "sub dir" / "b+c.txt").read_bytes() == b"bc"


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
    assert conn.env is None and conn.endpoint == s3_env.endpoint_url
    s3_env.client().put_object(Bucket=bucket, Key="p/x.bin", Body=b"x" * 5000)
    report = sync(f"s3://{bucket}/p", tmp_path / "down")
    assert report.transferred == 1 and report.engine == "crt"
    assert (tmp_path / "down" / "x.bin").read_bytes() == b"x" * 5000
    (tmp_path / "down" / "y.bin").write_bytes(b"y")
    assert sync(tmp_path / "down", f"s3://{bucket}/p").transferred == 1
    assert s3_env.client().get_object(Bucket=bucket, Key="p/y.bin")["Body"].read() == b"y"


def test_listing_a_prefix_with_reserved_characters(s3_env, bucket, tmp_path):
    keys = {"my data+x/a=1&b.txt": b"1", "my data+x/ü/é.txt": b"2", "my data+xy/no.txt": b"3"}
    for key, body in keys.items():
        s3_env.client().put_object(Bucket=bucket, Key=key, Body=body)
    report = sync(f"s3://{bucket}/my data+x/", tmp_path)
    assert report.transferred == 2
    assert (tmp_path / "a=1&b.txt").read_bytes() == b"1"
    assert (tmp_path / "ü" / "é.txt").read_bytes() == b"2"
