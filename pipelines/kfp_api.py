"""Talking to a Kubeflow Pipelines API server through the official ``kfp.Client``.

The server comes from ``--host`` or ``KFP_HOST`` (``KF_PIPELINES_ENDPOINT`` also works);
authentication uses kfp's own mechanisms: ``KFP_TOKEN`` (passed as ``existing_token``),
``KF_PIPELINES_SA_TOKEN_PATH`` (a projected service-account token file, read by kfp's
``ServiceAccountTokenVolumeCredentials``) or ``KFP_COOKIES`` (e.g. an ``authservice_session=...``
cookie behind Dex/oauth2-proxy). Tokens are never taken as flags and never printed. A quick probe
turns a wrong host or token into one message instead of kfp's half-minute of retries.
"""

from __future__ import annotations

import contextlib
import json
import os
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

HOST_ENV_VARS = ("KFP_HOST", "KF_PIPELINES_ENDPOINT")
TOKEN_ENV = "KFP_TOKEN"
TOKEN_PATH_ENV = "KF_PIPELINES_SA_TOKEN_PATH"
COOKIES_ENV = "KFP_COOKIES"
PROBE_TIMEOUT_S = 10.0


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


def probe_server(host: str, token: str | None, cookies: str | None) -> None:
    """GET the healthz endpoint once with a short timeout and turn failures into one message.

    ``kfp.Client()`` itself calls healthz with five retries 5 s apart on HTTP errors, so a wrong
    token would otherwise cost half a minute and end in a traceback.
    """
    request = urllib.request.Request(f"{host}/apis/v2beta1/healthz")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    if cookies:
        request.add_header("Cookie", cookies)
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(request, timeout=PROBE_TIMEOUT_S) as response:
            response.read()
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


def connect(host: str | None, namespace: str | None = None) -> tuple[Any, str]:
    """(``kfp.Client``, resolved host URL) after a quick reachability/auth probe.

    ``namespace``: the Kubeflow profile namespace of multi-user Kubeflow (experiments, runs and
    namespaced pipelines live there); None for the server's default.
    """
    import kfp

    host = resolve_host(host)
    token, credentials, cookies = _auth_from_env()
    probe_server(host, token, cookies)
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


def kfp_cron(expression: str) -> str:
    """KFP's scheduler (robfig/cron v1 ``cron.Parse``) wants a seconds field first.

    A standard five-field expression such as ``0 2 * * *`` would be read there as "second 0 of
    minute 2 of every hour"; prepend ``0`` so it means what crontab means. Six-field expressions
    and ``@daily``-style descriptors pass through.
    """
    expression = " ".join(expression.split())
    if expression.startswith("@"):
        return expression
    fields = expression.split(" ")
    if len(fields) == 5:
        return "0 " + expression
    if len(fields) == 6:
        return expression
    raise click.BadParameter(
        f"{expression!r} has {len(fields)} fields; use five (crontab: 'min hour dom month dow', "
        "e.g. '0 2 * * *') or six with seconds first (e.g. '0 0 2 * * *')",
        param_hint="'--cron'",
    )
