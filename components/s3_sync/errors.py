"""The sync's two exception types, and ``translate``: a botocore or AWS CRT exception turned into
one message that names the bucket, the endpoint and what to check (never a credential)."""

from __future__ import annotations

import re
from dataclasses import dataclass


class S3SyncError(RuntimeError):
    """A sync failed for a reason the user can fix; the message names what to check.

    The CLI prints it on one line and exits 1."""


class S3SyncUsageError(S3SyncError, ValueError):
    """The request itself must change: a bad option or URI, or deletions that need explicit
    consent. Raised before anything is changed; the CLI exits 2."""


CREDENTIAL_HINT = (
    "check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or AWS_PROFILE / the credentials file)"
)
ENDPOINT_HINT = "check --endpoint-url / AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL"
RESTORE_HOW = (
    "restore each (aws s3api restore-object --bucket B --key K --restore-request Days=7) and run "
    "again once the restore is done (minutes to hours), or copy them back to the STANDARD "
    "storage class"
)

_CONNECT_ERRORS = ("AWS_IO_SOCKET_", "AWS_IO_DNS_", "AWS_IO_TLS_", "AWS_ERROR_HTTP_CONNECTION")
_CLOCK_SKEWED = frozenset({"RequestTimeTooSkewed", "RequestExpired"})
"""S3's codes for a request signed at a time too far from its own (15 minutes)."""
_REJECTED_CREDENTIALS = frozenset(
    {
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "InvalidToken",
        "ExpiredToken",
        "InvalidClientTokenId",
        "AuthorizationHeaderMalformed",
    }
)


@dataclass(frozen=True)
class FailedRequest:
    """What a failed request was about: the words every message of ``translate`` uses."""

    endpoint: str
    region: str
    bucket: str
    key: str | None = None

    @property
    def target(self) -> str:
        return f"s3://{self.bucket}/{self.key}" if self.key else f"bucket {self.bucket!r}"

    @property
    def at(self) -> str:
        return f"at endpoint {self.endpoint}"


def translate(
    exc: BaseException, *, endpoint: str, region: str, bucket: str, key: str | None = None
) -> S3SyncError:
    """Turn a botocore/CRT exception into one S3SyncError that says what to check."""
    if isinstance(exc, S3SyncError):
        return exc
    request = FailedRequest(endpoint=endpoint, region=region, bucket=bucket, key=key)
    for explain in (_network_error, _credentials_error, _response_error):
        error = explain(exc, request)
        if error is not None:
            return error
    return _other_error(exc, request)


def _crt_name(exc: BaseException) -> str:
    """The AWS CRT error name (``AWS_IO_SOCKET_TIMEOUT``, ...), "" for other exceptions."""
    return str(getattr(exc, "name", "")) if type(exc).__module__.startswith("awscrt") else ""


def _network_error(exc: BaseException, request: FailedRequest) -> S3SyncError | None:
    """TLS, connection and checksum failures (of either library)."""
    from botocore import exceptions as bex

    crt_name = _crt_name(exc)
    detail = f"{crt_name + ': ' if crt_name else ''}{getattr(exc, 'message', exc)}"
    if crt_name.startswith("AWS_IO_TLS_") or type(exc).__name__ == "SSLError":
        return S3SyncError(
            f"TLS with the S3 endpoint {request.endpoint} failed (for {request.target}): "
            f"{detail}; if the server's certificate comes from a CA of your own, point "
            "AWS_CA_BUNDLE at that CA's PEM file; else check --endpoint-url (https:// vs http://)"
        )
    unreachable = (
        bex.EndpointConnectionError
        | bex.ConnectTimeoutError
        | bex.ReadTimeoutError
        | bex.ConnectionClosedError
    )
    if crt_name.startswith(_CONNECT_ERRORS) or isinstance(exc, unreachable):
        return S3SyncError(
            f"cannot reach the S3 endpoint {request.endpoint} (for {request.target}): {detail}; "
            f"{ENDPOINT_HINT}, that the server is up and that the network allows it"
        )
    if "CHECKSUM_MISMATCH" in crt_name or type(exc).__name__ == "FlexibleChecksumError":
        return S3SyncError(
            f"{request.target}: the bytes received do not match the object's S3 checksum "
            f"({crt_name or exc}); the download is corrupt or the object changed - re-run"
        )
    return None


