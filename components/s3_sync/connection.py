"""Where and how to reach S3, as botocore resolves it, and the clients that go there.

Every setting comes from botocore, with its precedence rules: the endpoint (argument,
``AWS_ENDPOINT_URL_S3``/``AWS_ENDPOINT_URL``, the profile's ``endpoint_url`` or ``services``
section), the region, the addressing style (path for a custom endpoint unless ``virtual`` is
asked for, as botocore does), credentials (env, profiles, SSO, roles, ...), retries and the CA
bundle. We only pick defaults where nothing is configured: ``standard`` retries with 4 attempts.

The AWS CRT client that moves the bytes gets the same endpoint (the bucket's address is taken
from a URL botocore builds), region, credentials (botocore's, refreshed by botocore) and CA.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

from components.s3_sync import native_threads
from components.s3_sync.engine import PART_SIZE
from components.s3_sync.errors import S3SyncError, S3SyncUsageError, translate

_CLOSE_WAIT_S = 10.0
"""How long ``close`` waits for the CRT's threads to end (they end in milliseconds)."""
DEFAULT_MAX_ATTEMPTS = 4
"""Attempts per request when neither AWS_MAX_ATTEMPTS nor the profile's max_attempts is set."""
_KEY_SENTINEL = "S3SYNC-KEY-SENTINEL"


@dataclass(frozen=True, kw_only=True)
class S3Settings:
    """What botocore resolved (shown in messages, handed to the CRT)."""

    endpoint: str
    """The endpoint URL without a bucket (``https://s3.amazonaws.com``, ``http://host:9000``)."""
    region: str
    """The signing region."""
    max_attempts: int
    """Attempts per request, the first included."""
    ca_bundle: str | None
    """PEM file of the CAs to trust (AWS_CA_BUNDLE / ca_bundle), None: the system's."""


