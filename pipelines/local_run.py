"""Run the training pipeline on this machine: ``kfp.local`` with the local launcher backend.

``run_local(arguments, workspace=...)`` runs the whole pipeline in subprocesses of this venv (the
training nodes as local processes with the cluster's env contract, a folder standing in for the
workspace volume) and reads the finished run's folder into a ``LocalRun``: the gate, the metrics,
the model, the report, what was published and which tasks came from kfp.local's cache.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components import DEFAULT_IMAGE
from components.launcher.backends.local import NODES_DIR_ENV
from pipelines.cli_arguments import with_defaults
from pipelines.console import RunConsole, open_log
from pipelines.local_data import environment
from pipelines.plan import DEFAULT_STORAGE
from pipelines.publish import read_evaluation
from pipelines.training import PIPELINE_NAME, build_training_pipeline
from pipelines.validation import ArgumentError, check_arguments
from pipelines.workspace_lock import WorkspaceBusy, held_workspace

TRAIN_TASK = "training-job-component"
"""kfp.local's folder of the training step (named after the component function)."""
DATA_TASKS = ("list-dataset-step", "stage-dataset-step")
"""kfp.local's folder of the data step (object-store storage, shared-volume storage)."""
PUBLISH_TASK = "publish-model-step"
"""kfp.local's folder of the publishing step."""
STEPS_TMP = ".kfp-steps-tmp"
"""The steps' ``TMPDIR`` in the workspace (a step pod's ``/tmp``), removed after the run:
kfp.local writes each step's code to a ``mktemp -d`` folder it leaves behind, and the
evaluation downloads the validation split to a temporary folder (on a small tmpfs ``/tmp``
that is memory)."""


class LocalRunError(RuntimeError):
    """The local pipeline run failed; the message names the failing task and where its logs are."""


@dataclass
class LocalRun:
    """Where a local run put things."""

    run_dir: Path
    """``<pipeline_root>/<pipeline>-<timestamp>/``: one folder per task with its outputs."""
    workspace: Path
    passed: bool | None = None
    """The evaluation gate (None if the evaluation did not run)."""
    published_uri: str | None = None
    """Where the model was published (None if the gate failed)."""
    model_dir: Path | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    """The evaluation's scalar metrics (accuracy, top_k_accuracy, loss, ...)."""
    evaluation: dict[str, Any] = field(default_factory=dict)
    """The whole evaluation result (EvalResult.to_dict(): per-class numbers, reason, ...)."""
    training: dict[str, Any] = field(default_factory=dict)
    """The training summary metrics (images_per_sec, wall_time_s, world_size, steps, ...)."""
    cached_tasks: list[str] = field(default_factory=list)
    """Tasks kfp.local answered from its cache (their outputs are an earlier run's)."""
    report: Path | None = None
    """The evaluation's HTML page (curves, confusion matrix)."""
    data_sync: dict[str, Any] = field(default_factory=dict)
    """The data sync's report (files, bytes, transferred, digest, ...)."""

    def describe(self) -> str:
        lines = [f"run outputs: {self.run_dir}", f"workspace:   {self.workspace}"]
        for label, values in (("training:", self.training), ("evaluation:", self.metrics)):
            if values:
                shown = ", ".join(
                    f"{k}={v:.4g}" if isinstance(v, int | float) else f"{k}={v}"
                    for k, v in sorted(values.items())
                )
                lines.append(f"{label:<12} {shown}")
        if self.report:
            lines.append(f"report:      {self.report}")
        if self.model_dir:
            lines.append(f"model:       {self.model_dir}")
        if self.passed is not None:
            reason = self.evaluation.get("reason")
            verdict = "passed" if self.passed else "failed"
            lines.append(f"gate:        {verdict}{f' ({reason})' if reason else ''}")
        if self.cached_tasks:
            lines.append(
                f"from cache:  {', '.join(self.cached_tasks)} (data and settings unchanged)"
            )
        lines.append(f"published:   {self.published_uri or 'no'}")
        return "\n".join(lines)

    def gate_failure(self) -> str | None:
        """Why the model was held back by the evaluation gate (None: it passed, or no
        evaluation ran)."""
        if self.passed is not False:
            return None
        reason = self.evaluation.get("reason") or "see the report"
        report = f"; report: {self.report}" if self.report else ""
        return (
            f"the evaluation gate failed: {reason}; the model was not published (lower "
            f"accuracy_threshold or tolerance, or train longer){report}"
        )


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _task_dir(run_dir: Path, task: str, cached: dict[str, Path]) -> Path | None:
    """This run's folder of ``task``, or, when kfp.local answered it from its cache, the folder
    of the earlier run whose outputs the cache handed back."""
    path = run_dir / task
    if path.is_dir():
        return path
    return cached.get(task)


