"""`collect_local_run`: what a kfp.local run folder says about the run (no pipeline executed)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from pipelines.local_run import _cached_task_dirs, _CacheHits, collect_local_run
from pipelines.training import PIPELINE_NAME


def write_output(task_dir: Path, output: dict) -> None:
    task_dir.mkdir(parents=True, exist_ok=True)
    (task_dir / "executor_output.json").write_text(json.dumps(output))


def artifact(name: str, uri: Path, **metadata) -> dict:
    return {"artifacts": [{"name": name, "uri": str(uri), "metadata": metadata}]}


def test_reads_gate_metrics_model_and_published_uri(tmp_path: Path) -> None:
    run = tmp_path / f"{PIPELINE_NAME}-2026-11-22-01-00-00-000000"
    (run / "training-job-component" / "model").mkdir(parents=True)
    write_output(
        run / "training-job-component",
        {"artifacts": {"metrics": artifact("metrics", run / "x", images_per_sec=120.5)}},
    )
    (run / "evaluate-component").mkdir(parents=True)
    (run / "evaluate-component" / "report").write_text("<html><img></html>")
    write_output(
        run / "evaluate-component",
        {
            "parameterValues": {"Output": True},
            "artifacts": {
                "metrics": artifact("metrics", run / "m", accuracy=0.98, display_name="m"),
                "report": artifact("report", run / "r", eval={"accuracy": 0.98, "reason": "ok"}),
            },
        },
    )
    write_output(run / "publish-model-step", {"parameterValues": {"Output": "s3://m/run-1/"}})
    result = collect_local_run(run, tmp_path / "ws")
    assert result.passed is True
    assert result.metrics == {"accuracy": 0.98}
    assert result.evaluation == {"accuracy": 0.98, "reason": "ok"}
    assert result.training == {"images_per_sec": 120.5}
    assert result.model_dir == run / "training-job-component" / "model"
    assert result.report == run / "evaluate-component" / "report"
    assert result.published_uri == "s3://m/run-1/"
    assert "published:   s3://m/run-1/" in result.describe()


def test_cached_tasks_point_at_the_run_that_computed_them(tmp_path: Path) -> None:
    earlier = tmp_path / f"{PIPELINE_NAME}-2026-11-22-01-00-00-000000"
    later = tmp_path / f"{PIPELINE_NAME}-2026-11-22-02-00-00-000000"
    later.mkdir()
    write_output(
        earlier / "evaluate-component",
        {"parameterValues": {"Output": False}, "artifacts": {}},
    )
    cache = tmp_path / ".kfp_cache"
    cache.mkdir()
    (cache / "abc123def456ffff.json").write_text(
        json.dumps({"Output": False, "metrics": {"uri": str(earlier / "evaluate-component" / "m")}})
    )
    hits = _CacheHits()
    hits.handle(
        logging.LogRecord(
            "root",
            logging.INFO,
            "",
            0,
            "Task evaluate-component cache hit (key=abc123def456); skipping execution.",
            None,
            None,
        )
    )
    cached = _cached_task_dirs(hits.hits, cache)
    assert cached == {"evaluate-component": earlier / "evaluate-component"}
    result = collect_local_run(later, tmp_path / "ws", cached)
    assert result.passed is False
    assert result.cached_tasks == ["evaluate-component"]
    assert result.published_uri is None
    assert "published:   no" in result.describe()
