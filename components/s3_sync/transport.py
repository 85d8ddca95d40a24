"""Talking to S3: where and how (``S3Connection``), clear errors, and the engines that move
the bytes.

Two engines share one interface: ``download(..., done)`` calls ``done(data, error)`` once when
the object has arrived (``data``: the bytes of an object up to ``IN_MEMORY_MAX``, a
``StreamedFile`` already written and hashed, or None when the bytes are in the temp file);
``upload(...)`` returns a future.

- ``crt`` — the AWS Common Runtime's S3 client (``awscrt.s3``): requests are signed, sent,
  retried (the CRT's exponential backoff, ``AWS_MAX_ATTEMPTS`` attempts) and split into
  parallel ranged parts / multipart uploads in native threads, which is what makes thousands of
  small objects fast from Python. Used when ``awscrt`` is importable.
- ``classic`` — botocore (its retry modes) + a thread pool: small objects with one GET/PUT each
  on a shared client with a large connection pool, big ones through s3transfer's
  ``TransferManager`` (multipart, parallel ranged GETs).

Neither engine is hand-written multipart or retry code; the caller verifies every download
(see core.py).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import re
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NamedTuple
from urllib.parse import quote, urlsplit

MiB = 1024 * 1024
PART_SIZE = 8 * MiB
"""Part size for multipart uploads and ranged downloads (also the multipart threshold)."""
IN_MEMORY_MAX = 256 * 1024
"""Objects up to this size are downloaded into memory, verified there and written by us: the
CRT's own file writing (``recv_filepath``) costs ~0.25 ms of CPU per file, more than the GET.
With at most a few hundred requests in flight this bounds the buffered bytes to ~64 MiB."""

CREDENTIAL_HINT = (
    "check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or AWS_PROFILE / the credentials file)"
)


class S3SyncError(RuntimeError):
    """A sync failed for a reason the user can fix; the message names what to check."""


class RemoteObject(NamedTuple):
    """One object of a listing (key relative to the sync prefix)."""

    rel: str
    key: str
    size: int
    etag: str


@dataclass(frozen=True)
class S3Location:
    bucket: str
    prefix: str  # "" or ending in "/"

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"


def parse_s3_uri(uri: str) -> S3Location:
    """``s3://bucket[/prefix]`` → location whose prefix is "" or ends with "/"."""
    rest = uri[len("s3://") :]
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise S3SyncError(f"S3 URI {uri!r} has no bucket; expected s3://bucket/prefix")
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    return S3Location(bucket=bucket, prefix=prefix)