class S3Connection:
    """The botocore client (listing, deletes, the classic engine), the AWS CRT client (the CRT
    engine) and error translation for one endpoint. Shared by all threads."""

    def __init__(
        self,
        *,
        endpoint_url: str | None,
        region: str | None,
        addressing_style: str | None,
        max_concurrency: int,
    ) -> None:
        self.max_concurrency = max_concurrency
        self.process_event_loops = _PROCESS_EVENT_LOOPS
        """The CRT client runs on the process's event loops (see ``use_process_event_loops``)."""
        self._lock = threading.Lock()
        self._crt = None
        self._crt_ended: list[threading.Event] = []
        """Set when the CRT client and its own event loops have ended (see ``close``)."""
        self._bases: dict[str, tuple[str, str]] = {}
        try:
            self.session, self.client, self.settings = _on_fresh_stack(
                _botocore_client,
                endpoint_url=endpoint_url,
                region=region,
                addressing_style=addressing_style,
                max_pool_connections=max(10, max_concurrency * 2),
            )
        except S3SyncError:
            raise
        except Exception as exc:  # botocore: "Invalid endpoint: ...", ProfileNotFound, ...
            raise _settings_error(exc, endpoint_url) from exc

    @property
    def endpoint(self) -> str:
        return self.settings.endpoint

    @property
    def region(self) -> str:
        return self.settings.region

    def translate(self, exc: BaseException, *, bucket: str, key: str | None = None) -> S3SyncError:
        """One S3SyncError naming this endpoint, the object and what to check."""
        return translate(exc, endpoint=self.endpoint, region=self.region, bucket=bucket, key=key)

    # -- small API calls (botocore) ----------------------------------------------------------
    def delete_keys(self, bucket: str, keys: list[str]) -> None:
        """DeleteObjects in batches of 1,000. Raises S3SyncError."""
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
            resp = self.client.head_object(Bucket=bucket, Key=key, PartNumber=1)
        except Exception:  # noqa: BLE001 - not all servers support it; the caller falls back
            return None
        return int(resp["ContentLength"]) if resp.get("PartsCount") else None

    # -- the CRT client ----------------------------------------------------------------------
    def crt(self):
        """The one ``awscrt.s3.S3Client`` of this connection (made on first use)."""
        with self._lock:
            if self._crt is None:
                self._crt = self._make_crt()
            return self._crt

    def _make_crt(self):
        from awscrt.s3 import S3Client, S3RequestTlsMode, S3RetryConfig

        plain_http = self.endpoint.startswith("http:")
        credentials = self._crt_credentials()  # raises before any native resource exists
        tls_options = None if plain_http else self._crt_tls()
        if self.process_event_loops:
            bootstrap = _process_bootstrap()
        else:
            bootstrap, self._crt_ended = _new_bootstrap()
        client = S3Client(
            bootstrap=bootstrap,
            region=self.region,
            credential_provider=credentials,
            tls_mode=S3RequestTlsMode.DISABLED if plain_http else S3RequestTlsMode.ENABLED,
            tls_connection_options=tls_options,
            part_size=PART_SIZE,
            multipart_upload_threshold=PART_SIZE,
            throughput_target_gbps=max(1.0, self.max_concurrency * 0.3),
            retry_config=S3RetryConfig(max_retries=max(1, self.settings.max_attempts - 1)),
            connect_timeout_ms=10_000,
        )
        if not self.process_event_loops:
            self._crt_ended.insert(0, client.shutdown_event)
        return client

    def close(self) -> None:
        """End the CRT client and wait until its native threads are gone.

        With event loops of its own (the library default), a sync leaves no CRT thread behind
        when it returns, so the process may fork afterwards (DataLoader workers,
        multiprocessing): with CRT threads still ending, 6 of 100 forked children crashed on a
        loaded machine. The engine must have shut down (it then drops its reference)."""
        with self._lock:
            client, self._crt = self._crt, None
            ended, self._crt_ended = self._crt_ended, []
        if client is None or not ended:
            return  # never made, or on the process's event loops (they live on)
        del client
        native_threads.wait_ended(ended, timeout_s=_CLOSE_WAIT_S)

    def _crt_credentials(self):
        """botocore's credentials for the CRT: fixed keys as they are; refreshable ones (SSO,
        roles, ...) asked from botocore for every request, so that botocore refreshes them."""
        from awscrt.auth import AwsCredentialsProvider
        from botocore.credentials import RefreshableCredentials
        from botocore.exceptions import NoCredentialsError

        credentials = self.session.get_credentials()
        if credentials is None:
            raise NoCredentialsError()
        if isinstance(credentials, RefreshableCredentials):
            from s3transfer.crt import BotocoreCRTCredentialsWrapper  # ~20 ms: only when needed

            return BotocoreCRTCredentialsWrapper(credentials).to_crt_credentials_provider()
        frozen = credentials.get_frozen_credentials()
        return AwsCredentialsProvider.new_static(
            frozen.access_key, frozen.secret_key, frozen.token or None
        )

    def _crt_tls(self):
        """TLS options trusting the CA bundle botocore would trust, None: the system's CAs."""
        if not self.settings.ca_bundle:
            return None
        from awscrt.io import ClientTlsContext, TlsContextOptions

        options = TlsContextOptions()
        options.override_default_trust_store_from_path(ca_filepath=self.settings.ca_bundle)
        return ClientTlsContext(options).new_connection_options()

    def bucket_base(self, bucket: str) -> tuple[str, str]:
        """(Host header, path prefix ending in "/") under which ``bucket``'s keys live, read
        from a URL that botocore builds (its endpoint rules and addressing style)."""
        with self._lock:
            base = self._bases.get(bucket)
        if base is None:
            url = self.client.generate_presigned_url(
                "get_object", Params={"Bucket": bucket, "Key": _KEY_SENTINEL}
            )
            parts = urlsplit(url)
            base = (parts.netloc, parts.path[: parts.path.index(_KEY_SENTINEL)])
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


def _on_fresh_stack(function, **kwargs):
    """``function(**kwargs)`` run on a thread of its own, waited for.

    CPython keeps Python frames in 16 KiB chunks and frees a chunk as soon as the frame at its
    start returns. Importing botocore and making a client call deep enough that, depending on
    how deep the caller already is, thousands of calls cross a chunk boundary, each with an
    mmap and a munmap: between 150 and 5,800 of them, 145 to 190 ms for ``import
    botocore.session`` alone. A new thread starts with an empty stack, so the cost no longer
    depends on the caller (the CLI's was one of the unlucky depths: ~40 ms)."""
    with ThreadPoolExecutor(1, thread_name_prefix="s3sync-botocore") as pool:
        return pool.submit(function, **kwargs).result()


def _botocore_client(
    *,
    endpoint_url: str | None,
    region: str | None,
    addressing_style: str | None,
    max_pool_connections: int,
) -> tuple[Any, Any, S3Settings]:
    """A botocore session and S3 client with the settings it resolved."""
    from botocore.config import Config

    session = botocore_session()
    # LastModified is never used; botocore's dateutil parsing of it is the costliest part of a
    # big listing, so timestamps stay the raw strings.
    session.get_component("response_parser_factory").set_parser_defaults(timestamp_parser=str)
    max_attempts = session.get_config_variable("max_attempts") or DEFAULT_MAX_ATTEMPTS
    config = Config(
        max_pool_connections=max_pool_connections,
        retries={
            "mode": session.get_config_variable("retry_mode") or "standard",
            "total_max_attempts": max_attempts,
        },
        connect_timeout=10,
        read_timeout=60,
        s3={"addressing_style": addressing_style} if addressing_style else None,
        # Integrity: PUTs carry a CRC32 the server checks; GETs check a checksum if present.
        request_checksum_calculation="when_supported",
        response_checksum_validation="when_supported",
    )
    client = session.create_client(
        "s3", region_name=region, endpoint_url=endpoint_url, config=config
    )
    settings = S3Settings(
        endpoint=client.meta.endpoint_url,
        region=client.meta.region_name,
        max_attempts=max_attempts,
        ca_bundle=session.get_config_variable("ca_bundle") or None,
    )
    return session, client, settings


