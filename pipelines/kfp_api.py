"""Talking to a Kubeflow Pipelines API server through the official ``kfp.Client``.

The server comes from ``--host`` or ``KFP_HOST`` (``KF_PIPELINES_ENDPOINT`` also works);
authentication uses kfp's own mechanisms: ``KFP_TOKEN`` (passed as ``existing_token``),
``KF_PIPELINES_SA_TOKEN_PATH`` (a projected service-account token file, read by kfp's
``ServiceAccountTokenVolumeCredentials``) or ``KFP_COOKIES`` (e.g. an ``authservice_session=...``
cookie behind Dex/oauth2-proxy). Tokens are never taken as flags and never printed. A quick probe
turns a wrong host or token into one message instead of kfp's half-minute of retries, and its answer
(the server's release) is checked against ``MIN_KFP_BACKEND`` before anything is sent.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import click

from pipelines import cron
from pipelines.cron import CronError
from pipelines.schedule_window import WindowError, schedule_window

HOST_ENV_VARS = ("KFP_HOST", "KF_PIPELINES_ENDPOINT")
TOKEN_ENV = "KFP_TOKEN"
TOKEN_PATH_ENV = "KF_PIPELINES_SA_TOKEN_PATH"
COOKIES_ENV = "KFP_COOKIES"
PROBE_TIMEOUT_S = 10.0

# The oldest Kubeflow Pipelines backend (API server + driver) that runs our compiled pipelines.
# What they use from kfp-kubernetes (the second YAML document) and the pipeline spec, and where the
# backend learnt it (github.com/kubeflow/pipelines; CHANGELOG.md names the same PRs per release):
# - secretAsEnv.secretNameParameter (the S3 Secret's name is the pipeline parameter
#   s3_credentials_secret) and pvcMount.pvcNameParameter (shared-volume: the claim is
#   workspace_pvc):
#   driver support in fd1b48b471 (#11770), first released in 2.5.0. The 2.4.x driver skips
#   unknown fields and refers to a Secret named "" (its claim comes from the deprecated
#   componentInputParameter written beside pvcNameParameter); 2.3.0 and older parse strictly and
#   fail ('unknown field "secretNameParameter"', kubeflow/pipelines#11935).
# - retryPolicy on the training task, which sits in the exit handler's sub-DAG: 2.5.0 applies
#   retries to root-DAG tasks only; nested tasks got them in beae62fb52 (#11908), 2.14.0.
# - secretAsEnv.optional (kfp-kubernetes 2.17 writes it for every Secret, here `false`): the field
#   and its driver support arrived in 55ec8469d5 (#12216), first released in 2.15.0. 2.14.0-2.14.4
#   refuse every run that has it: their Argo compiler reads each executor's Kubernetes config with
#   a strict protojson.Unmarshal (a870b1a325, #12049) -> 'unknown field "optional"'.
MIN_KFP_BACKEND = "2.15.0"
MIN_KFP_BACKEND_WHY = (
    "the pipeline takes the S3 Secret's and the workspace claim's names from parameters "
    "(secretNameParameter, pvcNameParameter: 2.5.0), retries the training task inside the exit "
    "handler (2.14.0) and marks the Secret optional: false (secretAsEnv.optional: 2.15.0; "
    "2.14.x refuses such runs with 'unknown field \"optional\"')"
)
SKIP_VERSION_CHECK_FLAG = "--skip-kfp-version-check"


def resolve_host(host: str | None) -> str:
    """The API server URL from --host or the environment, checked for a scheme."""
    for env in HOST_ENV_VARS:
        host = host or os.environ.get(env)
    if not host:
        raise click.ClickException(
            "no Kubeflow Pipelines API server given: pass --host URL or set KFP_HOST "
            "(e.g. http://localhost:8888 after "
            "`kubectl port-forward -n kubeflow svc/ml-pipeline 8888:8888`)"
        )
    host = host.rstrip("/")
    if not host.startswith(("http://", "https://")):
        raise click.ClickException(
            f"--host {host!r} has no scheme; use http://{host} or https://{host}"
        )
    return host


def _auth_from_env() -> tuple[str | None, Any, str | None]:
    """(token for the probe, credentials object for kfp.Client or None, cookies)."""
    cookies = os.environ.get(COOKIES_ENV) or None
    token = os.environ.get(TOKEN_ENV) or None
    if token:
        return token.strip(), None, cookies
    token_path = os.environ.get(TOKEN_PATH_ENV)
    if token_path:
        from kfp.client.set_volume_credentials import ServiceAccountTokenVolumeCredentials

        try:
            token = Path(token_path).read_text().strip()
        except OSError as exc:
            raise click.ClickException(
                f"{TOKEN_PATH_ENV}={token_path}: cannot read the token file ({exc.strerror}); "
                "point it at a projected service-account token or unset it"
            ) from None
        return token, ServiceAccountTokenVolumeCredentials(token_path), cookies
    return None, None, cookies


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: D102
        return None


def _auth_hint() -> str:
    return (
        f"set {TOKEN_ENV} (a bearer token), {TOKEN_PATH_ENV} (a service-account token file) or "
        f"{COOKIES_ENV} (e.g. authservice_session=...) for an account allowed to use Kubeflow "
        "Pipelines"
    )


def probe_server(host: str, token: str | None, cookies: str | None) -> dict[str, Any]:
    """GET the healthz endpoint once with a short timeout and turn failures into one message.

    ``kfp.Client()`` itself calls healthz with five retries 5 s apart on HTTP errors, so a wrong
    token would otherwise cost half a minute and end in a traceback. Returns the answer
    (``{"commit_sha", "tag_name", "multi_user"}``, what ``kfp.Client.get_kfp_healthz`` reads from
    the same endpoint), or ``{}`` when it is not a JSON object.
    """
    request = urllib.request.Request(f"{host}/apis/v2beta1/healthz")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    if cookies:
        request.add_header("Cookie", cookies)
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(request, timeout=PROBE_TIMEOUT_S) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            raise click.ClickException(
                f"the Kubeflow Pipelines API server at {host} refused the credentials "
                f"(HTTP {exc.code} {exc.reason}); {_auth_hint()}"
            ) from None
        if 300 <= exc.code < 400:
            location = exc.headers.get("Location", "?")
            raise click.ClickException(
                f"{host} redirected to {location} (a login page): it needs authentication; "
                f"{_auth_hint()}, or port-forward the ml-pipeline service and use that as --host"
            ) from None
        raise click.ClickException(
            f"{host} does not answer like a Kubeflow Pipelines v2 API server "
            f"(GET /apis/v2beta1/healthz → HTTP {exc.code} {exc.reason}); check --host/KFP_HOST"
        ) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise click.ClickException(
            f"cannot reach the Kubeflow Pipelines API server at {host} ({reason}); check "
            "--host/KFP_HOST and that the server or your port-forward is running"
        ) from None
    try:
        healthz = json.loads(body)
    except ValueError:
        return {}
    return healthz if isinstance(healthz, dict) else {}


class KfpRelease(NamedTuple):
    """A Kubeflow Pipelines release as healthz's ``tag_name`` names it, ordered like semver."""

    major: int
    minor: int
    patch: int
    stage: int
    """0 alpha, 1 beta, 2 rc, 3 the release itself (so 2.15.0-rc.1 < 2.15.0)."""
    stage_number: int