def multipart_candidates(size: int, parts: int, hint: int | None = None) -> list[int]:
    """Part sizes that split ``size`` bytes into exactly ``parts`` parts (likely ones first)."""
    out: list[int] = []
    common = [hint] if hint else []
    common += [PART_SIZE, 5 * 2**20, 16 * 2**20, 15 * 2**20, 32 * 2**20, 64 * 2**20, 100 * 2**20]
    common += [8 * 10**6, 16 * 10**6, 10 * 2**20, 128 * 2**20, 256 * 2**20, 512 * 2**20]
    for ps in common:
        if ps and ps not in out and -(-size // ps) == parts:
            out.append(ps)
    return out


def crt_available() -> bool:
    """Whether the AWS CRT (``awscrt``, installed with ``botocore[crt]``) is importable."""
    try:
        import awscrt.s3  # noqa: F401
    except ImportError:
        return False
    return True


def _error_code(exc: BaseException) -> tuple[str, int | None, str]:
    """(S3 error code, HTTP status, message) of a botocore ClientError or a CRT S3ResponseError."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):  # botocore ClientError
        err = response.get("Error", {})
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return str(err.get("Code", "")), status, str(err.get("Message") or exc)
    status = getattr(exc, "status_code", None)
    body = getattr(exc, "body", None) or b""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes | bytearray) else str(body)
    code = re.search(r"<Code>([^<]*)</Code>", text)
    message = re.search(r"<Message>([^<]*)</Message>", text)
    return (
        code.group(1) if code else (str(status) if status else ""),
        status,
        message.group(1) if message else str(exc),
    )


# -- settings without botocore --------------------------------------------------------------
_PROFILE_KEYS_WE_MIRROR = {
    "aws_access_key_id",  # env credentials come first in botocore's chain: these are unused
    "aws_secret_access_key",
    "aws_session_token",
    "region",
    "output",  # aws-cli only
}
_DNS_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$")


@dataclass(frozen=True)
class EnvSettings:
    """Connection settings read from the environment alone, exactly as botocore would read them."""

    endpoint: str
    region: str
    addressing_style: str  # "path" or "virtual"
    access_key: str
    secret_key: str
    session_token: str | None
    max_attempts: int
    ca_bundle: str | None


def _profile_sections() -> list[dict[str, str]] | None:
    """The AWS config file's sections for the active profile ([] if none); None if unreadable or
    AWS_PROFILE names a profile that is not there (botocore reports that)."""
    path = os.path.expanduser(os.environ.get("AWS_CONFIG_FILE") or "~/.aws/config")
    named = os.environ.get("AWS_PROFILE") or os.environ.get("AWS_DEFAULT_PROFILE")
    profile = named or "default"
    if not os.path.exists(path):
        return None if named else []
    import configparser

    parser = configparser.RawConfigParser()
    try:
        parser.read(path, encoding="utf-8")
    except (configparser.Error, OSError, UnicodeDecodeError):
        return None
    found = [dict(parser[s]) for s in (f"profile {profile}", profile) if parser.has_section(s)]
    if named and not found:
        return None
    return found


def env_settings(
    *, endpoint_url: str | None, region: str | None, addressing_style: str | None
) -> EnvSettings | None:
    """Settings for talking to a self-hosted S3 (MinIO, SeaweedFS, ...) without botocore.

    Returned only when the environment decides every setting unambiguously, the way botocore
    would: static credentials in ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` (first in
    botocore's chain), a custom endpoint (argument, ``AWS_ENDPOINT_URL_S3`` or
    ``AWS_ENDPOINT_URL``), path or virtual addressing, and an AWS config profile that sets
    nothing but a region. Anything else (AWS itself with its endpoint rules and region redirects,
    SSO/role profiles, ``s3 =``/``services`` settings, FIPS/dual-stack) returns None, and
    botocore resolves the settings. This skips loading botocore's service models, which costs
    ~0.3 s per process: most of a no-op sync.
    """
    env = os.environ
    access_key, secret_key = env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY")
    if not access_key or not secret_key:
        return None
    ignore_env = env.get("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "").lower() == "true"
    endpoint = endpoint_url or (
        None if ignore_env else env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    )
    if not endpoint or addressing_style not in (None, "path", "virtual"):
        return None
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query:
        return None  # botocore says what is wrong with it
    if any(
        env.get(flag, "").lower() == "true"
        for flag in ("AWS_USE_FIPS_ENDPOINT", "AWS_USE_DUALSTACK_ENDPOINT")
    ):
        return None
    sections = _profile_sections()
    if sections is None or any(set(s) - _PROFILE_KEYS_WE_MIRROR for s in sections):
        return None
    profile_region = next((s["region"] for s in sections if s.get("region")), None)
    try:
        max_attempts = int(env.get("AWS_MAX_ATTEMPTS") or 4)
    except ValueError:
        return None
    return EnvSettings(
        endpoint=endpoint.rstrip("/"),
        region=region or env.get("AWS_DEFAULT_REGION") or profile_region or "us-east-1",
        addressing_style=addressing_style or "path",
        access_key=access_key,
        secret_key=secret_key,
        session_token=env.get("AWS_SESSION_TOKEN") or env.get("AWS_SECURITY_TOKEN") or None,
        max_attempts=max(1, max_attempts),
        ca_bundle=env.get("AWS_CA_BUNDLE") or None,
    )


_S3_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"
_MD5_ETAG_RE = re.compile(r"^[0-9a-f]{32}$")
_ETAG_PARTS_RE = re.compile(r"^[0-9a-f]{32}-\d+$")


class _NotRaised(Exception):
    """Never raised: stands in for botocore's exception types when the error is not botocore's."""


class _NoBotocoreErrors:
    NoCredentialsError = PartialCredentialsError = EndpointConnectionError = _NotRaised
    ConnectTimeoutError = ReadTimeoutError = ConnectionClosedError = _NotRaised
    ClientError = BotoCoreError = _NotRaised


_CONNECT_ERRORS = ("AWS_IO_SOCKET_", "AWS_IO_DNS_", "AWS_IO_TLS_", "AWS_ERROR_HTTP_CONNECTION")


class S3Connection:
    """Where and how to reach S3: endpoint, region, addressing, credentials, retries; the listing
    and small API calls; and error translation. Shared by all threads.

    Two ways to get there, same results:

    - *environment only* (``env_settings``): a self-hosted endpoint with credentials in the env.
      Listing, HEADs and transfers go through the AWS CRT; botocore is loaded only if something
      needs it (the classic engine, deleting objects for ``delete``). Saves ~0.3 s per run.
    - *botocore*: everything else (AWS itself, profiles, SSO, roles, ...): botocore resolves the
      endpoint, region and credentials and serves the listing.
    """

    def __init__(
        self,
        *,
        endpoint_url: str | None,
        region: str | None,
        addressing_style: str | None,
        max_concurrency: int,
        retry_mode: str | None = None,
        max_attempts: int | None = None,
        engine: str = "auto",
    ) -> None:
        self.max_concurrency = max_concurrency
        self._lock = threading.Lock()
        self._client = None
        self._crt = None
        self._bases: dict[str, tuple[str, str]] = {}
        self._retry_mode = retry_mode
        self.env = (
            env_settings(
                endpoint_url=endpoint_url, region=region, addressing_style=addressing_style
            )
            if engine != "classic" and crt_available()
            else None
        )
        if self.env is not None:
            self.endpoint = self.env.endpoint
            self.region = self.env.region
            self.max_attempts = max_attempts or self.env.max_attempts
            self._client_args = (self.endpoint, self.region, self.env.addressing_style)
        else:
            self._client_args = (endpoint_url, region, addressing_style)
            self._max_attempts_arg = max_attempts
            self._make_client()  # botocore resolves (and validates) everything now

    @property
    def client(self):
        """The botocore S3 client (made on first use when the environment decided the settings)."""
        with self._lock:
            if self._client is None:
                self._make_client()
            return self._client

    def _make_client(self) -> None:
        import boto3
        from botocore.config import Config

        endpoint_url, region, addressing_style = self._client_args
        self.session = boto3.session.Session(region_name=region)
        self.explicit_endpoint = endpoint_url
        # Retries: botocore's modes; AWS_RETRY_MODE / AWS_MAX_ATTEMPTS or the profile's
        # retry_mode / max_attempts win, else "standard" with 4 attempts (not botocore's legacy).
        profile = self.session._session.get_scoped_config() if self._has_profile() else {}
        max_attempts = int(
            (self.env and self.max_attempts)
            or getattr(self, "_max_attempts_arg", None)
            or os.environ.get("AWS_MAX_ATTEMPTS")
            or profile.get("max_attempts")
            or 4
        )
        retries: dict[str, Any] = {
            "mode": self._retry_mode
            or os.environ.get("AWS_RETRY_MODE")
            or profile.get("retry_mode")
            or "standard",
            "max_attempts": max_attempts,
        }
        s3_config: dict[str, Any] = {}
        custom_endpoint = (
            endpoint_url
            or os.environ.get("AWS_ENDPOINT_URL_S3")
            or os.environ.get("AWS_ENDPOINT_URL")
        )
        configured = (profile.get("s3") or {}).get("addressing_style")
        if addressing_style:
            s3_config["addressing_style"] = addressing_style
        elif custom_endpoint and not configured:
            # MinIO/SeaweedFS/... behind a custom endpoint all serve path-style; virtual-hosted
            # needs DNS for bucket.host, which such setups rarely have.
            s3_config["addressing_style"] = "path"
        self.config = Config(
            max_pool_connections=max(10, self.max_concurrency * 2),
            retries=retries,
            connect_timeout=10,
            read_timeout=60,
            s3=s3_config or None,
            # Integrity: PUTs carry a CRC32 the server checks; GETs check a checksum if present.
            request_checksum_calculation="when_supported",
            response_checksum_validation="when_supported",
        )
        if self.session.region_name is None:
            # Custom endpoints (MinIO, SeaweedFS) do not care, but SigV4 needs some region.
            self.session = boto3.session.Session(region_name="us-east-1")
        # LastModified is never used; botocore's dateutil parsing of it is the costliest part of
        # a big listing (~0.2 ms/object), so keep timestamps as the raw strings.
        self.session._session.get_component("response_parser_factory").set_parser_defaults(
            timestamp_parser=str
        )
        self._client = self.session.client("s3", endpoint_url=endpoint_url, config=self.config)
        if self.env is None:
            self.endpoint = self._client.meta.endpoint_url
            self.region = self._client.meta.region_name
            self.max_attempts = max_attempts

    def _has_profile(self) -> bool:
        try:
            self.session._session.get_scoped_config()
        except Exception:  # noqa: BLE001 - e.g. AWS_PROFILE names a missing profile
            return False
        return True

    # -- the CRT client ----------------------------------------------------------------------
    def crt(self):
        """The one ``awscrt.s3.S3Client`` of this connection (made on first use)."""
        with self._lock:
            if self._crt is None:
                self._crt = self._make_crt()
            return self._crt

    def _make_crt(self):
        from awscrt.auth import AwsCredentialsProvider
        from awscrt.io import ClientBootstrap, DefaultHostResolver, EventLoopGroup
        from awscrt.s3 import S3Client, S3RequestTlsMode, S3RetryConfig

        if self.env is not None:
            provider = AwsCredentialsProvider.new_static(
                self.env.access_key, self.env.secret_key, self.env.session_token
            )
            ca_bundle = self.env.ca_bundle
        else:
            from s3transfer.crt import BotocoreCRTCredentialsWrapper

            credentials = self.session._session.get_credentials()
            if credentials is None:
                from botocore.exceptions import NoCredentialsError

                raise NoCredentialsError()
            provider = BotocoreCRTCredentialsWrapper(credentials).to_crt_credentials_provider()
            ca_bundle = os.environ.get(
                "AWS_CA_BUNDLE"
            ) or self.session._session.get_config_variable("ca_bundle")
        tls = S3RequestTlsMode.ENABLED
        tls_options = None
        if self.endpoint.startswith("http:"):
            tls = S3RequestTlsMode.DISABLED
        elif ca_bundle:  # e.g. a MinIO with its own CA: trust what botocore would trust
            from awscrt.io import ClientTlsContext, TlsContextOptions

            ctx = TlsContextOptions()
            ctx.override_default_trust_store_from_path(ca_filepath=ca_bundle)
            tls_options = ClientTlsContext(ctx).new_connection_options()
        elg = EventLoopGroup()
        return S3Client(
            bootstrap=ClientBootstrap(elg, DefaultHostResolver(elg)),
            region=self.region,
            credential_provider=provider,
            tls_mode=tls,
            tls_connection_options=tls_options,
            part_size=PART_SIZE,
            multipart_upload_threshold=PART_SIZE,
            throughput_target_gbps=max(1.0, self.max_concurrency * 0.3),
            retry_config=S3RetryConfig(max_retries=max(1, self.max_attempts - 1)),
            connect_timeout_ms=10_000,
        )

    _KEY_SENTINEL = "S3SYNC-KEY-SENTINEL"

    def bucket_base(self, bucket: str) -> tuple[str, str]:
        """(Host header, path prefix ending in "/") under which ``bucket``'s keys live."""
        with self._lock:
            base = self._bases.get(bucket)
        if base is not None:
            return base
        if self.env is not None:
            parts = urlsplit(self.endpoint)
            path = parts.path.rstrip("/")
            virtual = self.env.addressing_style == "virtual"
            if virtual and not (
                _DNS_BUCKET_RE.match(bucket) and (parts.scheme == "http" or "." not in bucket)
            ):
                raise S3SyncError(
                    f"bucket {bucket!r} cannot be addressed virtual-hosted style at "
                    f"{self.endpoint} (not a DNS name); use --addressing-style path"
                )
            host = f"{bucket}.{parts.netloc}" if virtual else parts.netloc
            base = (host, f"{path}/" if virtual else f"{path}/{quote(bucket, safe='')}/")
        else:
            url = self.client.generate_presigned_url(
                "get_object", Params={"Bucket": bucket, "Key": self._KEY_SENTINEL}
            )
            parts = urlsplit(url)
            base = (parts.netloc, parts.path[: parts.path.index(self._KEY_SENTINEL)])
        with self._lock:
            self._bases[bucket] = base
        return base

    def crt_request(self, method: str, bucket: str, key: str, headers=(), query: str = ""):
        """An ``awscrt.http.HttpRequest`` for ``key`` in ``bucket`` (the CRT signs it)."""
        from awscrt.http import HttpHeaders, HttpRequest

        host, prefix = self.bucket_base(bucket)
        # a bucket-level request (listing) addresses "/bucket", like botocore, not "/bucket/"
        path = prefix + quote(key, safe="/~") if key else (prefix.rstrip("/") or "/")
        if query:
            path += f"?{query}"
        return HttpRequest(method, path, HttpHeaders([("Host", host), *headers]))

    # -- errors ------------------------------------------------------------------------------
    def translate(self, exc: BaseException, *, bucket: str, key: str | None = None) -> S3SyncError:
        """Turn a botocore/CRT exception into one S3SyncError that says what to check."""
        where = f"s3://{bucket}/{key}" if key else f"bucket {bucket!r}"
        at = f"at endpoint {self.endpoint}"
        if isinstance(exc, S3SyncError):
            return exc
        if type(exc).__module__.startswith("botocore"):
            from botocore import exceptions as bex
        else:  # not a botocore error (and botocore may not even be loaded)
            bex = _NoBotocoreErrors
        from_crt = type(exc).__module__.startswith("awscrt")
        crt_name = str(getattr(exc, "name", "")) if from_crt else ""
        if crt_name.startswith("AWS_IO_TLS_") or type(exc).__name__ == "SSLError":
            return S3SyncError(
                f"TLS with the S3 endpoint {self.endpoint} failed (for {where}): "
                f"{crt_name + ': ' if crt_name else ''}{getattr(exc, 'message', exc)}; if the "
                "server's certificate comes from a CA of your own, point AWS_CA_BUNDLE at that "
                "CA's PEM file; else check --endpoint-url (https:// vs http://)"
            )
        if crt_name.startswith(_CONNECT_ERRORS):
            return S3SyncError(
                f"cannot reach the S3 endpoint {self.endpoint} (for {where}): {crt_name}: "
                f"{getattr(exc, 'message', exc)}; check --endpoint-url / AWS_ENDPOINT_URL_S3 / "
                "AWS_ENDPOINT_URL, that the server is up and that the network allows it"
            )
        if "CHECKSUM_MISMATCH" in crt_name or type(exc).__name__ == "FlexibleChecksumError":
            return S3SyncError(
                f"{where}: the bytes received do not match the object's S3 checksum "
                f"({crt_name or exc}); the download is corrupt or the object changed - re-run"
            )
        if isinstance(exc, bex.NoCredentialsError | bex.PartialCredentialsError):
            return S3SyncError(f"no S3 credentials found for {where} {at}: {CREDENTIAL_HINT}")
        if isinstance(
            exc,
            bex.EndpointConnectionError
            | bex.ConnectTimeoutError
            | bex.ReadTimeoutError
            | bex.ConnectionClosedError,
        ):
            return S3SyncError(
                f"cannot reach the S3 endpoint {self.endpoint} (for {where}): {exc}; check "
                "--endpoint-url / AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, that the server is up "
                "and that the network allows it"
            )
        is_crt_response = type(exc).__name__ == "S3ResponseError"
        if isinstance(exc, bex.ClientError) or is_crt_response:
            code, status, msg = _error_code(exc)
            if code == "NoSuchBucket" or (code in ("404", "NotFound") and key is None):
                return S3SyncError(
                    f"bucket {bucket!r} does not exist {at}; check the bucket name in the URI "
                    "and the endpoint/region (--endpoint-url, AWS_ENDPOINT_URL_S3, "
                    "AWS_DEFAULT_REGION)"
                )
            if code in (
                "InvalidAccessKeyId",
                "SignatureDoesNotMatch",
                "InvalidToken",
                "ExpiredToken",
                "InvalidClientTokenId",
                "AuthorizationHeaderMalformed",
            ):
                return S3SyncError(
                    f"the S3 credentials were rejected ({code}) {at} for {where}: "
                    f"{CREDENTIAL_HINT}, and the region ({self.region})"
                )
            if code in ("AccessDenied", "403", "AllAccessDisabled") or status == 403:
                return S3SyncError(
                    f"access denied to {where} {at} ({code or status}): check that the "
                    "credentials' policy allows s3:ListBucket, s3:GetObject, s3:PutObject "
                    f"(and s3:DeleteObject for --delete) on it; {CREDENTIAL_HINT}"
                )
            if code in ("NoSuchKey", "404", "NotFound"):
                return S3SyncError(f"{where} vanished during the sync {at} ({code}); re-run it")
            if code in ("PreconditionFailed", "412"):
                return S3SyncError(f"{where} changed during the sync {at}; re-run it")
            if code == "BadDigest" or code == "InvalidDigest":
                return S3SyncError(
                    f"{where}: the server received different bytes than were sent ({code}); "
                    "re-run the sync"
                )
            return S3SyncError(f"S3 error {code or status} for {where} {at}: {msg}")
        try:
            from awscrt.exceptions import AwsCrtError
        except ImportError:  # pragma: no cover - awscrt is optional
            AwsCrtError = ()  # type: ignore[assignment]  # noqa: N806
        if AwsCrtError and isinstance(exc, AwsCrtError):
            return S3SyncError(
                f"transfer of {where} {at} failed: {exc.name}: {exc.message}; check the "
                "endpoint, the credentials and that the object did not change during the sync"
            )
        if isinstance(exc, bex.BotoCoreError):
            return S3SyncError(f"S3 request for {where} {at} failed: {exc}")
        if isinstance(exc, OSError):
            return S3SyncError(f"local I/O error while syncing {where}: {exc}")
        return S3SyncError(f"sync of {where} {at} failed: {type(exc).__name__}: {exc}")

    # -- listing -----------------------------------------------------------------------------
    def list_objects(self, loc: S3Location) -> list[RemoteObject]:
        """Every object under the prefix (paged; one pass). Raises S3SyncError."""
        try:
            if self.env is not None:
                return self._list_crt(loc)
            return self._list_botocore(loc)
        except Exception as exc:
            raise self.translate(exc, bucket=loc.bucket) from exc

    def _list_botocore(self, loc: S3Location) -> list[RemoteObject]:
        out: list[RemoteObject] = []
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=loc.bucket, Prefix=loc.prefix):
            for obj in page.get("Contents", ()):
                key = obj["Key"]
                out.append(
                    RemoteObject(
                        rel=key[len(loc.prefix) :],
                        key=key,
                        size=int(obj["Size"]),
                        etag=str(obj.get("ETag", "")).strip('"'),
                    )
                )
        return out

    def _list_crt(self, loc: S3Location) -> list[RemoteObject]:
        """ListObjectsV2 pages through the CRT (signed, retried natively), parsed with the C
        ElementTree; keys come URL-encoded (``encoding-type=url``) and are decoded like
        botocore does, so control characters in keys survive the XML."""
        import xml.etree.ElementTree as ET
        from urllib.parse import unquote_plus

        from awscrt.s3 import S3RequestType

        out: list[RemoteObject] = []
        cut = len(loc.prefix)
        token: str | None = None
        contents, key_tag, size_tag, etag_tag = (
            _S3_NS + "Contents",
            _S3_NS + "Key",
            _S3_NS + "Size",
            _S3_NS + "ETag",
        )
        while True:
            params = [("encoding-type", "url"), ("list-type", "2"), ("prefix", loc.prefix)]
            if token:
                params.insert(0, ("continuation-token", token))
            query = "&".join(f"{k}={quote(v, safe='-_.~')}" for k, v in params)
            body: list[bytes] = []
            meta = self.crt().make_request(
                type=S3RequestType.DEFAULT,
                request=self.crt_request("GET", loc.bucket, "", query=query),
                operation_name="ListObjectsV2",
                on_body=lambda chunk, body=body, **_: body.append(bytes(chunk)),
            )
            meta.finished_future.result()
            root = ET.fromstring(b"".join(body))
            encoded = root.findtext(_S3_NS + "EncodingType") == "url"
            for node in root.iter(contents):
                key = node.findtext(key_tag) or ""
                if encoded:
                    key = unquote_plus(key)
                out.append(
                    RemoteObject(
                        rel=key[cut:],
                        key=key,
                        size=int(node.findtext(size_tag) or 0),
                        etag=(node.findtext(etag_tag) or "").strip('"'),
                    )
                )
            token = root.findtext(_S3_NS + "NextContinuationToken")
            if root.findtext(_S3_NS + "IsTruncated") != "true" or not token:
                return out

    def delete_keys(self, bucket: str, keys: list[str]) -> None:
        try:
            for start in range(0, len(keys), 1000):
                chunk = keys[start : start + 1000]
                resp = self.client.delete_objects(
                    Bucket=bucket,
                    Delete={"Objects": [{"Key": k} for k in chunk], "Quiet": True},
                )
                errors = resp.get("Errors") or []
                if errors:
                    first = errors[0]
                    raise S3SyncError(
                        f"could not delete {len(errors)} object(s) in bucket {bucket!r}, e.g. "
                        f"{first.get('Key')!r}: {first.get('Code')} {first.get('Message')}"
                    )
        except Exception as exc:
            raise self.translate(exc, bucket=bucket) from exc

    def first_part_size(self, bucket: str, key: str) -> int | None:
        """Size of part 1 of a multipart object (HEAD ?partNumber=1), or None if unknown."""
        try:
            if self.env is not None:
                return self._first_part_size_crt(bucket, key)
            resp = self.client.head_object(Bucket=bucket, Key=key, PartNumber=1)
        except Exception:  # noqa: BLE001 - not all servers support it; the caller falls back
            return None
        parts = resp.get("PartsCount")
        return int(resp["ContentLength"]) if parts else None

    def _first_part_size_crt(self, bucket: str, key: str) -> int | None:
        from awscrt.s3 import S3RequestType

        got: dict[str, str] = {}

        def on_headers(status_code, headers, **_) -> None:
            if status_code in (200, 206):
                got.update((k.lower(), v) for k, v in headers)

        self.crt().make_request(
            type=S3RequestType.DEFAULT,
            request=self.crt_request("HEAD", bucket, key, query="partNumber=1"),
            operation_name="HeadObject",
            on_headers=on_headers,
        ).finished_future.result()
        if not got.get("x-amz-mp-parts-count"):
            return None
        return int(got["content-length"])


class _DoneSubscriber:
    """s3transfer subscriber: progress, and a concurrent Future resolved when all is done."""

    def __init__(self, on_bytes, done: Future) -> None:
        self._on_bytes = on_bytes
        self._done = done

    def on_queued(self, future, **kwargs) -> None:
        pass

    def on_progress(self, future, bytes_transferred, **kwargs) -> None:
        self._on_bytes(bytes_transferred)

    def on_done(self, future, **kwargs) -> None:
        try:
            future.result()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            self._done.set_exception(exc)
        else:
            self._done.set_result(None)


class StreamedFile:
    """A download written to its temp file as the body arrives, hashed on the way.

    After the transfer ``etag`` is the S3 ETag of the bytes (MD5, or ``md5-of-part-md5s-N``
    for ``part_size``) and ``md5`` the whole file's MD5 (single-part objects), or None for
    what could not be computed (multipart with an unknown part size, or a body that did not
    arrive in order): the caller then hashes the file.
    """

    def __init__(self, path: str, part_size: int | None, *, multipart: bool, on_bytes=None) -> None:
        self.path = path
        self.on_bytes = on_bytes
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        self.offset = 0
        self.hashing = not multipart or part_size is not None  # else: unknown part size
        self.part_size = part_size
        self.multipart = multipart
        self._hash = hashlib.md5(usedforsecurity=False)
        self._in_part = 0
        self._parts: list[bytes] = []
        self.md5: str | None = None
        self.etag: str | None = None

    def write(self, chunk, offset: int, **_) -> None:
        """The CRT's on_body callback (a transfer thread)."""
        view = memoryview(chunk)
        done = 0
        while done < len(view):
            done += os.pwrite(self.fd, view[done:], offset + done)
        if offset != self.offset:  # never seen: the CRT delivers bodies in order
            self.hashing = False
        self.offset = offset + len(view)
        if self.on_bytes is not None:
            self.on_bytes(len(view))
        if not self.hashing:
            return
        if not self.multipart:
            self._hash.update(view)
            return
        while view:  # split at the ETag's part boundaries
            take = min(len(view), self.part_size - self._in_part)
            self._hash.update(view[:take])
            self._in_part += take
            view = view[take:]
            if self._in_part == self.part_size:
                self._parts.append(self._hash.digest())
                self._hash = hashlib.md5(usedforsecurity=False)
                self._in_part = 0

    def close(self, error: BaseException | None) -> BaseException | None:
        try:
            os.close(self.fd)
        except OSError as exc:
            error = error or exc
        if error is None and self.hashing:
            if not self.multipart:
                self.md5 = self.etag = self._hash.hexdigest()
            else:
                if self._in_part:
                    self._parts.append(self._hash.digest())
                digest = hashlib.md5(b"".join(self._parts), usedforsecurity=False).hexdigest()
                self.etag = f"{digest}-{len(self._parts)}"
        return error


def _relay(fut: Future, done) -> None:
    """Hand a finished future's outcome to a ``done(data, error)`` callback."""
    if fut.cancelled():
        done(None, S3SyncError("the sync was interrupted before this transfer started"))
        return
    error = fut.exception()
    done(None if error is not None else fut.result(), error)


class ClassicEngine:
    """botocore on a thread pool for small objects (one GET/PUT each on a shared client); an
    s3transfer ``TransferManager`` (multipart, parallel ranged GETs) for objects >= PART_SIZE."""

    name = "classic"

    def __init__(self, conn: S3Connection, *, max_concurrency: int) -> None:
        from boto3.s3.transfer import TransferConfig

        self.conn = conn
        self.pool = ThreadPoolExecutor(max_concurrency, thread_name_prefix="s3sync")
        self.transfer_config = TransferConfig(
            multipart_threshold=PART_SIZE,
            multipart_chunksize=PART_SIZE,
            max_concurrency=min(16, max_concurrency),
            use_threads=True,
        )
        self._manager = None
        self._lock = threading.Lock()

    def _big(self):
        with self._lock:
            if self._manager is None:
                from s3transfer.manager import TransferManager

                self._manager = TransferManager(self.conn.client, self.transfer_config)
            return self._manager

    def download(
        self, bucket: str, key: str, size: int, etag: str, temp_path: str, on_bytes, done
    ) -> None:
        """Fetch one object; see ``CrtEngine.download`` for ``done``."""
        if size >= PART_SIZE:
            fut: Future = Future()
            self._big().download(
                bucket, key, temp_path, subscribers=[_DoneSubscriber(on_bytes, fut)]
            )
        else:
            fut = self.pool.submit(
                self._download_small, bucket, key, size, etag, temp_path, on_bytes
            )
        fut.add_done_callback(lambda f: _relay(f, done))

    def _download_small(self, bucket, key, size, etag, temp_path, on_bytes) -> bytes | None:
        extra: dict[str, str] = {}
        if not _MD5_ETAG_RE.match(etag):  # bytes not checkable by MD5: ask S3 to check them
            extra["ChecksumMode"] = "ENABLED"
            if etag:
                extra["IfMatch"] = f'"{etag}"'
        resp = self.conn.client.get_object(Bucket=bucket, Key=key, **extra)
        body = resp["Body"]
        if size <= IN_MEMORY_MAX:
            data = body.read()
            on_bytes(size)
            return data
        with open(temp_path, "wb") as fh:
            for chunk in iter(lambda: body.read(1024 * 1024), b""):
                fh.write(chunk)
        on_bytes(size)
        return None

    def upload(self, path: str, bucket: str, key: str, size: int, md5: str, on_bytes) -> Future:
        if size >= PART_SIZE:
            done: Future = Future()
            self._big().upload(path, bucket, key, subscribers=[_DoneSubscriber(on_bytes, done)])
            return done
        return self.pool.submit(self._upload_small, path, bucket, key, size, md5, on_bytes)

    def _upload_small(self, path, bucket, key, size, md5, on_bytes) -> None:
        with open(path, "rb") as fh:
            data = fh.read()
        if hashlib.md5(data, usedforsecurity=False).hexdigest() != md5:
            raise S3SyncError(f"local file {path} changed while it was being uploaded; re-run")
        # Content-MD5: the server refuses the PUT if the bytes it got differ.
        self.conn.client.put_object(
            Bucket=bucket,
            Key=key,
            Body=data,
            ContentMD5=base64.b64encode(bytes.fromhex(md5)).decode(),
        )
        on_bytes(size)

    def shutdown(self, *, cancel: bool = False) -> None:
        self.pool.shutdown(wait=not cancel, cancel_futures=cancel)
        if self._manager is not None:
            if cancel:
                # s3transfer 0.19's shutdown(cancel=True) passes its arguments in the wrong
                # order (TypeError); leaving the context manager on an interrupt cancels right.
                interrupt = KeyboardInterrupt("sync interrupted")
                self._manager.__exit__(KeyboardInterrupt, interrupt, None)
            else:
                self._manager.shutdown()


class CrtEngine:
    """The AWS CRT S3 client (``awscrt.s3``): native event loops sign, send, retry and split
    objects into parallel ranged GETs / multipart PUTs; bodies come to Python in order.

    Per object, Python only builds a small HTTP request; the bucket's address (endpoint,
    addressing style, region) and the credentials come from the connection (botocore's or the
    environment's, see ``S3Connection``).
    """

    name = "crt"

    def __init__(self, conn: S3Connection, *, max_concurrency: int) -> None:
        from awscrt.s3 import S3ChecksumAlgorithm, S3ChecksumConfig, S3ChecksumLocation

        self.conn = conn
        self.client = conn.crt()
        self._lock = threading.Lock()
        self._inflight: dict = {}
        self._get_checksums = S3ChecksumConfig(validate_response=True)
        self._put_checksums = S3ChecksumConfig(
            algorithm=S3ChecksumAlgorithm.CRC32, location=S3ChecksumLocation.TRAILER
        )

    def download(
        self, bucket: str, key: str, size: int, etag: str, temp_path: str, on_bytes, done
    ) -> None:
        """Fetch one object. ``done(data, error)`` is called once, on some transfer thread:
        ``data`` holds the bytes of an object up to ``IN_MEMORY_MAX`` (nothing written), else
        None and the bytes are in ``temp_path``; ``error`` is the exception or None.
        Verifying the bytes is the caller's job (``_Download``)."""
        from awscrt.s3 import S3RequestType

        if size <= IN_MEMORY_MAX and _MD5_ETAG_RE.match(etag):
            # The caller checks these bytes against the listed ETag, their MD5: that one check
            # covers integrity and "same version as listed", so no If-Match/checksum round (on
            # SeaweedFS they cost the server ~30% more per GET). A plain request (DEFAULT), not
            # the CRT's GET_OBJECT machinery with its part-size buffer per object.
            chunks: list[bytes] = []
            kind, request = S3RequestType.DEFAULT, self.conn.crt_request("GET", bucket, key)
            extra: dict[str, Any] = {
                "on_body": lambda chunk, **_: chunks.append(bytes(chunk)),
            }
            result = chunks
        else:
            headers = [("x-amz-checksum-mode", "ENABLED")]
            if etag:  # the bytes of the version we listed, or a clean 412
                headers.append(("If-Match", f'"{etag}"'))
            kind = S3RequestType.GET_OBJECT  # parallel ranged GETs for big objects
            request = self.conn.crt_request("GET", bucket, key, headers)
            extra = {"checksum_config": self._get_checksums}
            if size <= IN_MEMORY_MAX:
                chunks = []
                extra["on_body"] = lambda chunk, **_: chunks.append(bytes(chunk))
                result = chunks
            else:
                # The CRT hands the body over in order: write it and hash it on the way, so the
                # file is never read back (recv_filepath would also cost 3x the system time).
                # A multipart ETag is hashed with the likeliest part size for its part count;
                # if that was not it, the caller asks S3 (HEAD ?partNumber=1) and re-hashes.
                part_size = None
                match = _ETAG_PARTS_RE.match(etag)
                if match:
                    likely = multipart_candidates(size, int(etag.rsplit("-", 1)[1]))
                    part_size = likely[0] if likely else None
                result = stream = StreamedFile(
                    temp_path, part_size, multipart=bool(match), on_bytes=on_bytes
                )
                extra["on_body"] = stream.write
        token = object()
        ended: list[bool] = []

        def finished(*, error=None, **_) -> None:
            with self._lock:
                self._inflight.pop(token, None)
                ended.append(True)
            if isinstance(result, StreamedFile):
                error = result.close(error)
            if error is None:
                if not isinstance(result, StreamedFile):  # that one counted as it went
                    on_bytes(size)
                done(b"".join(result) if isinstance(result, list) else result, None)
            else:
                done(None, error)

        try:
            meta = self.client.make_request(
                type=kind, request=request, operation_name="GetObject", on_done=finished, **extra
            )
        except BaseException:
            if isinstance(result, StreamedFile):
                result.close(None)
            raise
        self._track(token, meta, ended)

    def upload(self, path: str, bucket: str, key: str, size: int, md5: str, on_bytes) -> Future:
        from awscrt.s3 import S3RequestType

        headers = [("Content-Length", str(size)), ("Content-Type", "application/octet-stream")]
        if size < PART_SIZE:  # one PUT: the server also checks the whole body's MD5
            headers.append(("Content-MD5", base64.b64encode(bytes.fromhex(md5)).decode()))
        meta = self.client.make_request(
            type=S3RequestType.PUT_OBJECT,
            request=self.conn.crt_request("PUT", bucket, key, headers),
            operation_name="PutObject",
            send_filepath=path,
            checksum_config=self._put_checksums,
            on_progress=on_bytes if size >= PART_SIZE else None,
        )
        return self._future(meta, on_bytes, 0 if size >= PART_SIZE else size)

    def _track(self, token: object, meta, ended: list) -> None:
        """Keep ``meta`` referenced until it finishes (and cancellable on shutdown). Not under
        the lock during ``make_request``: its callback may already be running."""
        with self._lock:
            if not ended:
                self._inflight[token] = meta

    def _future(self, meta, on_bytes, size_when_done: int) -> Future:
        done: Future = Future()
        token = object()
        ended: list[bool] = []

        def finished(crt_future) -> None:
            with self._lock:
                self._inflight.pop(token, None)
                ended.append(True)
            exc = crt_future.exception()
            if exc is not None:
                done.set_exception(exc)
                return
            if size_when_done:
                on_bytes(size_when_done)
            done.set_result(None)

        self._track(token, meta, ended)
        meta.finished_future.add_done_callback(finished)
        return done

    def shutdown(self, *, cancel: bool = False) -> None:
        with self._lock:
            inflight = list(self._inflight.values())
        for meta in inflight:
            if cancel:
                meta.cancel()
        for meta in inflight:
            with contextlib.suppress(Exception):
                meta.finished_future.result(timeout=30)


def make_engine(conn: S3Connection, *, engine: str, max_concurrency: int):
    """``engine``: "auto" (CRT when awscrt is installed), "crt" or "classic"."""
    if engine == "auto":
        engine = "crt" if crt_available() else "classic"
    if engine == "crt":
        if not crt_available():
            raise S3SyncError(
                "engine='crt' needs the AWS CRT: pip install 'botocore[crt]' (or use "
                "engine='classic')"
            )
        return CrtEngine(conn, max_concurrency=max_concurrency)
    return ClassicEngine(conn, max_concurrency=max_concurrency)
