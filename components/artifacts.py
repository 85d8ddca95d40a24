"""Helpers for KFP artifacts inside a running step (imports nothing from kfp: the executor has
already imported it, and importing kfp.dsl modules from a step's body can hit a circular import)."""


def write_metadata_file(artifact) -> None:
    """Write a metadata-only artifact's metadata (Metrics, ClassificationMetrics) to its path.

    KFP keeps these artifacts' values in metadata only, so nothing exists at ``artifact.path``;
    ``kfp.local`` then treats the task's outputs as missing and never reuses a cached result.
    The JSON file makes the artifact real (and downloadable from the UI) on every backend.
    """
    import json
    import os
    import tempfile

    folder = os.path.dirname(artifact.path) or "."
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".metadata.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(dict(artifact.metadata), handle, indent=2, sort_keys=True, default=str)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, artifact.path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
