"""The pipeline's data step (sync into a folder of its own source, layout check, frozen snapshot)
against the test S3 server, and the pipeline's argument check as its first step in kfp.local."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from components.s3_sync import sync
from pipelines.dataset import DatasetLayoutError, snapshot_path, source_key, stage_dataset
from pipelines.validation import ArgumentError, check_arguments
from tests.image_data import write_image_folder
from tests.kfp_local import workspace_root


def upload(s3, tmp_path: Path, name: str, **layout) -> str:
    bucket = s3.create_bucket("pipeline-data")
    data = write_image_folder(tmp_path / f"local-{name}", per_class=3, **layout)
    uri = f"s3://{bucket}/{name}"
    sync(str(data), uri)
    return uri


def test_each_source_gets_its_own_folder_and_a_frozen_snapshot(s3, tmp_path: Path):
    cats, dogs = upload(s3, tmp_path, "cats"), upload(s3, tmp_path, "dogs", seed=1)
    workspace = tmp_path / "ws"
    a = stage_dataset(cats, workspace)
    b = stage_dataset(dogs, workspace)
    assert a.snapshot != b.snapshot
    assert a.snapshot.parent.name == source_key(cats, None) != b.snapshot.parent.name
    assert a.snapshot == snapshot_path(workspace, cats, None, a.digest)  # what render shows
    assert sorted(p.name for p in a.snapshot.iterdir()) == ["train", "val"]
    assert a.files == 3 * (3 + 4) and a.classes == 3
    # Same data again: nothing transferred, the same snapshot.
    again = stage_dataset(cats, workspace)
    assert again.transferred == 0 and again.snapshot == a.snapshot


def test_a_snapshot_never_changes_when_the_source_does(s3, tmp_path: Path):
    uri = upload(s3, tmp_path, "changing")
    workspace = tmp_path / "ws"
    first = stage_dataset(uri, workspace)
    image = next((first.snapshot / "train" / "circle").iterdir())
    before = image.read_bytes()
    # The source changes: one image replaced, one removed.
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    client = s3.client()
    client.put_object(Bucket=bucket, Key=f"{prefix}/train/circle/{image.name}", Body=b"new bytes")
    second_victim = sorted((first.snapshot / "train" / "square").iterdir())[0]
    client.delete_object(Bucket=bucket, Key=f"{prefix}/train/square/{second_victim.name}")
    second = stage_dataset(uri, workspace)
    assert second.digest != first.digest and second.snapshot != first.snapshot
    assert (second.snapshot / "train" / "circle" / image.name).read_bytes() == b"new bytes"
    assert not (second.snapshot / "train" / "square" / second_victim.name).exists()
    # The first run's data is untouched (hard links: the sync renamed a new file into place).
    assert image.read_bytes() == before and second_victim.is_file()


def test_a_data_set_without_val_is_refused_at_sync_time(s3, tmp_path: Path):
    uri = upload(s3, tmp_path, "train-only", val_per_class=None)
    with pytest.raises(DatasetLayoutError, match=r"has no val/ folder .*val/ is what the eval"):
        stage_dataset(uri, tmp_path / "ws")


def test_a_typo_in_data_uri_deletes_nothing_and_says_what_is_missing(s3, tmp_path: Path):
    uri = upload(s3, tmp_path, "real")
    workspace = tmp_path / "ws"
    real = stage_dataset(uri, workspace)
    with pytest.raises(DatasetLayoutError, match="has no train/ folder"):
        stage_dataset(uri + "-typo", workspace)
    assert sum(1 for _ in real.snapshot.rglob("*.png")) == real.files  # nothing lost
    assert (real.snapshot.parent / "mirror" / "train").is_dir()


def test_val_classes_must_be_training_classes(s3, tmp_path: Path):
    uri = upload(s3, tmp_path, "odd")
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    s3.client().put_object(Bucket=bucket, Key=f"{prefix}/val/unicorn/a.png", Body=b"x")
    with pytest.raises(
        DatasetLayoutError, match=r"val/ has classes that train/ lacks: \['unicorn'\]"
    ):
        stage_dataset(uri, tmp_path / "ws")


# -- the argument check as the pipeline's first step -------------------------------------------


def test_every_problem_is_listed_at_once():
    from pipelines.cli_arguments import with_defaults

    arguments = with_defaults(
        {
            "data_uri": "s3:/x",
            "publish_uri": "s3://bkt/m",
            "accuracy_threshold": -1,
            "tolerance": 0.0,
            "trainer_args": "--epochs 3",
        }
    ) | {"backend": "kubernetes", "workspace_path": "/workspace"}
    with pytest.raises(ArgumentError) as err:
        check_arguments(arguments)
    problems = err.value.problems
    assert any(p.startswith("data_uri='s3:/x'") for p in problems)
    assert any(p.startswith("accuracy_threshold=-1") for p in problems)
    assert any(p.startswith("trainer_args='--epochs 3': must be a list") for p in problems)


@pytest.mark.slow
def test_a_ui_run_with_a_bad_argument_fails_in_its_first_step(tmp_path: Path, capfd):
    """The Kubeflow UI submits without our CLI: the pipeline checks its arguments itself."""
    from kfp import local

    from pipelines.training import build_training_pipeline

    local.init(
        runner=local.SubprocessRunner(use_venv=False),
        pipeline_root=str(tmp_path / "root"),
        workspace_root=workspace_root(tmp_path),
        raise_on_error=False,
    )
    pipeline = build_training_pipeline(backend="local", workspace_path=str(tmp_path / "ws"))
    started = time.monotonic()
    pipeline(data_uri="s3://bucket/data", publish_uri="s3://bucket/models", epochs=0, workers=0)
    assert time.monotonic() - started < 60
    (run_dir,) = (tmp_path / "root").iterdir()
    # Nothing ran but the check (and the exit handler's cleanup): no data moved, no job.
    assert set(os.listdir(run_dir)) <= {"check-arguments-step", "cleanup-component"}
    assert not (tmp_path / "ws" / "data").exists()
    log = capfd.readouterr()
    output = log.out + log.err
    assert "bad argument: epochs=0: --epochs 0 is too small" in output
    assert "bad argument: workers=0: TrainSpec.workers=0 is invalid" in output