class _CacheHits(logging.Handler):
    """Collects kfp.local's "Task X cache hit (key=K)" log records: task → key prefix."""

    PATTERN = re.compile(r"Task (\S+) cache hit \(key=([0-9a-f]+)\)")

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.hits: dict[str, str] = {}

    def emit(self, record: logging.LogRecord) -> None:
        found = self.PATTERN.search(record.getMessage())
        if found:
            self.hits[found.group(1)] = found.group(2)


def _cached_task_dirs(hits: dict[str, str], cache_root: Path) -> dict[str, Path]:
    """Task → the earlier run's task folder its cached outputs live in."""
    dirs: dict[str, Path] = {}
    for task, key in hits.items():
        for entry in sorted(cache_root.glob(f"{key}*.json")):
            outputs = _read_json(entry) or {}
            uris = [v["uri"] for v in outputs.values() if isinstance(v, dict) and v.get("uri")]
            if uris:
                dirs[task] = Path(uris[0]).parent
                break
    return dirs


def _executor_output(task_dir: Path | None) -> dict:
    if task_dir is None:
        return {}
    return _read_json(task_dir / "executor_output.json") or {}


def _artifact_metadata(executor_output: dict, name: str) -> dict[str, Any]:
    artifacts = executor_output.get("artifacts", {}).get(name, {}).get("artifacts", [])
    metadata = dict(artifacts[0].get("metadata", {})) if artifacts else {}
    metadata.pop("display_name", None)
    return metadata


def collect_local_run(
    run_dir: Path, workspace: Path, cached: dict[str, Path] | None = None
) -> LocalRun:
    """Read a finished local run's folder into a ``LocalRun`` (``cached``: task → the earlier
    run's folder for tasks kfp.local answered from its cache)."""
    cached = dict(cached or {})
    result = LocalRun(run_dir=run_dir, workspace=workspace, cached_tasks=sorted(cached))
    evaluation = _task_dir(run_dir, "evaluate-component", cached)
    if evaluation is not None:
        output = _executor_output(evaluation)
        passed = output.get("parameterValues", {}).get("Output")
        result.passed = None if passed is None else bool(passed)
        result.metrics = _artifact_metadata(output, "metrics")
        whole = evaluation / "evaluation"  # eval.json (an older step: the report's metadata)
        report_metadata = _artifact_metadata(output, "report")
        result.evaluation = (
            read_evaluation(str(whole) if whole.is_file() else None, report_metadata) or {}
        )
        report = evaluation / "report"
        result.report = report if report.is_file() else None
    for task in DATA_TASKS:  # never cached: this run's own transfer counts
        if (run_dir / task).is_dir():
            result.data_sync = _artifact_metadata(_executor_output(run_dir / task), "dataset")
    train = _task_dir(run_dir, TRAIN_TASK, cached)
    if train is not None and (train / "model").exists():
        result.model_dir = train / "model"
        result.training = _artifact_metadata(_executor_output(train), "metrics")
    publish = run_dir / PUBLISH_TASK  # never cached: only this run's counts
    if publish.is_dir():
        result.published_uri = _executor_output(publish).get("parameterValues", {}).get("Output")
    return result


def check_run_arguments(arguments: dict[str, Any], workspace: Path, storage: str) -> None:
    """Raise LocalRunError naming every bad argument of a ``run_local`` run, without running or
    contacting anything (``run_local`` calls it first; the pipeline checks them again itself)."""

    try:
        check_arguments(
            with_defaults(arguments, storage)
            | {"backend": "local", "workspace_path": str(workspace), "storage": storage}
            | {"cluster_settings": ""}
        )
    except ArgumentError as exc:
        raise LocalRunError("bad argument(s):\n" + "\n".join(exc.problems)) from None


