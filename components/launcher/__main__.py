"""CLI: ``python -m components.launcher render [flags] -- TRAINER ARGS...``, ``run``, ``rbac``.

``render`` prints the job's YAML (a TrainJob, PyTorchJob or TFJob, ``--api``) and touches no
cluster.
``run`` runs the same spec on a backend. ``rbac`` prints the Role and RoleBinding for a namespace
and service account. Every TrainSpec field has a flag (derived from the dataclass, so none can be
missing); a bad value prints one message naming the flag and exits 2.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from typing import Any

import click
import yaml

from components.launcher.api_options import OPTIONS_OF_API
from components.launcher.options import KubernetesOptions, LocalOptions
from components.launcher.result import JobCancelled, JobFailed, PreflightError
from components.launcher.spec import CHOICES, SpecError, TrainSpec
from kfp_ddp.dataclass_cli import dataclass_options, flag_of, pairs, values_to_fields


def _flag_sources() -> tuple[tuple[type, tuple[str, ...]], ...]:
    """The classes whose fields are the flags, and the fields of each that are not: the spec's
    own fields, then every API's options (``OPTIONS_OF_API``), each setting once (a TFJob and an
    MPIJob share the Training Operator's with a PyTorchJob, a RayJob its retries and TTL), so an
    API's new option is a flag with nothing else to declare."""
    seen = {"args", "api_options"}
    sources = []
    for cls in (TrainSpec, *OPTIONS_OF_API.values()):
        names = [f.name for f in dataclasses.fields(cls)]
        sources.append((cls, tuple(name for name in names if name in seen)))
        seen.update(names)
    return tuple(sources)


FLAG_SOURCES = _flag_sources()
SPEC_FLAGS = {
    f.name: flag_of(f)
    for cls, skip in FLAG_SOURCES
    for f in dataclasses.fields(cls)
    if f.name not in skip
} | {"args": "TRAINER ARGS"}


def spec_options(func):
    """The TrainSpec flags shared by ``render`` and ``run`` (and the trainer's args after --):
    its own fields and every API's options, which ``--api`` sorts out (``TrainSpec.flat``)."""
    func = click.argument("trainer_args", nargs=-1, type=click.UNPROCESSED)(func)
    for cls, skip in reversed(FLAG_SOURCES):
        func = dataclass_options(cls, exclude=skip, choices=CHOICES)(func)
    return func


def build_spec(params: dict[str, Any]) -> TrainSpec:
    """TrainSpec from the CLI's parameters; a bad value → a usage error naming the flag (exit 2)."""
    p = dict(params)
    args = list(p.pop("trainer_args"))
    settings: dict[str, Any] = {}
    for cls, _skip in FLAG_SOURCES:
        settings |= values_to_fields(cls, p)
    try:
        return TrainSpec.flat(args=args, **settings)
    except SpecError as exc:
        raise click.UsageError(with_flag(str(exc))) from exc


def with_flag(message: str) -> str:
    """Prefix a TrainSpec error with the CLI flag that set the field."""
    found = re.match(r"TrainSpec\.(\w+)=", message) or re.match(r"(\w+):", message)
    if not found or found.group(1) not in SPEC_FLAGS:
        return message
    return f"{SPEC_FLAGS[found.group(1)]}: {message}"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="kfp-ddp", prog_name="kfp-ddp launcher")
def cli() -> None:
    """The training-job launcher: Kubeflow Trainer v2 TrainJobs and Training Operator v1
    PyTorchJobs (and TFJobs for TensorFlow programs) from one spec."""


