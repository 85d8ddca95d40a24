"""CLI: ``python -m components.pytorchjob render [flags] -- TRAINER ARGS...``, ``run``, ``rbac``.

``render`` prints the PyTorchJob YAML and touches no cluster. ``run`` runs the same spec on a
backend. ``rbac`` prints rbac.yaml for a namespace and service account. A bad flag value prints
one message naming the flag and exits 2.
"""

from __future__ import annotations

import functools
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import yaml

from components import DEFAULT_IMAGE
from components.pytorchjob.spec import NCCL_PRESETS, RESTART_POLICIES, SpecError, TrainSpec

RBAC_FILE = Path(__file__).with_name("rbac.yaml")


def _pairs(flag: str, values: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for v in values:
        key, sep, value = v.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{v!r} is not KEY=VALUE", param_hint=flag)
        out[key] = value
    return out


def spec_options(func: Callable) -> Callable:
    """The TrainSpec flags shared by ``render`` and ``run``."""
    options = [
        click.option("--name", default="", help="Job name (DNS-1035); default: derived."),
        click.option("--namespace", default="", help="Namespace; default: own or 'default'."),
        click.option("--image", default=DEFAULT_IMAGE, show_default=True),
        click.option("--workers", type=int, default=1, show_default=True, help="Pods."),
        click.option("--nproc-per-node", type=int, default=1, show_default=True),
        click.option("--gpus-per-worker", type=int, default=0, show_default=True),
        click.option("--cpu", "cpu_request", default=None, help="CPU request per pod."),
        click.option("--cpu-limit", default=None),
        click.option("--memory", "memory_request", default=None, help="Memory request per pod."),
        click.option("--memory-limit", default=None),
        click.option("--shm-size", default="2Gi", show_default=True, help="'' for none."),
        click.option("--pvc", "pvcs", multiple=True, help="CLAIM:PATH[:ro], repeatable."),
        click.option("--env", "env", multiple=True, help="KEY=VALUE, repeatable."),
        click.option("--nccl-preset", type=click.Choice(list(NCCL_PRESETS)), default=None),
        click.option("--host-network", is_flag=True, default=False),
        click.option("--node-selector", multiple=True, help="KEY=VALUE, repeatable."),
        click.option("--toleration", "tolerations", multiple=True, help="KEY[=VALUE][:EFFECT]."),
        click.option("--service-account", default=None),
        click.option("--image-pull-secret", "image_pull_secrets", multiple=True),
        click.option("--scheduler-name", default=None, help="e.g. volcano (gang scheduling)."),
        click.option("--min-available", type=int, default=None, help="Gang size."),
        click.option("--queue", default=None, help="runPolicy.schedulingPolicy.queue."),
        click.option("--priority-class", default=None),
        click.option("--kueue-queue", default=None, help="Kueue LocalQueue (label)."),
        click.option("--elastic-min", "elastic_min_replicas", type=int, default=None),
        click.option("--elastic-max", "elastic_max_replicas", type=int, default=None),
        click.option("--max-restarts", type=int, default=None, help="Elastic max restarts."),
        click.option("--restart-policy", type=click.Choice(RESTART_POLICIES), default="OnFailure"),
        click.option("--backoff-limit", type=int, default=3, show_default=True),
        click.option("--active-deadline-seconds", type=int, default=None),
        click.option("--clean-pod-policy", default="Running", show_default=True),
        click.option("--ttl-seconds-after-finished", type=int, default=None),
        click.option("--label", "labels", multiple=True, help="KEY=VALUE, repeatable."),
        click.option("--annotation", "annotations", multiple=True, help="KEY=VALUE."),
        click.option("--run-id", default="", help="KFP run id (label; default name)."),
        click.option("--task-name", default="train", show_default=True),
        click.option(
            "--command", "command_json", default=None, help="JSON list; default torchrun."
        ),
        click.argument("trainer_args", nargs=-1, type=click.UNPROCESSED),
    ]
    return functools.reduce(lambda f, opt: opt(f), reversed(options), func)


def build_spec(params: dict[str, Any]) -> TrainSpec:
    """TrainSpec from the CLI's parameters; a bad value → click.BadParameter (exit 2)."""
    p = dict(params)
    p["args"] = list(p.pop("trainer_args"))
    p["env"] = _pairs("--env", p.pop("env"))
    p["node_selector"] = _pairs("--node-selector", p.pop("node_selector"))
    p["labels"] = _pairs("--label", p.pop("labels"))
    p["annotations"] = {"sidecar.istio.io/inject": "false"} | _pairs(
        "--annotation", p.pop("annotations")
    )
    p["tolerations"] = list(p.pop("tolerations"))
    p["pvcs"] = list(p.pop("pvcs"))
    p["image_pull_secrets"] = list(p.pop("image_pull_secrets"))
    p["shm_size"] = p["shm_size"] or None
    command_json = p.pop("command_json")
    if command_json:
        try:
            p["command"] = json.loads(command_json)
        except ValueError as exc:
            raise click.BadParameter(f"not JSON: {exc}", param_hint="--command") from exc
    try:
        return TrainSpec(**p)
    except SpecError as exc:
        raise click.UsageError(_with_flag(str(exc))) from exc


FLAG_OF_FIELD = {
    "cpu_request": "--cpu",
    "memory_request": "--memory",
    "pvcs": "--pvc",
    "tolerations": "--toleration",
    "labels": "--label",
    "annotations": "--annotation",
    "image_pull_secrets": "--image-pull-secret",
    "elastic_min_replicas": "--elastic-min",
    "elastic_max_replicas": "--elastic-max",
    "args": "TRAINER ARGS",
}


def _with_flag(message: str) -> str:
    """Prefix a TrainSpec error with the CLI flag that set the field."""
    found = re.match(r"TrainSpec\.(\w+)=", message) or re.match(r"(\w+):", message)
    if not found:
        return message
    field_name = found.group(1)
    flag = FLAG_OF_FIELD.get(field_name, "--" + field_name.replace("_", "-"))
    return f"{flag}: {message}"


@click.group()
def cli() -> None:
    """The PyTorchJob launcher."""


@cli.command(context_settings={"ignore_unknown_options": False})
@spec_options
def render(**params: Any) -> None:
    """Print the PyTorchJob manifest as YAML (no cluster access)."""
    from components.pytorchjob.manifest import build_pytorchjob

    click.echo(yaml.safe_dump(build_pytorchjob(build_spec(params)), sort_keys=False), nl=False)


@cli.command()
@spec_options
@click.option("--backend", type=click.Choice(["local", "kubernetes"]), default="local")
@click.option("--timeout", "timeout_s", type=float, default=None, help="Seconds; then delete.")
@click.option("--path-map", multiple=True, help="MOUNT=LOCAL_DIR for the local backend.")
def run(backend: str, timeout_s: float | None, path_map: tuple[str, ...], **params: Any) -> None:
    """Run the job on a backend; exit 0 on success, 1 on failure, 143 when cancelled."""
    from components.pytorchjob.launcher import run_job
    from components.pytorchjob.result import JobCancelled, JobFailed, PreflightError

    spec = build_spec(params)
    options: dict[str, Any] = {"timeout_s": timeout_s}
    if backend == "local":
        options["path_map"] = _pairs("--path-map", path_map)
    try:
        result = run_job(spec, backend=backend, **options)
    except JobCancelled as exc:
        click.echo(str(exc), err=True)
        sys.exit(143)
    except (JobFailed, PreflightError) as exc:
        click.echo(str(exc), err=True)
        sys.exit(1)
    click.echo(json.dumps(result.to_dict() | {"log_tail": result.log_tail[-5:]}, indent=2))


@cli.command()
@click.option("--namespace", default="kubeflow", show_default=True)
@click.option("--service-account", default="pipeline-runner", show_default=True)
def rbac(namespace: str, service_account: str) -> None:
    """Print rbac.yaml for NAMESPACE and SERVICE_ACCOUNT (pipe into kubectl apply -f -)."""
    from components.pytorchjob.rbac import render_rbac

    try:
        text = render_rbac(namespace=namespace, service_account=service_account)
    except SpecError as exc:
        raise click.UsageError(str(exc)) from exc
    click.echo(text, nl=False)


if __name__ == "__main__":
    cli(prog_name="python -m components.pytorchjob")