_RELEASE_TAG = re.compile(r"v?(\d+)\.(\d+)\.(\d+)(?:-(alpha|beta|rc)\.?(\d+))?")
_STAGES = {"alpha": 0, "beta": 1, "rc": 2, None: 3}


def parse_kfp_release(tag_name: str) -> KfpRelease | None:
    """``2.15.0``, ``v2.16.1``, ``2.0.0-rc.2`` → a comparable release; None for anything else
    (``master``, ``unknown``, ``1.0-dev``, empty: builds that are not a release)."""
    match = _RELEASE_TAG.fullmatch(tag_name.strip())
    if match is None:
        return None
    major, minor, patch, stage, stage_number = match.groups()
    return KfpRelease(int(major), int(minor), int(patch), _STAGES[stage], int(stage_number or 0))


class BackendTooOld(click.ClickException):
    """The server's release predates ``MIN_KFP_BACKEND``: a permanent error, exit 2."""

    exit_code = 2


def check_backend_version(host: str, healthz: dict[str, Any], *, skip: bool = False) -> None:
    """Refuse a server older than ``MIN_KFP_BACKEND`` before anything is uploaded or started.

    A version that is not a release tag (dev builds, distributions' own tags, no tag) cannot be
    compared: warn and go on. ``skip`` turns the refusal into a warning too, for a backend the
    user knows has the features patched in.
    """
    tag_name = str(healthz.get("tag_name") or "")
    release = parse_kfp_release(tag_name)
    needs = f"kfp-ddp's pipelines need Kubeflow Pipelines {MIN_KFP_BACKEND} or newer"
    if release is None:
        click.secho(
            f"WARNING: cannot tell the release of the Kubeflow Pipelines API server at {host} "
            f"(healthz tag_name {tag_name!r}); {needs}: {MIN_KFP_BACKEND_WHY}. Continuing.",
            err=True,
            fg="yellow",
        )
        return
    minimum = parse_kfp_release(MIN_KFP_BACKEND)
    if minimum is None or release >= minimum:  # None: MIN_KFP_BACKEND is not a release tag
        return
    problem = (
        f"--host {host}: the Kubeflow Pipelines API server there is release {tag_name} "
        f"(healthz tag_name); {needs}: {MIN_KFP_BACKEND_WHY}"
    )
    if skip:
        click.secho(
            f"WARNING: {problem}. Continuing anyway ({SKIP_VERSION_CHECK_FLAG}).",
            err=True,
            fg="yellow",
        )
        return
    raise BackendTooOld(
        f"{problem}. Upgrade Kubeflow Pipelines to {MIN_KFP_BACKEND} or newer, or pass "
        f"{SKIP_VERSION_CHECK_FLAG} if this backend has those features patched in"
    )


