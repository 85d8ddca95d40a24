"""The plain functions behind the KFP components (unit-tested without KFP).

``run_training_step`` builds the TrainSpec from the component's parameters, runs it, and fills the
``Model`` and ``Metrics`` artifacts; ``cleanup_step`` deletes a run's leftover PyTorchJobs.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

from components.pytorchjob.launcher import BACKENDS, run_job
from components.pytorchjob.result import JobCancelled, JobResult
from components.pytorchjob.spec import PvcMount, SpecError, TrainSpec

MODEL_FILES = ("model/weights.pt", "model/model.json", "metrics.jsonl", "summary.json")
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
SUMMARY_METRICS = (
    "final_train_loss",
    "val_accuracy",
    "val_loss",
    "steps",
    "epochs",
    "world_size",
    "wall_time_s",
    "images_per_sec",
    "restarts",
    "resumed_from_step",
)


def run_identity(run_id: str, artifact_uri: str) -> tuple[str, str]:
    """(run id, retry-stable key) of the running KFP task.

    The output artifact's URI holds the run and the task (and the execution, which a retry of
    the step keeps), so hashing it names the job the same on every retry of this step and
    differently in every other run, even when the pipeline passes no run id.
    """
    uri = artifact_uri.rstrip("/")
    key = uri.rsplit("/", 1)[0] if "/" in uri else uri
    if not run_id:
        found = UUID.search(uri)
        run_id = found.group(0) if found else ""
    return run_id, key or run_id


def trainer_args_for(
    *,
    data_dir: str,
    output_dir: str,
    model_name: str = "",
    epochs: int = 0,
    batch_size: int = 0,
    lr: float = 0.0,
    image_size: int = 0,
    checkpoint_every_steps: int = 0,
    extra: list[str] | None = None,
) -> list[str]:
    """The trainer's flags; zero/empty values are left to the trainer's defaults."""
    args = ["--data-dir", data_dir, "--output-dir", output_dir]
    for flag, value in (
        ("--model", model_name),
        ("--epochs", epochs),
        ("--batch-size", batch_size),
        ("--lr", lr),
        ("--image-size", image_size),
        ("--checkpoint-every-steps", checkpoint_every_steps),
    ):
        if value:
            args += [flag, str(value)]
    return args + [str(a) for a in extra or []]


def run_training_step(
    *,
    model: Any,
    metrics: Any,
    name: str,
    namespace: str,
    image: str,
    workers: int,
    nproc_per_node: int,
    gpus_per_worker: int,
    data_dir: str,
    output_dir: str,
    trainer_args: list,
    backend: str,
    pvc_name: str = "",
    pvc_mount_path: str = "",
    data_digest: str = "",
    overrides_json: str = "",
    model_name: str = "",
    epochs: int = 0,
    batch_size: int = 0,
    lr: float = 0.0,
    image_size: int = 0,
    checkpoint_every_steps: int = 0,
    run_id: str = "",
    task_name: str = "train",
) -> JobResult:
    """Run the training job and fill ``model`` (Output[Model]) and ``metrics`` (Output[Metrics]).

    ``overrides_json``: a JSON object of further TrainSpec fields (e.g. ``{"nccl_preset":
    "infiniband", "scheduler_name": "volcano"}``) plus optional ``"backend_options"`` passed to
    the backend (e.g. ``{"timeout_s": 86400, "cleanup": "on-success"}``).
    """
    if backend not in BACKENDS:
        raise SpecError(f"backend={backend!r} is not supported; allowed: {', '.join(BACKENDS)}")
    try:
        overrides = json.loads(overrides_json) if overrides_json.strip() else {}
    except ValueError as exc:
        raise SpecError(f'overrides_json is not JSON ({exc}); e.g. {{"workers": 4}}') from exc
    if not isinstance(overrides, dict):
        raise SpecError(f"overrides_json={overrides_json!r} must be a JSON object")
    backend_options = dict(overrides.pop("backend_options", {}) or {})
    run_id, key = run_identity(run_id, getattr(model, "uri", "") or "")
    from components.pytorchjob.spec import derive_job_name

    base: dict[str, Any] = {
        "name": name or (derive_job_name(key, task_name) if key else ""),
        "namespace": namespace,
        "image": image,
        "workers": workers,
        "nproc_per_node": nproc_per_node,
        "gpus_per_worker": gpus_per_worker,
        "args": trainer_args_for(
            data_dir=data_dir,
            output_dir=output_dir,
            model_name=model_name,
            epochs=epochs,
            batch_size=batch_size,
            lr=lr,
            image_size=image_size,
            checkpoint_every_steps=checkpoint_every_steps,
            extra=list(trainer_args or []),
        ),
        "run_id": run_id,
        "task_name": task_name,
    }
    if pvc_name and backend == "kubernetes":
        # Locally the processes share this step's filesystem, where the paths already hold.
        base["pvcs"] = [PvcMount(claim=pvc_name, path=pvc_mount_path or "/workspace")]
    spec = TrainSpec.from_overrides(base, overrides)
    print(f"[launcher] {backend} job {spec.namespace}/{spec.name}, run {run_id or '(none)'}")
    try:
        result = run_job(spec, backend=backend, output_dir=output_dir, **backend_options)
    except JobCancelled as exc:
        print(f"[launcher] {exc}")
        raise SystemExit(143) from exc
    export_model(Path(output_dir), Path(model.path))
    summary = result.summary or {}
    model_json = _read_json(Path(model.path) / "model.json")
    model.metadata.update(
        {
            "arch": model_json.get("arch", summary.get("arch", "")),
            "val_accuracy": summary.get("val_accuracy"),
            "data_digest": data_digest,
            "job_name": spec.name,
            "world_size": summary.get("world_size", spec.world_size),
            "restarts": result.restarts,
        }
    )
    for key_name in SUMMARY_METRICS:
        value = summary.get(key_name)
        if isinstance(value, int | float) and not isinstance(value, bool):
            metrics.log_metric(key_name, float(value))
    metrics.log_metric("job_duration_s", float(result.duration_s))
    metrics.log_metric("job_restarts", float(result.restarts))
    from components.artifacts import write_metadata_file

    write_metadata_file(metrics)
    return result


def export_model(output_dir: Path, model_dir: Path) -> None:
    """Copy the trainer's model files into the Model artifact folder (flat)."""
    missing = [f for f in MODEL_FILES if not (output_dir / f).is_file()]
    if missing:
        raise FileNotFoundError(
            f"the trainer's output_dir={str(output_dir)!r} lacks {missing}: did the job write "
            "to the same volume this step mounts (pvc_name / pvc_mount_path)?"
        )
    model_dir.mkdir(parents=True, exist_ok=True)
    for rel in MODEL_FILES:
        target = model_dir / Path(rel).name
        tmp = target.with_name(f".{target.name}.tmp")
        shutil.copyfile(output_dir / rel, tmp)
        tmp.replace(target)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def cleanup_step(*, run_id: str, namespace: str, backend: str, client_configuration=None) -> int:
    """Delete the run's PyTorchJobs (kubernetes backend); returns how many were deleted."""
    if backend != "kubernetes" or not run_id:
        print(f"[cleanup] backend={backend!r}, run_id={run_id!r}: no PyTorchJobs to delete")
        return 0
    from components.pytorchjob.backends.kubernetes import delete_run_jobs
    from components.pytorchjob.spec import default_namespace

    deleted = delete_run_jobs(
        namespace or default_namespace(), run_id, client_configuration=client_configuration
    )
    print(f"[cleanup] deleted {len(deleted)} PyTorchJob(s) of run {run_id}: {deleted}")
    return len(deleted)
