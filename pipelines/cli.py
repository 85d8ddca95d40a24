"""``kfp-ddp``: compile, run locally, upload, run and schedule the training pipeline.

Talks to a Kubeflow Pipelines API server through the official ``kfp.Client``. The server comes
from ``--host`` or ``KFP_HOST`` (``KF_PIPELINES_ENDPOINT`` also works); authentication uses kfp's
own mechanisms: ``KFP_TOKEN`` (passed as ``existing_token``), ``KF_PIPELINES_SA_TOKEN_PATH`` (a
projected service-account token file, read by kfp's ``ServiceAccountTokenVolumeCredentials``) or
``KFP_COOKIES`` (e.g. an ``authservice_session=...`` cookie behind Dex/oauth2-proxy). Tokens are
never taken as flags and never printed.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import sys
import tempfile
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import click
import yaml

from components import DEFAULT_IMAGE

DEFAULT_PACKAGE = Path(__file__).resolve().parent / "compiled" / "training_pipeline.yaml"
"""The committed compiled pipeline (kept in sync with the code by a golden test)."""
DEFAULT_PIPELINE_NAME = "kfp-ddp-training"
DEFAULT_EXPERIMENT = "kfp-ddp"
HOST_ENV_VARS = ("KFP_HOST", "KF_PIPELINES_ENDPOINT")
TOKEN_ENV = "KFP_TOKEN"
TOKEN_PATH_ENV = "KF_PIPELINES_SA_TOKEN_PATH"
COOKIES_ENV = "KFP_COOKIES"
PROBE_TIMEOUT_S = 10.0

_TRUE = {"true", "1", "yes", "y", "on"}
_FALSE = {"false", "0", "no", "n", "off"}


# --------------------------------------------------------------------------------------------
# Compiled packages and pipeline parameters
# --------------------------------------------------------------------------------------------


def load_package(path: Path) -> tuple[dict, dict]:
    """Read a compiled pipeline YAML: (PipelineSpec dict, platform spec dict or {})."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise click.ClickException(
            f"--package {path}: no such file; compile one with `kfp-ddp compile --output {path}`"
        ) from None
    except OSError as exc:
        raise click.ClickException(f"--package {path}: cannot read it ({exc})") from None
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise click.ClickException(f"--package {path}: not valid YAML ({exc})") from None
    if not docs or not isinstance(docs[0], dict) or "root" not in docs[0]:
        raise click.ClickException(
            f"--package {path}: not a compiled KFP v2 pipeline (no 'root' in the first document)"
        )
    platform: dict = {}
    for doc in docs[1:]:
        platform.update(doc)
    return docs[0], platform


def declared_inputs(pipeline_spec: dict) -> dict[str, dict]:
    """The pipeline's declared parameters: name → {parameterType, defaultValue?, ...}."""
    return pipeline_spec.get("root", {}).get("inputDefinitions", {}).get("parameters", {}) or {}


def _convert(key: str, raw: str, parameter_type: str) -> Any:
    def bad(expected: str) -> click.BadParameter:
        return click.BadParameter(
            f"pipeline parameter {key!r} expects {expected}, got {raw!r}", param_hint="'-p'"
        )

    if parameter_type == "STRING":
        return raw
    if parameter_type == "NUMBER_INTEGER":
        try:
            return int(raw)
        except ValueError:
            raise bad("an integer") from None
    if parameter_type == "NUMBER_DOUBLE":
        try:
            return float(raw)
        except ValueError:
            raise bad("a number") from None
    if parameter_type == "BOOLEAN":
        lowered = raw.strip().lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        raise bad("true or false")
    if parameter_type in ("LIST", "STRUCT"):
        expected_type, name = (
            (list, "a JSON list") if parameter_type == "LIST" else (dict, "a JSON object")
        )
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            raise bad(name) from None
        if not isinstance(value, expected_type):
            raise bad(name)
        return value
    return raw