def botocore_session() -> Any:
    """A new botocore session: its settings and credentials are read afresh, as any new
    session's; its data loader is the process's one (:func:`_shared_loader`). An S3 client made
    from it costs ~12 ms of CPU instead of ~80 ms once the process has made one.
    ``boto3.session.Session(botocore_session=botocore_session())`` for a boto3 client."""
    import botocore.session

    session = botocore.session.Session()
    session.register_component("data_loader", _shared_loader(session))
    return session


_LOADER_LOCK = threading.Lock()
_LOADER: list = []


def _shared_loader(session):
    """One botocore data loader per process: it caches the parsed service model and endpoint
    rules (files of botocore's, the same for every session), which a new session would load
    again (~0.1 s); botocore_loader.py makes loading them cheaper. Settings and credentials
    stay per session, read fresh for every sync."""
    # Here, not at the top: it imports botocore (~0.25 s), which this module leaves to the first
    # connection (the CLIs' --help and the pipeline compiler never open one).
    from components.s3_sync.botocore_loader import s3_loader

    with _LOADER_LOCK:
        if not _LOADER:
            _LOADER.append(s3_loader(session.get_config_variable("data_path")))
        return _LOADER[0]


_PROCESS_EVENT_LOOPS = False
_BOOTSTRAP_LOCK = threading.Lock()
_BOOTSTRAP: dict[int, Any] = {}


def use_process_event_loops() -> None:
    """Declare this process one that syncs and then exits (the CLI does): its syncs share one
    set of CRT event-loop threads (one per CPU) for the process's life, and the CRT engine keeps
    a Python thread state on each (``crt_engine.keep_thread_state``: ~15% less CPU for small
    files).

    Not the default, for library callers (the KFP component, the trainer, tests): a process
    that forks after a sync must not have CRT threads alive then (the CRT does not survive a
    fork; a forked child that synced crashed about once in ten tries), and the default event
    loops, made per sync and ended before it returns (``S3Connection.close``), cannot keep
    thread states (they would leak when their threads end)."""
    global _PROCESS_EVENT_LOOPS
    _PROCESS_EVENT_LOOPS = True


def _new_bootstrap():
    """A CRT client bootstrap of its own (event-loop threads, one per CPU, and a DNS resolver),
    ended when the last client using it is gone; with the events set when each part has ended
    (the bootstrap first, the event loops last)."""
    from awscrt.io import ClientBootstrap, DefaultHostResolver, EventLoopGroup

    elg = EventLoopGroup()
    resolver = DefaultHostResolver(elg)
    bootstrap = ClientBootstrap(elg, resolver)
    return bootstrap, [bootstrap.shutdown_event, elg.shutdown_event]


def _process_bootstrap():
    """The process's one CRT client bootstrap (``use_process_event_loops``); made anew in a
    forked child, where the parent's threads do not exist."""
    import os

    with _BOOTSTRAP_LOCK:
        pid = os.getpid()
        if pid not in _BOOTSTRAP:
            _BOOTSTRAP[pid] = _new_bootstrap()
        return _BOOTSTRAP[pid][0]


def _settings_error(exc: Exception, endpoint_url: str | None) -> S3SyncUsageError:
    """A botocore error raised while resolving the settings, as a message that says what to fix."""
    if type(exc).__name__ == "ProfileNotFound":
        return S3SyncUsageError(f"{exc}; check AWS_PROFILE and the AWS config file")
    if "endpoint" in str(exc).lower():
        return S3SyncUsageError(
            f"endpoint_url={endpoint_url!r} is not usable ({exc}); pass a URL like "
            "http://127.0.0.1:8333 or https://s3.us-east-1.amazonaws.com (--endpoint-url, "
            "AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL)"
        )
    return S3SyncUsageError(
        f"the S3 settings are not usable: {type(exc).__name__}: {exc}; check the AWS_* "
        "environment variables (e.g. AWS_MAX_ATTEMPTS, AWS_RETRY_MODE) and the AWS config file"
    )