def connect(
    host: str | None, namespace: str | None = None, *, skip_version_check: bool = False
) -> tuple[Any, str]:
    """(``kfp.Client``, resolved host URL) after a quick reachability/auth probe whose answer
    must name a release no older than ``MIN_KFP_BACKEND`` (see ``check_backend_version``).

    ``namespace``: the Kubeflow profile namespace of multi-user Kubeflow (experiments, runs and
    namespaced pipelines live there); None for the server's default.
    """
    import kfp

    host = resolve_host(host)
    token, credentials, cookies = _auth_from_env()
    healthz = probe_server(host, token, cookies)
    check_backend_version(host, healthz, skip=skip_version_check)
    with warnings.catch_warnings(), api_errors("connect", host):
        warnings.simplefilter("ignore", FutureWarning)
        client = kfp.Client(
            host=host,
            existing_token=token if credentials is None else None,
            credentials=credentials,
            cookies=cookies,
            namespace=namespace or "kubeflow",
        )
    return client, host


def _api_error_message(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if body:
        try:
            parsed = json.loads(body)
        except (TypeError, ValueError):
            parsed = None
        if isinstance(parsed, dict):
            message = parsed.get("message") or parsed.get("error_message") or parsed.get("error")
            if message:
                return str(message).strip()
        return str(body).strip()[:500]
    return str(getattr(exc, "reason", "") or "").strip()


@contextlib.contextmanager
def api_errors(action: str, host: str) -> Iterator[None]:
    """Turn kfp/kfp_server_api/urllib3 failures during ``action`` into one clear message."""
    import kfp_server_api
    import urllib3

    try:
        yield
    except kfp_server_api.ApiException as exc:
        status = exc.status or 0
        if status in (401, 403):
            raise click.ClickException(
                f"{action}: the Kubeflow Pipelines API server at {host} refused the credentials "
                f"(HTTP {status}); {_auth_hint()}"
            ) from None
        if status == 0:
            raise click.ClickException(
                f"{action}: cannot reach the Kubeflow Pipelines API server at {host} "
                f"({_api_error_message(exc)})"
            ) from None
        raise click.ClickException(
            f"{action}: the Kubeflow Pipelines API server at {host} answered HTTP {status}: "
            f"{_api_error_message(exc)}"
        ) from None
    except urllib3.exceptions.HTTPError as exc:
        raise click.ClickException(
            f"{action}: cannot reach the Kubeflow Pipelines API server at {host} "
            f"({type(exc).__name__}); check --host/KFP_HOST and your port-forward"
        ) from None
    except (ValueError, TimeoutError) as exc:
        raise click.ClickException(f"{action}: {exc}") from None


def checked_window(
    start: str | None, end: str | None, cron_expression: str
) -> tuple[str | None, str | None]:
    """``--start-time``/``--end-time`` checked (``pipelines.schedule_window``) and in the one
    form KFP's API takes; a bad one is refused naming its option."""
    try:
        return schedule_window(start, end, cron_expression, now=datetime.datetime.now(datetime.UTC))
    except WindowError as exc:
        raise click.BadParameter(str(exc), param_hint=f"'{exc.option}'") from None


def kfp_cron(expression: str) -> str:
    """``--cron`` as KFP's scheduler (robfig/cron v1 ``cron.Parse``) reads it: a seconds field
    first for five crontab fields (``0 2 * * *`` stays 02:00 daily), every field checked
    (``pipelines.cron``); a bad one is refused naming --cron, the field and what to write."""
    try:
        return cron.kfp_cron(expression)
    except CronError as exc:
        raise click.BadParameter(str(exc), param_hint="'--cron'") from None