def _credentials_error(exc: BaseException, request: FailedRequest) -> S3SyncError | None:
    from botocore import exceptions as bex

    if isinstance(exc, bex.NoCredentialsError | bex.PartialCredentialsError):
        return S3SyncError(
            f"no S3 credentials found for {request.target} {request.at}: {CREDENTIAL_HINT}"
        )
    return None


def _response_error(exc: BaseException, request: FailedRequest) -> S3SyncError | None:
    """An error response of S3 (botocore's ClientError or the CRT's S3ResponseError)."""
    from botocore.exceptions import ClientError

    if not isinstance(exc, ClientError) and type(exc).__name__ != "S3ResponseError":
        return None
    code, status, message = _error_code(exc)
    target, at = request.target, request.at
    if code == "NoSuchBucket" or (code in ("404", "NotFound") and request.key is None):
        return S3SyncError(
            f"bucket {request.bucket!r} does not exist {at}; check the bucket name in the URI "
            "and the endpoint/region (--endpoint-url, AWS_ENDPOINT_URL_S3, AWS_DEFAULT_REGION)"
        )
    if code in _REJECTED_CREDENTIALS:
        return S3SyncError(
            f"the S3 credentials were rejected ({code}) {at} for {target}: "
            f"{CREDENTIAL_HINT}, and the region ({request.region})"
        )
    if code in _CLOCK_SKEWED:  # a 403 too, but the fix is this machine's clock
        return S3SyncError(
            f"S3 refused the request for {target} {at} ({code}): this machine's clock is more "
            "than 15 minutes off S3's, and a request is signed with its time; set the clock "
            "(NTP: timedatectl set-ntp true; in a container, the node's)"
        )
    if code == "InvalidObjectState":  # a 403, but no permission would help
        return S3SyncError(
            f"{target} is archived {at} (S3 Glacier Flexible Retrieval or Deep Archive, or an "
            "Intelligent-Tiering archive tier) and not restored: no one can read it until it is "
            f"restored: {RESTORE_HOW}"
        )
    if code in ("AccessDenied", "403", "AllAccessDisabled") or status == 403:
        return S3SyncError(
            f"access denied to {target} {at} ({code or status}){_said(message)}: check that the "
            "credentials' policy allows s3:ListBucket, s3:GetObject, s3:PutObject (and "
            "s3:DeleteObject for --delete) on it, and kms:Decrypt / kms:GenerateDataKey on the "
            f"bucket's KMS key if it has one; {CREDENTIAL_HINT}"
        )
    if code in ("PermanentRedirect", "301"):
        return S3SyncError(
            f"{target} lives in another region than {request.region} {at}; pass its region "
            "(--region or AWS_DEFAULT_REGION)"
        )
    if code in ("NoSuchKey", "404", "NotFound"):
        return S3SyncError(f"{target} vanished during the sync {at} ({code}); re-run it")
    if code in ("PreconditionFailed", "412"):
        return S3SyncError(f"{target} changed during the sync {at}; re-run it")
    if code in ("BadDigest", "InvalidDigest"):
        return S3SyncError(
            f"{target}: the server received different bytes than were sent ({code}); "
            "re-run the sync"
        )
    return S3SyncError(f"S3 error {code or status} for {target} {at}: {message}")


def _said(message: str) -> str:
    """S3's own words when they say more than "Access Denied": AWS names the action and the
    policy that denied it (``not authorized to perform: kms:Decrypt ...``)."""
    words = message.strip()
    generic = words.rstrip(".").lower() in ("", "access denied", "forbidden")
    library = words.startswith("An error occurred (") or "AWS_ERROR_" in words  # no Message
    if generic or library:
        return ""
    return f": S3 says {words!r}"


def _other_error(exc: BaseException, request: FailedRequest) -> S3SyncError:
    from botocore.exceptions import BotoCoreError

    target, at = request.target, request.at
    if _crt_name(exc):
        return S3SyncError(
            f"transfer of {target} {at} failed: {exc.name}: {exc.message}; check the "  # type: ignore[attr-defined]
            "endpoint, the credentials and that the object did not change during the sync"
        )
    if isinstance(exc, BotoCoreError):
        return S3SyncError(f"S3 request for {target} {at} failed: {exc}")
    if isinstance(exc, OSError):
        return S3SyncError(f"local I/O error while syncing {target}: {exc}")
    return S3SyncError(f"sync of {target} {at} failed: {type(exc).__name__}: {exc}")


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
