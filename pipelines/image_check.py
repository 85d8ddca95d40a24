"""Is the image there? Ask its registry before a pipeline that runs it is sent.

Every image a pipeline's steps run is looked up once through the OCI distribution API:
``HEAD /v2/<repository>/manifests/<tag>`` accepting an OCI index, a Docker manifest list or a
single manifest of either kind. A 401 is answered the way docker and podman answer it: a
``Bearer`` challenge with a token from its realm (anonymous, or for the user's credentials), a
``Basic`` challenge with the user's credentials (``registry_credentials``). Docker Hub's
``docker.io`` is asked at ``registry-1.docker.io`` (``library/`` for single names); a loopback
registry (``localhost:5000``, ``127.0.0.1:5000``) over http, every other one over https.

What the answers mean for ``upload``/``run``/``schedule``: a missing tag refuses the command
(exit 2: build and push it, or name another image); a registry that cannot be asked (unreachable,
no answer within ``TIMEOUT_S``, an error, credentials missing or refused) refuses it too (exit 1)
and says that ``--skip-image-check`` skips the check. Nothing is retried; credentials go only to
https or loopback addresses and never into a message.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from typing import Literal, NamedTuple

import click

from components import DEFAULT_IMAGE
from kfp_ddp.image_reference import DOCKER_HUB, ImageReference, is_loopback, normalized_registry
from pipelines.registry_credentials import LOGIN_HINT_FILES, RegistryCredentials, find_credentials

SKIP_IMAGE_CHECK_FLAG = "--skip-image-check"
TIMEOUT_S = 10.0
"""Per request: a registry that needs longer is treated as not answering."""
MAX_REDIRECTS = 3
MANIFEST_MEDIA_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)
"""A registry answers 404 for a manifest whose type the request does not accept."""
MISSING_CODES = ("MANIFEST_UNKNOWN", "NAME_UNKNOWN")
RELEASE_WORKFLOW = ".github/workflows/release.yml"
_CHALLENGE_PARAM = re.compile(r'(?P<key>[A-Za-z]+)\s*=\s*(?:"(?P<quoted>[^"]*)"|(?P<bare>[^\s,]*))')


class Lookup(NamedTuple):
    """What the registry said about one image."""

    outcome: Literal["found", "missing", "unauthorized", "unanswered"]
    detail: str
    """For people: ``HTTP 404``, ``connection refused``, ``HTTP 401 for the credentials of …``."""
    credentials: RegistryCredentials | None = None


class _Response(NamedTuple):
    status: int
    headers: dict[str, str]
    """Names in lowercase."""
    body: bytes


def _lowercase(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    return {name.lower(): value for name, value in headers}


class _Unanswered(Exception):
    """The registry could not be reached, did not answer in time, or answered nonsense."""


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Redirects are followed by ``_request`` itself (to drop credentials across hosts)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: D102
        return None


def _may_carry_credentials(url: str) -> bool:
    parts = urllib.parse.urlsplit(url)
    return parts.scheme == "https" or is_loopback(parts.netloc)


def _request(
    method: str,
    url: str,
    headers: dict[str, str],
    *,
    data: bytes | None = None,
) -> _Response:
    """One HTTP exchange; redirects followed (Authorization only to the same host)."""
    opener = urllib.request.build_opener(_NoRedirect)
    origin = urllib.parse.urlsplit(url).netloc
    for _ in range(MAX_REDIRECTS + 1):
        sent = dict(headers)
        if urllib.parse.urlsplit(url).netloc != origin or not _may_carry_credentials(url):
            sent.pop("Authorization", None)
        request = urllib.request.Request(url, data=data, headers=sent, method=method)
        try:
            with opener.open(request, timeout=TIMEOUT_S) as response:
                body = response.read(1 << 20) if method != "HEAD" else b""
                return _Response(response.status, _lowercase(response.headers.items()), body)
        except urllib.error.HTTPError as exc:
            answer_headers = _lowercase(exc.headers.items() if exc.headers else ())
            location = answer_headers.get("location")
            if exc.code in (301, 302, 303, 307, 308) and location:
                url = urllib.parse.urljoin(url, location)
                continue
            body = b""
            if method != "HEAD":
                try:
                    body = exc.read(1 << 16)
                except OSError:
                    body = b""
            return _Response(exc.code, answer_headers, body)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", None) or exc
            if isinstance(reason, TimeoutError):
                raise _Unanswered(f"no answer within {TIMEOUT_S:g} s") from None
            raise _Unanswered(str(reason)) from None
    raise _Unanswered(f"more than {MAX_REDIRECTS} redirects")


def parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    """``Bearer realm="https://…",service="…",scope="…"`` → ("bearer", {realm, service, scope})."""
    scheme, _, rest = header.strip().partition(" ")
    params = {
        match["key"].lower(): match["quoted"] if match["quoted"] is not None else match["bare"]
        for match in _CHALLENGE_PARAM.finditer(rest)
    }
    return scheme.lower(), params


def _error_codes(body: bytes) -> set[str]:
    """The ``errors[].code`` of a distribution API error body."""
    try:
        errors = json.loads(body).get("errors") or []
    except (ValueError, AttributeError):
        return set()
    return {str(e.get("code")) for e in errors if isinstance(e, dict)}


def _bearer_token(
    challenge: dict[str, str], image: ImageReference, credentials: RegistryCredentials | None
) -> str | Lookup:
    """A token from the challenge's realm (anonymous without credentials), or the Lookup that
    says why there is none."""
    realm = challenge.get("realm", "")
    if not realm.startswith(("https://", "http://")):
        return Lookup("unanswered", f"its Bearer challenge names no token realm ({realm!r})")
    query = {"scope": challenge.get("scope") or f"repository:{image.repository}:pull"}
    if challenge.get("service"):
        query["service"] = challenge["service"]
    headers = {"Accept": "application/json"}
    data = None
    if credentials is not None and _may_carry_credentials(realm):
        if credentials.identity_token:  # OAuth2 refresh token: docker's POST form
            data = urllib.parse.urlencode(
                query
                | {
                    "grant_type": "refresh_token",
                    "refresh_token": credentials.identity_token,
                    "client_id": "kfp-ddp",
                }
            ).encode()
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        elif credentials.basic_authorization():
            headers["Authorization"] = credentials.basic_authorization() or ""
    url = realm if data is not None else f"{realm}?{urllib.parse.urlencode(query)}"
    answer = _request("POST" if data is not None else "GET", url, headers, data=data)
    if answer.status in (401, 403):
        return Lookup(
            "unauthorized", f"its token service answered HTTP {answer.status}", credentials
        )
    if answer.status != 200:
        return Lookup("unanswered", f"its token service answered HTTP {answer.status}")
    try:
        payload = json.loads(answer.body)
        token = payload.get("token") or payload.get("access_token")
    except (ValueError, AttributeError):
        token = None
    if not token:
        return Lookup("unanswered", "its token service answered without a token")
    return str(token)


def _authorization(
    challenge_header: str,
    image: ImageReference,
    find: Callable[[str, str], RegistryCredentials | None],
) -> tuple[str | Lookup, RegistryCredentials | None]:
    """The Authorization value that answers a 401's challenge, or the Lookup that ends the
    check; with the credentials used (or None)."""
    scheme, challenge = parse_challenge(challenge_header)
    credentials = find(image.registry, image.repository)
    if scheme == "bearer":
        token = _bearer_token(challenge, image, credentials)
        return (f"Bearer {token}" if isinstance(token, str) else token), credentials
    if scheme == "basic":
        basic = credentials.basic_authorization() if credentials else None
        if basic is None:  # none, or only an identity token (which answers Bearer challenges)
            return Lookup("unauthorized", "it asks for a user name and password"), None
        return basic, credentials
    return Lookup("unanswered", f"it asks for {scheme or 'an unknown'} authentication"), None


def lookup(
    image: ImageReference,
    *,
    find: Callable[[str, str], RegistryCredentials | None] = find_credentials,
) -> Lookup:
    """Ask ``image``'s registry whether its tag (or digest) exists."""
    headers = {"Accept": ", ".join(MANIFEST_MEDIA_TYPES), "User-Agent": "kfp-ddp image check"}
    credentials = None
    try:
        answer = _request("HEAD", image.manifest_url, headers)
        if answer.status == 401:
            authorization, credentials = _authorization(
                answer.headers.get("www-authenticate", ""), image, find
            )
            if isinstance(authorization, Lookup):
                return authorization
            headers["Authorization"] = authorization
            answer = _request("HEAD", image.manifest_url, headers)
        if answer.status == 405:  # a registry without HEAD on manifests
            answer = _request("GET", image.manifest_url, headers)
    except _Unanswered as exc:
        return Lookup("unanswered", str(exc))
    return _verdict(answer, credentials)


