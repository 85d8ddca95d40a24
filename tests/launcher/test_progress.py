"""The trainer's progress in the launcher: its step log and its Metrics output show the figures the
trainer reports, by the same names and value texts (``trainer.progress`` defines them once).

On the real API server (tests/cluster) the test writes ``status.trainerStatus`` to the TrainJob's
status subresource, as Kubeflow Trainer's status server does, while the launcher follows the job;
absent and malformed statuses are tolerated. Without a cluster, the real trainer's final figures
reach the step's Metrics through ``summary.json`` (every API and backend).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from kfp import dsl

from components.launcher.progress import ProgressLog, final_progress
from components.launcher.step import TrainingStepInputs, run_folder, run_training_step
from tests.cluster.play import JobPods
from tests.launcher.k8s_helpers import kubeconfig_of, run, spec
from tests.trainer.trainjob_status_server import apply_trainer_status
from trainer.progress import SUMMARY_KEY, Progress, ProgressReport

FIGURES = {"loss": 0.523456789, "val_accuracy": 0.8125, "images_per_second": 1234.5}


def status_at(step: int, total: int = 100, eta_s: float | None = 60.0, **figures) -> dict:
    """A ``trainerStatus`` as our trainer's rank 0 sends it (``trainer.progress.Progress``)."""
    metrics = {"epoch": step // 10, "step": step, "total_steps": total} | FIGURES | figures
    return Progress(step=step, total_steps=total, eta_s=eta_s, metrics=metrics).trainer_status()


def progress_lines(lines: list[str]) -> list[str]:
    marker = "trainer progress: "
    return [line.split(marker, 1)[1] for line in lines if marker in line]


# ------------------------------------------------------------------- the figures, read back
def test_a_report_reads_back_as_the_trainer_wrote_it():
    status = status_at(40, eta_s=125.4)
    report = ProgressReport.read(status)
    assert report is not None and report.updated == status["lastUpdatedTime"]
    assert report.line() == (
        "progress 40% | ETA 2m05s | loss 0.523457 | val_accuracy 0.8125 | "
        "images_per_second 1234.5 | epoch 4 | step 40 | total_steps 100"
    )
    assert report.metrics() == {
        "progress_percentage": 40.0,
        "estimated_remaining_seconds": 125.0,
        "loss": 0.523457,  # the value text the status holds and the line shows
        "val_accuracy": 0.8125,
        "images_per_second": 1234.5,
        "epoch": 4.0,
        "step": 40.0,
        "total_steps": 100.0,
    }
    restamped = ProgressReport.read(status | {"lastUpdatedTime": "2030-01-01T00:00:00Z"})
    assert restamped == report  # the same figures: no news


@pytest.mark.parametrize(
    "status",
    [
        None,
        "50%",
        [],
        {},
        {"lastUpdatedTime": "2026-01-01T00:00:00Z"},
        {"progressPercentage": "50", "estimatedRemainingSeconds": -1, "metrics": "loss=1"},
        {"progressPercentage": True, "metrics": [None, 3, {"name": 1}, {"name": "x", "value": ""}]},
        {"progressPercentage": 101, "estimatedRemainingSeconds": float("nan")},
    ],
)
def test_a_status_without_usable_figures_reads_as_none(status):
    assert ProgressReport.read(status) is None


def test_odd_entries_are_skipped_and_words_stay_out_of_the_metrics():
    report = ProgressReport.read(
        {
            "progressPercentage": 7.0,
            "metrics": [
                {"name": "custom_score", "value": "n/a"},
                {"name": "loss", "value": "nan"},
                {"name": "val_accuracy", "value": 0.5},  # a number where a string belongs
                {"name": "eval\nline", "value": "1" * 200},
                {"value": "2"},
                {"name": "loss", "value": "9"},  # a second entry of a name: the first counts
            ],
        }
    )
    assert report is not None
    assert report.line() == (
        f"progress 7% | loss nan | val_accuracy 0.5 | custom_score n/a | eval line {'1' * 64}"
    )
    assert report.metrics() == {
        "progress_percentage": 7.0,
        "val_accuracy": 0.5,
        "eval line": float("1" * 64),
    }


def test_the_log_has_a_line_per_change_of_the_figures_and_one_note_for_a_bad_status():
    noted: list[str] = []
    log = ProgressLog(noted.append)
    first, second = status_at(10), status_at(20)
    for job in (
        {"status": {}},
        {"status": {"trainerStatus": first}},
        {"status": {"trainerStatus": first | {"lastUpdatedTime": "2030-01-01T00:00:00Z"}}},
        {"status": {"trainerStatus": {"lastUpdatedTime": "2030-01-01T00:00:00Z"}}},
        {"status": {"trainerStatus": {"metrics": "junk"}}},
        {"status": "junk"},
        None,
        {"status": {"trainerStatus": second}},
    ):
        log.observe(job)
    assert progress_lines(noted) == [
        ProgressReport.read(first).line(),
        ProgressReport.read(second).line(),
    ]
    unreadable = [n for n in noted if "holds no progress to show" in n]
    assert len(unreadable) == 1 and len(noted) == 3
    assert log.status == second


def test_the_final_figures_come_from_the_summary_else_from_the_last_status():
    written, seen = status_at(100, eta_s=0), status_at(90)
    chosen = final_progress({SUMMARY_KEY: written, "steps": 100}, seen)
    assert chosen is not None and chosen.source == "summary.json"
    assert chosen.report == ProgressReport.read(written)
    chosen = final_progress({"steps": 100}, seen)
    assert chosen is not None and chosen.report == ProgressReport.read(seen)
    assert final_progress({SUMMARY_KEY: "junk"}, None) is None
    assert final_progress(None, None) is None


# --------------------------------------------------------------- on the real API server
def reporting_trainer(k8s, statuses: list[dict], *, outputs: Path | None = None, summary=None):
    """Scenario: one node runs; its statuses reach the TrainJob's status subresource one by one
    (as the status server applies them); then the node writes its outputs and exits 0."""
    plane = k8s.cluster.plane

    def scenario(job: JobPods) -> None:
        (pod,) = job.pods(1)
        job.run(pod)
        job.log(pod, "[trainer] training")
        for status in statuses:
            apply_trainer_status(plane, k8s.name, job.job, status)
            job.sleep(0.3)
        if outputs is not None:
            write_outputs(outputs, summary or {})
        job.exit(pod, 0)

    return scenario


def write_outputs(folder: Path, summary: dict) -> None:
    """What our trainer's rank 0 leaves in its output folder."""
    (folder / "model").mkdir(parents=True, exist_ok=True)
    (folder / "model" / "weights.pt").write_bytes(b"weights")
    (folder / "model" / "model.json").write_text(json.dumps({"arch": "resnet18"}))
    (folder / "metrics.jsonl").write_text("")
    (folder / "summary.json").write_text(json.dumps(summary))


def test_the_launcher_logs_each_new_trainjob_status_and_keeps_the_last(k8s):
    first, second = status_at(30), status_at(60, eta_s=30.0, loss=0.25)
    restamped = second | {"lastUpdatedTime": "2030-01-01T00:00:00Z"}
    empty = {"lastUpdatedTime": "2030-01-01T00:00:01Z", "metrics": []}  # the CRD takes it
    words = {"lastUpdatedTime": "2030-01-01T00:00:02Z", "metrics": [{"name": "loss", "value": "?"}]}
    statuses = [first, second, restamped, empty, words]
    lines: list[str] = []
    result = run(k8s, spec(k8s, "trainjob", workers=1), lines, reporting_trainer(k8s, statuses))
    assert result.phase == "Succeeded"
    assert progress_lines(lines) == [
        "progress 30% | ETA 1m00s | loss 0.523457 | val_accuracy 0.8125 | "
        "images_per_second 1234.5 | epoch 3 | step 30 | total_steps 100",
        "progress 60% | ETA 0m30s | loss 0.25 | val_accuracy 0.8125 | "
        "images_per_second 1234.5 | epoch 6 | step 60 | total_steps 100",
        "loss ?",
    ], "\n".join(lines)
    assert sum("holds no progress to show" in line for line in lines) == 1
    assert result.trainer_status == words  # as the API server holds it


def test_a_pytorchjob_and_a_trainjob_without_a_status_log_no_progress(k8s):
    for api in ("trainjob", "pytorchjob"):
        lines: list[str] = []
        result = run(k8s, spec(k8s, api, name=f"quiet-{api}", workers=1), lines, quiet_node)
        assert result.phase == "Succeeded" and result.trainer_status is None
        assert not [x for x in lines if "trainer progress" in x or "trainerStatus" in x], lines


def quiet_node(job: JobPods) -> None:
    (pod,) = job.pods(1)
    job.run(pod)
    job.log(pod, "[trainer] training")
    job.sleep(1.0)
    job.exit(pod, 0)


def step_inputs(k8s, tmp_path: Path) -> TrainingStepInputs:
    """The training step on the cluster, its output folder on a (simulated) shared claim."""
    kubeconfig = kubeconfig_of(k8s.launcher_configuration(), tmp_path / "kubeconfig")
    options = {"config_file": str(kubeconfig), "poll_interval_s": 1.0}
    return TrainingStepInputs(
        api="trainjob",
        name="job",
        namespace=k8s.name,
        workers=1,
        data_dir=str(tmp_path / "data"),
        output_dir=str(tmp_path / "out"),
        overrides_json=json.dumps({"backend_options": options}),
        run_id="run-1",
    )


@pytest.mark.parametrize("in_summary", [False, True], ids=["status-only", "summary"])
def test_the_step_log_and_metrics_carry_the_same_figures(k8s, tmp_path, capsys, in_summary):
    """A program that reports progress but writes no figures into summary.json: the last status
    seen becomes the Metrics; our trainer (its final figures in summary.json too): those."""
    inputs = step_inputs(k8s, tmp_path)
    middle = status_at(50, loss=0.5, learning_rate=0.001)
    final = status_at(100, eta_s=0, loss=0.125, learning_rate=0.0001)
    summary = {"steps": 100, "world_size": 1, "val_accuracy": 0.8125, "final_train_loss": 0.125}
    if in_summary:
        summary[SUMMARY_KEY] = final
    k8s.scenario(
        "trainjob",
        "job",
        reporting_trainer(k8s, [middle, final], outputs=Path(run_folder(inputs)), summary=summary),
    )
    model = dsl.Model(uri=str(tmp_path / "artifacts" / "model"))
    metrics = dsl.Metrics(uri=str(tmp_path / "artifacts" / "metrics"))
    result = run_training_step(inputs, model=model, metrics=metrics)
    out = capsys.readouterr().out
    assert result.phase == "Succeeded"
    shown = ProgressReport.read(final).line()
    assert shown == (
        "progress 100% | ETA 0m00s | loss 0.125 | val_accuracy 0.8125 | images_per_second 1234.5 "
        "| learning_rate 0.0001 | epoch 10 | step 100 | total_steps 100"
    )
    assert f"[launcher] trainer progress: {ProgressReport.read(middle).line()}" in out
    assert f"[launcher] trainer progress: {shown}" in out  # while it followed the job
    source = "summary.json" if in_summary else "the TrainJob's last status.trainerStatus"
    assert f"[launcher] Metrics: the trainer's final progress ({source}): {shown}" in out
    figures = {m["name"]: float(m["value"]) for m in final["metrics"]}
    figures |= {"progress_percentage": 100.0, "estimated_remaining_seconds": 0.0}
    assert {name: metrics.metadata[name] for name in figures} == figures
    # The summary's own figures stay, under their names (they agree with the reported ones).
    assert metrics.metadata["final_train_loss"] == metrics.metadata["loss"] == 0.125
    assert metrics.metadata["steps"] == metrics.metadata["step"] == 100
    assert metrics.metadata["world_size"] == 1 and "job_duration_s" in metrics.metadata


def test_a_nan_in_the_summary_is_left_out_of_the_metrics(k8s, tmp_path, capsys):
    """A program of one's own whose loss went to nan: KFP cannot store nan in an artifact's
    metadata ("Fail to serialize NaN" failed the step after the training), so it is left out,
    and said."""
    inputs = step_inputs(k8s, tmp_path)
    summary = {"steps": 100, "world_size": 1, "val_accuracy": float("nan")}
    summary["final_train_loss"] = float("inf")
    k8s.scenario(
        "trainjob",
        "job",
        reporting_trainer(k8s, [], outputs=Path(run_folder(inputs)), summary=summary),
    )
    model = dsl.Model(uri=str(tmp_path / "artifacts" / "model"))
    metrics = dsl.Metrics(uri=str(tmp_path / "artifacts" / "metrics"))
    assert run_training_step(inputs, model=model, metrics=metrics).phase == "Succeeded"
    out = capsys.readouterr().out
    assert "[launcher] Metrics: the trainer's val_accuracy is nan, left out" in out
    assert "[launcher] Metrics: the trainer's final_train_loss is inf, left out" in out
    assert metrics.metadata["steps"] == 100 and "val_accuracy" not in metrics.metadata
    assert model.metadata["val_accuracy"] is None
    json.dumps([metrics.metadata, model.metadata], allow_nan=False)  # what KFP can store


# ------------------------------------------------------------- the real trainer, no cluster
@pytest.mark.slow
def test_the_real_trainers_final_figures_reach_the_metrics_locally(tmp_path, image_folder, capsys):
    """The local backend (no trainerStatus): the trainer's final figures in summary.json are
    what the step logs and its Metrics carry."""
    inputs = TrainingStepInputs(
        api="pytorchjob",
        backend="local",
        workers=1,
        data_dir=str(image_folder),
        output_dir=str(tmp_path / "out"),
        model_name="mobilenet_v3_small",
        epochs=1,
        trainer_args=["--image-size", "16", "--batch-size", "8", "--tensorboard-dir", "none"],
        run_id="run-1",
    )
    model = dsl.Model(uri=str(tmp_path / "artifacts" / "model"))
    metrics = dsl.Metrics(uri=str(tmp_path / "artifacts" / "metrics"))
    started = time.time()
    result = run_training_step(inputs, model=model, metrics=metrics)
    out = capsys.readouterr().out
    written = result.summary[SUMMARY_KEY]
    assert written["progressPercentage"] == 100 and written["estimatedRemainingSeconds"] == 0
    reported = {m["name"]: m["value"] for m in written["metrics"]}
    assert reported["step"] == reported["total_steps"] == str(result.summary["steps"])
    assert float(reported["val_accuracy"]) == pytest.approx(result.summary["val_accuracy"])
    assert float(reported["loss"]) == pytest.approx(result.summary["final_train_loss"], rel=1e-5)
    assert written["lastUpdatedTime"] >= time.strftime("%Y-%m-%dT%H:%M", time.gmtime(started))
    shown = ProgressReport.read(written).line()
    assert f"[launcher] Metrics: the trainer's final progress (summary.json): {shown}" in out
    for name, value in reported.items():
        assert metrics.metadata[name] == float(value), name
    assert metrics.metadata["progress_percentage"] == 100.0
