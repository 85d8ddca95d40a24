"""``kfp-ddp``: compile, run locally, upload, run, schedule and render the training pipeline.

The commands; the pieces they use live beside them: ``package`` (compiled pipelines),
``cli_arguments`` (``-p key=value`` and the argument check), ``image_check`` (does the image exist
in its registry?), ``kfp_api`` (the Kubeflow Pipelines API server through ``kfp.Client``). Every
argument, and every image a run pulls, is checked before anything is submitted; a bad one exits 2
with one line naming the parameter, the value and the fix.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from components import DEFAULT_IMAGE
from components.launcher.spec import SpecError
from components.launcher.step import TrainingStepInputs, training_spec
from components.s3_sync import S3SyncError
from kfp_ddp.local_s3 import LocalS3Busy, LocalS3StorageError
from pipelines.cli_arguments import checked_arguments, parse_parameters, pipeline_inputs
from pipelines.dataset import DatasetLayoutError, folder_layout
from pipelines.image_check import SKIP_IMAGE_CHECK_FLAG, check_images, release_image_note
from pipelines.kfp_api import (
    MIN_KFP_BACKEND,
    SKIP_VERSION_CHECK_FLAG,
    api_errors,
    checked_window,
    connect,
    kfp_cron,
)
from pipelines.local_data import (
    LOCAL_MODELS_URI,
    links_not_served,
    local_data_uri,
    local_gpu_count,
    served_folder,
)
from pipelines.package import (
    PACKAGES,
    compile_pipeline,
    declared_inputs,
    default_arguments,
    load_package,
    package_for_submit,
    package_storage,
    submitted_images,
)
from pipelines.parameters import listing
from pipelines.plan import (
    DEFAULT_STORAGE,
    STORAGE_MODES,
    WORKSPACE_MOUNT_PATH,
    cluster_settings_json,
    planned_step_inputs,
)

DEFAULT_PIPELINE_NAME = "kfp-ddp-training"
DEFAULT_EXPERIMENT = "kfp-ddp"

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
_namespace_option = click.option(
    "--namespace",
    envvar="KFP_NAMESPACE",
    default=None,
    help="Kubeflow profile namespace of a multi-user Kubeflow (also $KFP_NAMESPACE).",
)
_version_check_option = click.option(
    SKIP_VERSION_CHECK_FLAG,
    "skip_version_check",
    is_flag=True,
    help=f"Warn instead of refusing when the API server's release is older than "
    f"{MIN_KFP_BACKEND} (for a backend with the needed features patched in).",
)
_image_check_option = click.option(
    SKIP_IMAGE_CHECK_FLAG,
    "skip_image_check",
    is_flag=True,
    help="Send the pipeline without asking the registry whether its images exist (for a "
    "registry this machine cannot reach, or one only the cluster has credentials for).",
)
_image_option = click.option(
    "--image",
    default=DEFAULT_IMAGE,
    show_default=True,
    envvar="KFP_DDP_IMAGE",
    help="Container image of every step (compile time; also $KFP_DDP_IMAGE).",
)
_storage_option = click.option(
    "--storage",
    type=click.Choice(STORAGE_MODES),
    default=DEFAULT_STORAGE,
    show_default=True,
    help="object-store: no shared volume (each node stages the data; checkpoints and the model "
    "go through S3), runs on any cluster. shared-volume: the steps and nodes share the "
    "ReadWriteMany claim workspace_pvc. Compile time; a --package keeps its own.",
)


def _json_object(ctx: click.Context, param: click.Parameter, value: str | None) -> dict | None:
    """A --option that takes a JSON object."""
    if value is None:
        return None
    try:
        data = json.loads(value)
    except ValueError as exc:
        raise click.BadParameter(f"{value!r} is not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise click.BadParameter(f"{value!r} must be a JSON object")
    return data


_cluster_settings_option = click.option(
    "--cluster-settings",
    callback=_json_object,
    default=None,
    help="JSON object of TrainSpec fields an admin fixes for every training job of this "
    "pipeline, never UI parameters: the node-access ones (pod_security, capabilities, "
    "host_network, stage_cache_host_path) and any other, e.g. "
    '{"pod_security": "privileged", "stage_cache_host_path": "/mnt/kfp-ddp-cache"}. '
    "Compile time.",
)
_package_option = click.option(
    "--package",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="A compiled pipeline YAML to send (default: compile the pipeline now for --image).",
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="kfp-ddp", prog_name="kfp-ddp")
def main() -> None:
    """Distributed PyTorch training as a Kubeflow Pipeline: compile, run-local, upload, run,
    schedule, render; compile-components for pipelines of your own."""


@main.command("compile")
@_image_option
@_storage_option
@_cluster_settings_option
@click.option(
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Where to write the compiled pipeline YAML (default: the committed one of --storage, "
    "pipelines/compiled/training_pipeline[_shared_volume].yaml).",
)
def compile_command(
    image: str, storage: str, cluster_settings: dict | None, output: Path | None
) -> None:
    """Compile the training pipeline to YAML (upload it in the Kubeflow UI or with `upload`)."""
    path = compile_pipeline(
        output or PACKAGES[storage],
        image=image,
        storage=storage,
        cluster_settings=cluster_settings,
    )
    spec, _ = load_package(path)
    click.echo(
        f"compiled {spec['pipelineInfo']['name']} ({storage} storage) for image {image} → {path}"
    )
    if image == DEFAULT_IMAGE:
        click.secho(f"WARNING: {release_image_note()}", err=True, fg="yellow")


@main.command("parameters")
@_storage_option
@_image_option
def parameters_command(storage: str, image: str) -> None:
    """List the pipeline's parameters (-p NAME=VALUE): type, default and what each does."""
    click.echo(listing(storage, image=image))