def parse_parameters(pairs: Sequence[str], inputs: dict[str, dict]) -> dict[str, Any]:
    """Turn repeated ``-p key=value`` into typed arguments, checked against ``inputs``."""
    arguments: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise click.BadParameter(
                f"{pair!r} is not key=value (e.g. -p epochs=5)", param_hint="'-p'"
            )
        if key not in inputs:
            raise click.BadParameter(
                f"unknown pipeline parameter {key!r}; valid parameters: "
                + ", ".join(sorted(inputs)),
                param_hint="'-p'",
            )
        if key in arguments:
            raise click.BadParameter(f"pipeline parameter {key!r} given twice", param_hint="'-p'")
        arguments[key] = _convert(key, raw, inputs[key].get("parameterType", "STRING"))
    missing = sorted(
        name
        for name, spec in inputs.items()
        if name not in arguments and "defaultValue" not in spec and not spec.get("isOptional")
    )
    if missing:
        raise click.BadParameter(
            "missing required pipeline parameter(s): " + ", ".join(missing), param_hint="'-p'"
        )
    return arguments


def default_arguments(inputs: dict[str, dict]) -> dict[str, Any]:
    """The declared defaults, typed (protobuf hands integers back as floats)."""
    arguments = {}
    for name, spec in inputs.items():
        if "defaultValue" not in spec:
            continue
        value = spec["defaultValue"]
        if spec.get("parameterType") == "NUMBER_INTEGER" and isinstance(value, float):
            value = int(value)
        arguments[name] = value
    return arguments


def disable_caching(pipeline_spec: dict) -> int:
    """Turn caching off for every task of every DAG (root and nested); returns the task count.

    ``kfp.Client(enable_caching=False)`` only rewrites the root DAG's tasks, so tasks inside an
    ExitHandler or a condition would still hit the cache; this walks all of them.
    """
    dags = [pipeline_spec.get("root", {}).get("dag", {})]
    dags += [c.get("dag", {}) for c in pipeline_spec.get("components", {}).values()]
    count = 0
    for dag in dags:
        for task in (dag.get("tasks") or {}).values():
            task.setdefault("cachingOptions", {})["enableCache"] = False
            count += 1
    return count


def write_yaml_atomically(docs: Sequence[dict], path: Path) -> None:
    """Write YAML documents to ``path`` atomically (temp file in the same folder, fsync, rename)."""
    from trainer.atomic_files import write_text_atomic

    write_text_atomic(path, yaml.safe_dump_all(docs, sort_keys=True))


def compile_pipeline(output: Path, *, image: str = DEFAULT_IMAGE) -> Path:
    """Compile the training pipeline for ``image`` to ``output`` (atomically)."""
    from kfp import compiler

    from pipelines.training import build_training_pipeline

    try:
        pipeline = build_training_pipeline(image=image)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=output.parent, prefix=f".{output.name}.", suffix=".yaml")
    os.close(fd)
    os.chmod(tmp, 0o644)  # mkstemp makes it 0600; this file is committed and shared
    try:
        compiler.Compiler().compile(pipeline_func=pipeline, package_path=tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, output)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return output


@contextlib.contextmanager
def _package_for_submit(
    package: Path | None, image: str, *, no_cache: bool = False
) -> Iterator[tuple[Path, dict]]:
    """Yield (path of the package to send, its PipelineSpec dict).

    Without ``--package`` the pipeline is compiled now for ``--image``; with ``no_cache`` a copy
    with caching disabled on every task is written and sent instead.
    """
    with tempfile.TemporaryDirectory(prefix="kfp-ddp-") as tmp:
        if package is None:
            package = compile_pipeline(Path(tmp) / "pipeline.yaml", image=image)
        spec, platform = load_package(package)
        if no_cache:
            disable_caching(spec)
            package = Path(tmp) / "pipeline-no-cache.yaml"
            write_yaml_atomically([spec, platform] if platform else [spec], package)
        yield package, spec