@cli.command()
@spec_options
def render(**params: Any) -> None:
    """Print the job's manifest as YAML (no cluster access; --api auto renders a TrainJob), then,
    with --metrics-port, its PodMonitor (or Service + ServiceMonitor) and PrometheusRule."""
    # Here, not at the top (as in run and rbac): the manifest models and cluster clients (~1 s)
    # only for the command that uses them; --help and a bad flag answer at once.
    from components.launcher.apis import build_manifest
    from components.launcher.monitoring_documents import render_yaml

    spec = build_spec(params)
    if spec.api == "auto":
        click.echo(
            "# --api auto: rendering a TrainJob (Kubeflow Trainer v2); on a cluster without it "
            "the launcher submits a PyTorchJob (--api pytorchjob)",
            err=True,
        )
    try:
        manifest = build_manifest(spec)
    except SpecError as exc:
        raise click.UsageError(with_flag(str(exc))) from exc
    click.echo(render_yaml(manifest, spec), nl=False)


@cli.command()
@spec_options
@click.option("--backend", type=click.Choice(["local", "kubernetes"]), default="local")
@click.option("--timeout", "timeout_s", type=float, default=None, help="Seconds; then delete.")
@click.option(
    "--cleanup",
    type=click.Choice(["always", "on-success", "never"]),
    default="always",
    show_default=True,
    help="Kubernetes: delete the finished job.",
)
@click.option("--path-map", multiple=True, help="MOUNT=LOCAL_DIR for the local backend.")
@click.option(
    "--dry-run",
    is_flag=True,
    help="Print what the backend would start, as YAML, and start nothing: the cluster objects "
    "(kubernetes), or each node's command and environment contract (local).",
)
def run(
    backend: str,
    timeout_s: float | None,
    cleanup: str,
    path_map: tuple[str, ...],
    dry_run: bool,
    **params: Any,
) -> None:
    """Run the job on a backend; exit 0 on success, 1 on failure, 143 when cancelled."""
    from components.launcher.launcher import backend_for, run_job  # (see render)

    spec = build_spec(params)
    options: LocalOptions | KubernetesOptions
    if backend == "local":
        options = LocalOptions(timeout_s=timeout_s, path_map=pairs("--path-map", path_map))
    else:
        options = KubernetesOptions(timeout_s=timeout_s, cleanup=cleanup)
    if dry_run:
        try:
            planned = backend_for(options).dry_run(spec)
        except SpecError as exc:
            raise click.UsageError(with_flag(str(exc))) from exc
        note = f"# {planned.backend} backend, {planned.api} contract: nothing started"
        click.echo(note, err=True)
        click.echo(yaml.safe_dump_all(planned.documents, sort_keys=False), nl=False)
        return
    try:
        result = run_job(spec, backend=backend, options=options)
    except JobCancelled as exc:
        click.echo(str(exc), err=True)
        sys.exit(143)
    except (JobFailed, PreflightError) as exc:
        click.echo(str(exc), err=True)
        sys.exit(1)
    except SpecError as exc:
        raise click.UsageError(with_flag(str(exc))) from exc
    click.echo(json.dumps(result.to_dict() | {"log_tail": result.log_tail[-5:]}, indent=2))


@cli.command()
@click.option("--namespace", default="kubeflow", show_default=True)
@click.option("--service-account", default="pipeline-runner", show_default=True)
@click.option(
    "--servicemonitor",
    is_flag=True,
    help="Also grant what metrics_monitor=servicemonitor creates: a Service and a ServiceMonitor.",
)
@click.option(
    "--cluster-runtime-reader",
    is_flag=True,
    help="Also a ClusterRole + ClusterRoleBinding to read ClusterTrainingRuntimes (an admin "
    "applies it): pre-flight then refuses a TrainJob whose runtime does not exist.",
)
def rbac(
    namespace: str, service_account: str, servicemonitor: bool, cluster_runtime_reader: bool
) -> None:
    """Print the Role + RoleBinding for NAMESPACE and SERVICE_ACCOUNT (pipe into kubectl apply)."""
    from components.launcher.rbac import render_rbac  # (see render)

    try:
        text = render_rbac(
            namespace=namespace,
            service_account=service_account,
            servicemonitor=servicemonitor,
            cluster_runtime_reader=cluster_runtime_reader,
        )
    except SpecError as exc:
        raise click.UsageError(str(exc)) from exc
    click.echo(text, nl=False)


if __name__ == "__main__":
    cli(prog_name="python -m components.launcher")