@main.command("compile-components")
@_image_option
@click.option(
    "--output",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Folder for the component YAML files (created if missing; our files are replaced).",
)
def compile_components_command(image: str, output: Path) -> None:
    """Write one component YAML per reusable step, for pipelines of your own (load them with
    kfp.components.load_component_from_file)."""
    # Here, not at the top (as for each command below): what one command needs, the others and
    # --help must not wait for (the components and cluster clients: seconds).
    from pipelines.component_files import compile_components

    try:
        written = compile_components(output, image=image)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--image") from None
    click.echo(f"compiled {len(written)} components for image {image} → {output}")
    if image == DEFAULT_IMAGE:
        click.secho(f"WARNING: {release_image_note()}", err=True, fg="yellow")


def _check_data_folder(folder: Path) -> None:
    """Refuse a ``--data`` folder that is no ImageFolder of two classes or more, with the data
    step's own rules (``pipelines.dataset``), before a server starts or a file is uploaded."""
    try:
        folder_layout(folder).check(str(folder))
    except DatasetLayoutError as exc:
        raise click.BadParameter(f"{folder}: {exc.fix}", param_hint="'--data'") from None
    links = links_not_served(folder)
    if links:
        shown = ", ".join(links[:3]) + (f" and {len(links) - 3} more" if len(links) > 3 else "")
        raise click.BadParameter(
            f"{folder}: {shown}: the local S3 server gets a copy of what is inside the folder "
            "and does not follow links to folders, or to files outside it (the pipeline reads "
            "the copy, as from S3 on a cluster); put the files themselves in the folder",
            param_hint="'--data'",
        )