def _verdict(answer: _Response, credentials: RegistryCredentials | None) -> Lookup:
    codes = _error_codes(answer.body)
    if 200 <= answer.status < 300:
        return Lookup("found", f"HTTP {answer.status}", credentials)
    if answer.status == 404 or codes & set(MISSING_CODES):
        return Lookup("missing", f"HTTP {answer.status}", credentials)
    if answer.status in (401, 403):
        return Lookup("unauthorized", f"HTTP {answer.status}", credentials)
    return Lookup("unanswered", f"HTTP {answer.status}", credentials)


class ImageMissing(click.ClickException):
    """The registry has no such tag: a permanent error, exit 2."""

    exit_code = 2


class ImageUnchecked(click.ClickException):
    """The registry could not say whether the image exists (exit 1)."""


RELEASE_VERSION = DEFAULT_IMAGE.rsplit(":", 1)[-1]
"""The package version the release image is tagged with (a test holds it to pyproject's)."""


def release_image_note() -> str:
    """What ``compile`` and ``compile-components`` say when they write the release image."""
    return (
        f"{DEFAULT_IMAGE} is the release image of kfp-ddp {RELEASE_VERSION}: it exists once the "
        f"release workflow ({RELEASE_WORKFLOW}) has run for tag v{RELEASE_VERSION}. Until then, "
        "or to run an image of your own: make image IMAGE=registry.example.com/kfp-ddp:TAG && "
        "docker push registry.example.com/kfp-ddp:TAG, and pass --image (or $KFP_DDP_IMAGE)"
    )