# --------------------------------------------------------------------------------------------
# Talking to the KFP API server
# --------------------------------------------------------------------------------------------


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


def connect(host: str | None) -> tuple[Any, str]:
    """(``kfp.Client``, resolved host URL) after a quick reachability/auth probe."""
    import kfp

    host = resolve_host(host)
    token, credentials, cookies = _auth_from_env()
    probe_server(host, token, cookies)
    with warnings.catch_warnings(), _api_errors("connect", host):
        warnings.simplefilter("ignore", FutureWarning)
        client = kfp.Client(
            host=host,
            existing_token=token if credentials is None else None,
            credentials=credentials,
            cookies=cookies,
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
def _api_errors(action: str, host: str) -> Iterator[None]:
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


# --------------------------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------------------------

_param_option = click.option(
    "-p",
    "--param",
    "params",
    multiple=True,
    metavar="KEY=VALUE",
    help="A pipeline parameter (repeatable); checked against the pipeline's declared inputs.",
)
_host_option = click.option(
    "--host",
    default=None,
    help="Kubeflow Pipelines API URL (default: $KFP_HOST, then $KF_PIPELINES_ENDPOINT).",
)
_image_option = click.option(
    "--image",
    default=DEFAULT_IMAGE,
    show_default=True,
    envvar="KFP_DDP_IMAGE",
    help="Container image of every step (compile time; also $KFP_DDP_IMAGE).",
)
_package_option = click.option(
    "--package",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="A compiled pipeline YAML to send (default: compile the pipeline now for --image).",
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Distributed PyTorch training as a Kubeflow Pipeline: compile, run-local, upload, run,
    schedule, render."""


@main.command("compile")
@_image_option
@click.option(
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=DEFAULT_PACKAGE,
    show_default=True,
    help="Where to write the compiled pipeline YAML.",
)
def compile_command(image: str, output: Path) -> None:
    """Compile the training pipeline to YAML (upload it in the Kubeflow UI or with `upload`)."""
    path = compile_pipeline(output, image=image)
    spec, _ = load_package(path)
    click.echo(f"compiled {spec['pipelineInfo']['name']} for image {image} → {path}")


@main.command("run-local")
@click.option(
    "--workspace",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("kfp-ddp-workspace"),
    show_default=True,
    help="Local folder that stands in for the workspace PVC (data, checkpoints, model).",
)
@click.option(
    "--pipeline-root",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where kfp.local writes task outputs (default: WORKSPACE/kfp-outputs).",
)
@click.option(
    "--cache/--no-cache",
    default=False,
    show_default=True,
    help="kfp.local task caching (an unchanged data digest then reuses the trained model).",
)
@_param_option
def run_local_command(
    workspace: Path, pipeline_root: Path | None, cache: bool, params: tuple[str, ...]
) -> None:
    """Run the whole pipeline on this machine with kfp.local and the local PyTorchJob backend.

    S3 credentials and endpoint come from the environment (AWS_ACCESS_KEY_ID,
    AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL_S3) or -p s3_endpoint=URL.
    """
    from google.protobuf import json_format

    from pipelines.training import LocalRunError, build_training_pipeline, run_local

    spec = json_format.MessageToDict(build_training_pipeline().pipeline_spec)
    inputs = declared_inputs(spec)
    for forced in ("backend", "workspace_path"):
        if any(p.partition("=")[0].strip() == forced for p in params):
            raise click.BadParameter(
                f"run-local sets {forced!r} itself (backend=local, workspace_path=--workspace)",
                param_hint="'-p'",
            )
    arguments = parse_parameters(params, inputs)
    try:
        result = run_local(
            arguments, workspace=workspace, pipeline_root=pipeline_root, enable_caching=cache
        )
    except LocalRunError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(result.describe())


@main.command("upload")
@_host_option
@click.option("--name", default=DEFAULT_PIPELINE_NAME, show_default=True, help="Pipeline name.")
@click.option(
    "--version",
    "version_name",
    default=None,
    help="Version name when the pipeline exists (default: v-<UTC timestamp>).",
)
@click.option("--description", default=None, help="Description shown in the UI.")
@_package_option
@_image_option
def upload_command(
    host: str | None,
    name: str,
    version_name: str | None,
    description: str | None,
    package: Path | None,
    image: str,
) -> None:
    """Upload the compiled pipeline; a new version if a pipeline of that name exists."""
    client, host = connect(host)
    with _package_for_submit(package, image) as (path, _spec):
        with _api_errors(f"look up pipeline {name!r}", host):
            pipeline_id = client.get_pipeline_id(name)
        if pipeline_id is None:
            with _api_errors(f"upload pipeline {name!r}", host):
                pipeline = client.upload_pipeline(
                    str(path), pipeline_name=name, description=description
                )
            click.echo(f"uploaded pipeline {name!r}: id {pipeline.pipeline_id}")
            return
        version_name = version_name or "v-" + datetime.datetime.now(datetime.UTC).strftime(
            "%Y%m%d-%H%M%S"
        )
        with _api_errors(f"upload version {version_name!r} of pipeline {name!r}", host):
            version = client.upload_pipeline_version(
                str(path),
                pipeline_version_name=version_name,
                pipeline_id=pipeline_id,
                description=description,
            )
        click.echo(
            f"uploaded version {version_name!r} of pipeline {name!r}: "
            f"pipeline id {pipeline_id}, version id {version.pipeline_version_id}"
        )


def _submit_options(func):
    for option in reversed(
        [
            _host_option,
            click.option(
                "--experiment",
                default=DEFAULT_EXPERIMENT,
                show_default=True,
                help="Experiment to file the run under (created if missing).",
            ),
            click.option("--name", "run_name", default=None, help="Display name of the run."),
            _package_option,
            _image_option,
            click.option("--pipeline-root", default=None, help="Root URI for run artifacts."),
            click.option(
                "--service-account",
                default=None,
                help="Kubernetes service account of the run (needs the launcher's RBAC).",
            ),
            click.option(
                "--no-cache",
                is_flag=True,
                help="Caching off on every task (nested DAGs too). `run` also sets a fresh "
                "retrain_token so training starts from scratch; a schedule keeps the token you "
                "pass (identical data and settings then resume their finished checkpoint).",
            ),
            _param_option,
        ]
    ):
        func = option(func)
    return func


def _submit_arguments(params: Sequence[str], spec: dict, *, no_cache: bool) -> dict[str, Any]:
    """Typed ``-p`` arguments; ``--no-cache`` also sets a fresh ``retrain_token`` (if declared)
    so the trainer starts in a new folder instead of resuming the last identical run's
    checkpoints."""
    inputs = declared_inputs(spec)
    arguments = parse_parameters(params, inputs)
    if no_cache and "retrain_token" in inputs and "retrain_token" not in arguments:
        arguments["retrain_token"] = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    return arguments


def _experiment_id(client, experiment: str, host: str) -> str:
    with _api_errors(f"find or create experiment {experiment!r}", host):
        return client.create_experiment(name=experiment).experiment_id


@main.command("run")
@_submit_options
def run_command(
    host: str | None,
    experiment: str,
    run_name: str | None,
    package: Path | None,
    image: str,
    pipeline_root: str | None,
    service_account: str | None,
    no_cache: bool,
    params: tuple[str, ...],
) -> None:
    """Start one run of the pipeline with parameters."""
    with _package_for_submit(package, image, no_cache=no_cache) as (path, spec):
        arguments = _submit_arguments(params, spec, no_cache=no_cache)
        client, host = connect(host)
        experiment_id = _experiment_id(client, experiment, host)
        run_name = run_name or f"{spec['pipelineInfo']['name']} {_utc_stamp()}"
        with _api_errors(f"start run {run_name!r}", host):
            run = client.run_pipeline(
                experiment_id=experiment_id,
                job_name=run_name,
                pipeline_package_path=str(path),
                params=arguments,
                pipeline_root=pipeline_root,
                service_account=service_account,
            )
    click.echo(f"started run {run_name!r}: id {run.run_id} (experiment {experiment!r})")


@main.command("schedule")
@click.option(
    "--cron",
    required=True,
    help="Cron schedule, crontab style ('0 2 * * *' = 02:00 daily) or six fields with seconds.",
)
@click.option(
    "--max-concurrency",
    type=click.IntRange(min=1, max=10),
    default=1,
    show_default=True,
    help="How many runs of this schedule may run at once.",
)
@click.option(
    "--no-catchup/--catchup",
    default=True,
    show_default=True,
    help="After a pause, run only the latest missed interval (--catchup backfills every one).",
)
@click.option("--start-time", default=None, help="RFC3339 start of the schedule (default: now).")
@click.option("--end-time", default=None, help="RFC3339 end of the schedule (default: none).")
@_submit_options
def schedule_command(
    cron: str,
    max_concurrency: int,
    no_catchup: bool,
    start_time: str | None,
    end_time: str | None,
    host: str | None,
    experiment: str,
    run_name: str | None,
    package: Path | None,
    image: str,
    pipeline_root: str | None,
    service_account: str | None,
    no_cache: bool,
    params: tuple[str, ...],
) -> None:
    """Create a recurring run on a cron schedule."""
    cron_expression = kfp_cron(cron)
    with _package_for_submit(package, image, no_cache=no_cache) as (path, spec):
        arguments = parse_parameters(params, declared_inputs(spec))
        client, host = connect(host)
        experiment_id = _experiment_id(client, experiment, host)
        run_name = run_name or f"{spec['pipelineInfo']['name']} ({cron_expression})"
        with _api_errors(f"create recurring run {run_name!r}", host):
            recurring = client.create_recurring_run(
                experiment_id=experiment_id,
                job_name=run_name,
                cron_expression=cron_expression,
                max_concurrency=max_concurrency,
                no_catchup=no_catchup,
                start_time=start_time,
                end_time=end_time,
                params=arguments,
                pipeline_package_path=str(path),
                pipeline_root=pipeline_root,
                service_account=service_account,
            )
    converted = "" if cron_expression == cron.strip() else f" (from {cron.strip()!r})"
    click.echo(
        f"scheduled {run_name!r}: id {recurring.recurring_run_id}, cron {cron_expression!r}"
        f"{converted}, max concurrency {max_concurrency}, "
        f"{'no catch-up' if no_catchup else 'catch-up'}"
    )


@main.command("render")
@click.option(
    "--run-id",
    default="00000000-0000-0000-0000-000000000000",
    show_default=True,
    help="KFP run id to render with (the job's name and run-id label derive from it).",
)
@click.option(
    "--data-digest",
    default="DATA-DIGEST",
    show_default=True,
    help="The sync step's digest (part of the trainer's --output-dir).",
)
@_param_option
def render_command(run_id: str, data_digest: str, params: tuple[str, ...]) -> None:
    """Print the PyTorchJob YAML a run with these parameters would submit (no cluster access)."""
    from google.protobuf import json_format

    from components.pytorchjob import SpecError, build_pytorchjob
    from pipelines.training import build_training_pipeline, training_spec

    inputs = declared_inputs(json_format.MessageToDict(build_training_pipeline().pipeline_spec))
    arguments = default_arguments(inputs) | parse_parameters(params, inputs)
    try:
        spec = training_spec(arguments, run_id=run_id, data_digest=data_digest)
        manifest = build_pytorchjob(spec)
    except (SpecError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(yaml.safe_dump(manifest, sort_keys=False), nl=False)


def _utc_stamp() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