@main.command("run-local")
@click.option(
    "--workspace",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("kfp-ddp-workspace"),
    show_default=True,
    help="Local folder of the run: logs, kfp.local outputs, the nodes' own disks; with "
    "shared-volume storage it also stands in for the workspace PVC.",
)
@_storage_option
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
@click.option("--verbose", is_flag=True, help="Show every line of the pipeline's log live.")
@click.option(
    "--data",
    "data_folder",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="A local ImageFolder (train/<class>/*, val/<class>/*) to train on: served by a local "
    "S3 server (its objects in WORKSPACE/s3-data, synced incrementally) as data_uri; the model "
    f"goes to {LOCAL_MODELS_URI} there unless -p publish_uri says otherwise.",
)
@_param_option
def run_local_command(
    workspace: Path,
    storage: str,
    pipeline_root: Path | None,
    cache: bool,
    verbose: bool,
    data_folder: Path | None,
    params: tuple[str, ...],
) -> None:
    """Run the whole pipeline on this machine with kfp.local and the local launcher backend.

    S3 credentials and endpoint come from the environment (AWS_ACCESS_KEY_ID,
    AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL_S3) or -p s3_endpoint=URL; with --data FOLDER, from
    the local S3 server that serves it. gpus_per_worker defaults to 0 on a machine without a
    GPU. Exits 1 when a step fails or the evaluation gate holds the model back (the message
    says why).
    """
    from pipelines.local_run import LocalRunError, run_local  # (see compile-components)

    given = {pair.partition("=")[0].strip() for pair in params}
    if data_folder is not None:
        for taken in ("data_uri", "s3_endpoint"):
            if taken in given:
                raise click.UsageError(
                    f"--data serves {data_folder} as the data: leave out -p {taken}"
                )
        params += (f"data_uri={local_data_uri(data_folder)}",)
        if "publish_uri" not in given:
            params += (f"publish_uri={LOCAL_MODELS_URI}",)
    arguments = parse_parameters(params, pipeline_inputs(storage))
    if "gpus_per_worker" not in given and not local_gpu_count():
        arguments["gpus_per_worker"] = 0
        click.echo("no GPU on this machine: gpus_per_worker=0 (CPU processes, gloo)")
    checked_arguments(
        arguments, backend="local", workspace_path=str(workspace.resolve()), storage=storage
    )
    if data_folder is not None:
        _check_data_folder(data_folder)
    serving = (
        served_folder(data_folder, workspace.resolve() / "s3-data")
        if data_folder is not None
        else contextlib.nullcontext(None)
    )
    try:
        with serving as served:
            if served is not None:
                arguments["s3_endpoint"] = served.endpoint_url
                click.echo(
                    f"serving {data_folder} as {served.data_uri} (local S3 at "
                    f"{served.endpoint_url}): {served.upload.transferred} file(s) uploaded, "
                    f"{served.upload.skipped} unchanged"
                    + (
                        f", {served.upload.deleted} removed (no longer in the folder)"
                        if served.upload.deleted
                        else ""
                    )
                )
            result = run_local(
                arguments,
                workspace=workspace,
                storage=storage,
                pipeline_root=pipeline_root,
                enable_caching=cache,
                verbose=verbose,
            )
    except (LocalRunError, LocalS3Busy, LocalS3StorageError, S3SyncError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(result.describe())
    failure = result.gate_failure()
    if failure:  # the model was held back: exit 1, so that a script or CI sees it
        raise click.ClickException(failure)


@main.command("upload")
@_host_option
@_namespace_option
@_version_check_option
@_image_check_option
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
@_storage_option
def upload_command(
    host: str | None,
    namespace: str | None,
    skip_version_check: bool,
    skip_image_check: bool,
    name: str,
    version_name: str | None,
    description: str | None,
    package: Path | None,
    image: str,
    storage: str,
) -> None:
    """Upload the compiled pipeline; a new version if a pipeline of that name exists."""
    with package_for_submit(package, image, storage=storage) as (path, spec):
        if not skip_image_check:
            check_images(submitted_images(spec), what="upload")
        client, host = connect(host, namespace, skip_version_check=skip_version_check)
        with api_errors(f"look up pipeline {name!r}", host):
            pipeline_id = client.get_pipeline_id(name)
        if pipeline_id is None:
            with api_errors(f"upload pipeline {name!r}", host):
                pipeline = client.upload_pipeline(
                    str(path), pipeline_name=name, description=description, namespace=namespace
                )
            click.echo(f"uploaded pipeline {name!r}: id {pipeline.pipeline_id}")
            return
        version_name = version_name or "v-" + datetime.datetime.now(datetime.UTC).strftime(
            "%Y%m%d-%H%M%S"
        )
        with api_errors(f"upload version {version_name!r} of pipeline {name!r}", host):
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
            _namespace_option,
            _version_check_option,
            _image_check_option,
            click.option(
                "--experiment",
                default=DEFAULT_EXPERIMENT,
                show_default=True,
                help="Experiment to file the run under (created if missing).",
            ),
            click.option("--name", "run_name", default=None, help="Display name of the run."),
            _package_option,
            _image_option,
            _storage_option,
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


def _submit_arguments(
    params: Sequence[str], spec: dict, *, fresh_token: bool = False
) -> dict[str, Any]:
    """Typed, checked ``-p`` arguments; ``fresh_token`` also sets a new ``retrain_token`` (if
    declared and not given) so the trainer starts in a new folder instead of resuming the last
    identical run's checkpoints."""
    inputs = declared_inputs(spec)
    arguments = parse_parameters(params, inputs)
    if fresh_token and "retrain_token" in inputs and "retrain_token" not in arguments:
        arguments["retrain_token"] = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    checked_arguments(default_arguments(inputs) | arguments, storage=package_storage(spec))
    return arguments


def _experiment_id(client, experiment: str, namespace: str | None, host: str) -> str:
    with api_errors(f"find or create experiment {experiment!r}", host):
        return client.create_experiment(name=experiment, namespace=namespace).experiment_id


@main.command("run")
@_submit_options
def run_command(
    host: str | None,
    namespace: str | None,
    skip_version_check: bool,
    skip_image_check: bool,
    experiment: str,
    run_name: str | None,
    package: Path | None,
    image: str,
    storage: str,
    pipeline_root: str | None,
    service_account: str | None,
    no_cache: bool,
    params: tuple[str, ...],
) -> None:
    """Start one run of the pipeline with parameters."""
    with package_for_submit(package, image, storage=storage, no_cache=no_cache) as (path, spec):
        arguments = _submit_arguments(params, spec, fresh_token=no_cache)
        if not skip_image_check:
            check_images(submitted_images(spec, arguments), what="run")
        client, host = connect(host, namespace, skip_version_check=skip_version_check)
        experiment_id = _experiment_id(client, experiment, namespace, host)
        run_name = run_name or f"{spec['pipelineInfo']['name']} {_utc_stamp()}"
        with api_errors(f"start run {run_name!r}", host):
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
    namespace: str | None,
    skip_version_check: bool,
    skip_image_check: bool,
    experiment: str,
    run_name: str | None,
    package: Path | None,
    image: str,
    storage: str,
    pipeline_root: str | None,
    service_account: str | None,
    no_cache: bool,
    params: tuple[str, ...],
) -> None:
    """Create a recurring run on a cron schedule."""
    cron_expression = kfp_cron(cron)
    start_time, end_time = checked_window(start_time, end_time, cron_expression)
    with package_for_submit(package, image, storage=storage, no_cache=no_cache) as (path, spec):
        arguments = _submit_arguments(params, spec)
        if not skip_image_check:
            check_images(submitted_images(spec, arguments), what="schedule")
        client, host = connect(host, namespace, skip_version_check=skip_version_check)
        experiment_id = _experiment_id(client, experiment, namespace, host)
        run_name = run_name or f"{spec['pipelineInfo']['name']} ({cron_expression})"
        with api_errors(f"create recurring run {run_name!r}", host):
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
    help="The data step's digest (part of the data folder and the trainer's --output-dir).",
)
@click.option(
    "--metrics-port",
    type=int,
    default=None,
    help="The metrics_port parameter (same as -p metrics_port=PORT): also print the job's "
    "PodMonitor and PrometheusRule.",
)
@_storage_option
@_cluster_settings_option
@click.option(
    "--data-bytes",
    type=click.IntRange(min=0),
    default=0,
    help="The data set's size, as the data step would count it (sizes the staging volume).",
)
@_param_option
def render_command(
    run_id: str,
    data_digest: str,
    metrics_port: int | None,
    storage: str,
    cluster_settings: dict | None,
    data_bytes: int,
    params: tuple[str, ...],
) -> None:
    """Print the TrainJob/PyTorchJob a run with these parameters would submit (no cluster access).

    It is built by the same function the training step uses, from the same inputs. With
    api=auto (the default) it prints the TrainJob; a cluster without Kubeflow Trainer v2 gets
    the PyTorchJob (-p api=pytorchjob shows it). With metrics_port, the monitoring documents
    the training step creates beside the job follow it (multi-document YAML).
    """
    from components.launcher.apis import build_manifest  # (see compile-components)
    from components.launcher.monitoring_documents import render_yaml  # (see compile-components)

    inputs = pipeline_inputs(storage)
    arguments = default_arguments(inputs) | parse_parameters(params, inputs)
    if metrics_port is not None:
        arguments["metrics_port"] = metrics_port
    try:
        settings = cluster_settings_json(cluster_settings)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--cluster-settings") from None
    checked_arguments(arguments, storage=storage, cluster_settings=settings)
    arguments |= {"backend": "kubernetes", "workspace_path": WORKSPACE_MOUNT_PATH}
    arguments |= {"storage": storage, "cluster_settings": settings}
    try:
        step = TrainingStepInputs(**planned_step_inputs(arguments, data_digest, data_bytes))
        spec = training_spec(step, run_id=run_id)
        manifest = build_manifest(spec)
    except (SpecError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    for warning in spec.warnings():
        click.echo(f"# warning: {warning}", err=True)
    if arguments.get("api") == "auto":
        click.echo(
            "# api=auto: a TrainJob where the cluster serves Kubeflow Trainer v2, else the "
            "PyTorchJob of -p api=pytorchjob",
            err=True,
        )
    click.echo(render_yaml(manifest, spec), nl=False)


def _utc_stamp() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