def _release_clause(image: str) -> str:
    if image != DEFAULT_IMAGE:
        return ""
    return (
        f" ({image} is the release image of kfp-ddp {RELEASE_VERSION}: the release workflow "
        f"{RELEASE_WORKFLOW} pushes it when tag v{RELEASE_VERSION} is released)"
    )


def refusal(what: str, image: ImageReference, found: Lookup) -> click.ClickException:
    """The one-line error for a lookup that is not ``found``."""
    hub = normalized_registry(image.registry) == DOCKER_HUB
    where = f"Docker Hub ({image.endpoint})" if hub else image.endpoint
    kind = "manifest" if image.reference.startswith("sha256:") else "tag"
    skip = f"pass {SKIP_IMAGE_CHECK_FLAG} to send it without this check"
    if found.outcome == "missing":
        return ImageMissing(
            f"{what}: the image {image.image} does not exist: {where} has no {kind} "
            f"{image.reference!r} in {image.repository} ({found.detail}), so no step could "
            f"start{_release_clause(image.image)}. Build and push it first "
            f"(make image IMAGE={image.image} && docker push {image.image}), or pass --image "
            "(or $KFP_DDP_IMAGE; for a --package, kfp-ddp compile --image) naming an image "
            "that exists"
        )
    if found.outcome == "unauthorized":
        if found.credentials is not None:
            whose = f"refused the credentials from {found.credentials.source} ({found.detail})"
        else:
            whose = (
                f"wants credentials to read {image.repository} ({found.detail}) and none were "
                f"found in {LOGIN_HINT_FILES}: log in with `docker login {image.registry}` or "
                f"`podman login {image.registry}` (a private image, or one that does not exist)"
            )
        return ImageUnchecked(
            f"{what}: cannot tell whether the image {image.image} exists: {where} {whose}; "
            f"or, if the cluster can pull it with credentials of its own, {skip}"
        )
    return ImageUnchecked(
        f"{what}: cannot ask {where} whether the image {image.image} exists ({found.detail}); "
        f"check the image's registry and your network, or {skip}"
    )


def check_images(
    images: Iterable[str],
    *,
    what: str,
    find: Callable[[str, str], RegistryCredentials | None] = find_credentials,
) -> None:
    """Refuse (a ClickException naming ``what``, the command) unless every image exists."""
    for name in sorted(set(images)):
        try:
            image = ImageReference.parse(name)
        except ValueError as exc:
            raise ImageMissing(f"{what}: {exc}") from None
        found = lookup(image, find=find)
        if found.outcome != "found":
            raise refusal(what, image, found)
