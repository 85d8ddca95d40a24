"""Helpers for KFP artifacts inside a running step (imports nothing from kfp: the executor has
already imported it, and importing kfp.dsl modules from a step's body can hit a circular import)."""

from pathlib import Path

from kfp_ddp.atomic_files import write_json_atomic


def write_metadata_file(artifact) -> None:
    """Write a metadata-only artifact's metadata (Metrics, ClassificationMetrics) to its path.

    KFP keeps these artifacts' values in metadata only, so nothing exists at ``artifact.path``;
    ``kfp.local`` then treats the task's outputs as missing and never reuses a cached result.
    The JSON file makes the artifact real (and downloadable from the UI) on every backend.
    """
    write_json_atomic(Path(artifact.path), dict(artifact.metadata))