def run_local(
    arguments: dict[str, Any],
    *,
    workspace: Path,
    storage: str = DEFAULT_STORAGE,
    pipeline_root: Path | None = None,
    enable_caching: bool = False,
    image: str = DEFAULT_IMAGE,
    verbose: bool = False,
    log_dir: Path | None = None,
) -> LocalRun:
    """Run the pipeline with ``kfp.local`` (subprocesses, this venv) and the local backend.

    ``workspace`` holds the run's logs, kfp.local's outputs and the nodes' own disks
    (``WORKSPACE/nodes/<replica>``), and stands in for the workspace PVC with shared-volume
    ``storage``; S3 credentials/endpoint come from this process's environment (or
    ``arguments["s3_endpoint"]``). The console shows one line per
    step, the trainer's progress and a failure's cause; everything goes to a log file under
    ``log_dir`` (default ``WORKSPACE/logs``; ``verbose`` shows it live too). Raises
    LocalRunError on failure, naming the failed step, its cause and the log file.
    """
    workspace = Path(workspace).resolve()
    workspace.mkdir(parents=True, exist_ok=True)
    try:
        with held_workspace(workspace):
            return _run_local(
                arguments,
                workspace=workspace,
                storage=storage,
                pipeline_root=pipeline_root,
                enable_caching=enable_caching,
                image=image,
                verbose=verbose,
                log_dir=log_dir,
            )
    except WorkspaceBusy as exc:
        raise LocalRunError(str(exc)) from None


def _run_local(
    arguments: dict[str, Any],
    *,
    workspace: Path,
    storage: str,
    pipeline_root: Path | None,
    enable_caching: bool,
    image: str,
    verbose: bool,
    log_dir: Path | None,
) -> LocalRun:
    """:func:`run_local`'s work, in a ``workspace`` it holds."""
    from kfp import local

    pipeline_root = Path(pipeline_root or workspace / "kfp-outputs").resolve()
    pipeline_root.mkdir(parents=True, exist_ok=True)
    check_run_arguments(arguments, workspace, storage)
    local.init(
        runner=local.SubprocessRunner(use_venv=False),
        pipeline_root=str(pipeline_root),
        workspace_root=str(workspace / ".kfp-workspace"),
        raise_on_error=True,
        enable_caching=enable_caching,
    )
    pipeline = build_training_pipeline(
        image=image, backend="local", workspace_path=str(workspace), storage=storage
    )
    before = {p.name for p in pipeline_root.iterdir()}
    started = time.time()
    hits = _CacheHits()
    root_logger = logging.getLogger()
    old_level = root_logger.level
    root_logger.addHandler(hits)
    root_logger.setLevel(min(old_level, logging.INFO) if old_level else logging.INFO)
    log_path = open_log(Path(log_dir or workspace / "logs"))
    print(f"pipeline log: {log_path}", flush=True)
    steps_tmp = workspace / STEPS_TMP
    shutil.rmtree(steps_tmp, ignore_errors=True)  # a killed run's (the workspace is held)
    steps_tmp.mkdir()
    with open(log_path, "a", encoding="utf-8") as log:
        console = RunConsole(log=log, console=sys.stdout, verbose=verbose)
        try:
            with (
                contextlib.redirect_stdout(console),
                contextlib.redirect_stderr(console),
                environment({NODES_DIR_ENV: str(workspace / "nodes"), "TMPDIR": str(steps_tmp)}),
            ):
                pipeline(**arguments)
        except Exception as exc:  # kfp.local raises RuntimeError naming the failed task
            cause = console.failure() or f"local pipeline run failed: {exc}"
            raise LocalRunError(f"{cause}. Full log: {log_path}") from exc
        finally:
            root_logger.removeHandler(hits)
            root_logger.setLevel(old_level)
            shutil.rmtree(steps_tmp, ignore_errors=True)
    new = [
        p
        for p in pipeline_root.iterdir()
        if p.is_dir()
        and p.name not in before
        and p.name.startswith(PIPELINE_NAME)
        and p.stat().st_mtime >= started - 1
    ]
    if not new:
        raise LocalRunError(f"local run finished but wrote no run folder under {pipeline_root}")
    run_dir = max(new, key=lambda p: p.stat().st_mtime)
    cached = _cached_task_dirs(hits.hits, pipeline_root / ".kfp_cache")
    return collect_local_run(run_dir, workspace, cached)
