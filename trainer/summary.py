"""``summary.json``: what a finished run says about itself (rank 0 writes it after ``model/``).

A rerun finds a run finished when its checkpoint is at the last step and ``summary.json`` and
``model/`` were written for that step (:func:`outputs_written_at`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.progress import SUMMARY_KEY, Progress

if TYPE_CHECKING:
    from trainer.build import RunPlan
    from trainer.loop_state import LoopState

SUMMARY_FILE = "summary.json"


def run_summary(
    *,
    state: LoopState,
    plan: RunPlan,
    world_size: int,
    arch: str,
    num_classes: int,
    precision: str,
    device: str,
    train_seconds: float,
    wall_seconds: float,
    in_sync: bool,
    final: Progress,
    skipped_images: list[str],
    starting_weights: dict[str, str] | None = None,
    augment: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The summary of a run that ended at ``state.step``; ``final``: its last progress figures."""
    history = state.history
    trained = state.step - state.first_step
    images_per_sec = None
    if trained:
        images_per_sec = round(trained * plan.global_batch / max(train_seconds, 1e-9), 2)
    return {
        "final_train_loss": history.get("train_loss"),
        "val_accuracy": history.get("val_accuracy"),
        "val_loss": history.get("val_loss"),
        "steps": state.step,
        "epochs": state.step // plan.steps_per_epoch,
        "steps_per_epoch": plan.steps_per_epoch,
        "world_size": world_size,
        "global_batch_size": plan.global_batch,
        "wall_time_s": round(wall_seconds, 3),
        "train_time_s": round(train_seconds, 3),
        "images_per_sec": images_per_sec,
        "resumed_from_step": state.resumed_from,
        "restarts": state.restarts,
        "arch": arch,
        "num_classes": num_classes,
        "precision": precision,
        "device": device,
        "replicas_in_sync": in_sync,
        "skipped_images": {"count": len(skipped_images), "keys": skipped_images},
        "starting_weights": starting_weights,
        "augment": augment,
        SUMMARY_KEY: final.trainer_status(),  # the final progress figures, as reported
    }


def outputs_written_at(output_dir: Path, step: int) -> bool:
    """``summary.json`` of ``step`` and ``model/model.json`` exist in ``output_dir``."""
    try:
        written = json.loads((output_dir / SUMMARY_FILE).read_text())
    except (OSError, ValueError):
        return False
    model_json = output_dir / "model" / "model.json"
    return isinstance(written, dict) and written.get("steps") == step and model_json.is_file()
