"""Publish a model that passed the gate: its files and its evaluation, to ``<publish_uri>/<run>/``.

Staged in a temporary folder of the step (no shared volume needed), uploaded with the verified
S3 sync, never with ``--delete``: a run's own prefix only ever gains files.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from components.s3_sync import sync
from kfp_ddp.atomic_files import write_json_atomic
from pipelines.latest_model import ANY_RUN, move_pointer, new_pointer


def read_evaluation(path: str | None, report_metadata: Any) -> Any:
    """The evaluation to publish as eval.json: the evaluation step's JSON file at ``path``, or,
    without one, the report's "eval" metadata (None when neither has it)."""
    if path:
        try:
            return json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise ValueError(
                f"the evaluation artifact at {path} is not the evaluation step's JSON ({err}); "
                "connect the evaluation step's 'evaluation' output to 'evaluation'"
            ) from err
    return dict(report_metadata or {}).get("eval")


def stage_files(model_path: str, report_path: str, evaluation: Any, folder: Path) -> list[str]:
    """Gather the model's files, ``eval.json`` and ``report.html`` into ``folder``."""
    source = Path(model_path)
    folder.mkdir(parents=True, exist_ok=True)
    if source.is_dir():
        for item in sorted(source.iterdir()):
            if item.is_file():
                shutil.copy2(item, folder / item.name)
    elif source.is_file():
        shutil.copy2(source, folder / source.name)
    else:
        raise FileNotFoundError(f"the model artifact has no files at {source}")
    if evaluation is not None:
        write_json_atomic(folder / "eval.json", evaluation)
    if Path(report_path).is_file():
        shutil.copy2(report_path, folder / "report.html")
    return sorted(p.name for p in folder.iterdir())


def publish_model(
    model_path: str,
    report_path: str,
    *,
    evaluation: Any,
    publish_uri: str,
    run_id: str,
    endpoint_url: str | None = None,
    latest_run: str = ANY_RUN,
    data_digest: str = "",
) -> str:
    """Upload the model and its evaluation to ``publish_uri/<run_id>/``, then point
    ``publish_uri/latest.json`` at it if it still names ``latest_run``; returns the model's URI."""
    destination = f"{publish_uri.rstrip('/')}/{run_id}/"
    with tempfile.TemporaryDirectory(prefix="kfp-ddp-publish-") as tmp:
        names = stage_files(model_path, report_path, evaluation, Path(tmp))
        report = sync(tmp, destination, endpoint_url=endpoint_url, progress=False)
    print(f"published {names} to {destination}: {report.summary()}")
    pointer = new_pointer(
        run_id=run_id, uri=destination, evaluation=evaluation, data_digest=data_digest
    )
    moved, said = move_pointer(publish_uri, pointer, seen_run=latest_run, endpoint_url=endpoint_url)
    print(f"latest: {said}" if moved else f"latest: not moved: {said}", flush=True)
    return destination
