"""The data step knows how many training images there are: a batch size that a rank's share
cannot fill is refused there, in seconds, naming batch_size (before, the trainer refused it on
every node after the staging); a run implausibly long is warned of, not refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from kfp import dsl

from pipelines.run_size import RunSize
from pipelines.steps import list_dataset_step, stage_dataset_step
from tests import yaml_fast
from tests.image_data import write_image_folder
from tests.pipelines.conftest import upload_folder
from trainer.epoch_size import steps_per_epoch

SIZE = {"workers": 2, "gpus_per_worker": 0, "nproc_per_node": 0, "epochs": 1, "image_size": 16}


def _run(images: int, **given: int) -> RunSize:
    run = RunSize.of(images, **(SIZE | {"batch_size": 8} | given))
    assert run is not None
    return run


def test_a_batch_no_rank_can_fill_is_refused_naming_batch_size_and_the_largest_that_fits():
    run = _run(20, batch_size=16)  # 2 ranks x 10 images each
    with pytest.raises(ValueError) as refused:
        run.check()
    assert str(refused.value) == (
        "batch_size=16: each of the 2 ranks trains on 10 of the 20 training images, fewer than "
        "one batch: set batch_size to 10 or less, use fewer workers or processes, or add images"
    )
    _run(20, batch_size=10).check()  # the largest that fits trains one step per epoch


@pytest.mark.parametrize("images", [1, 7, 20, 21, 63, 64, 65, 1000])
@pytest.mark.parametrize("batch", [1, 4, 10, 32])
@pytest.mark.parametrize(("workers", "gpus", "nproc"), [(1, 0, 0), (2, 0, 0), (2, 4, 0), (3, 2, 1)])
def test_the_step_refuses_exactly_what_the_trainer_would(images, batch, workers, gpus, nproc):
    run = _run(
        images, batch_size=batch, workers=workers, gpus_per_worker=gpus, nproc_per_node=nproc
    )
    world = workers * (nproc or gpus or 1)
    assert run.world_size == world
    trains = steps_per_epoch(images, batch, world) >= 1  # the trainer's own rule (build_data)
    if trains:
        run.check()
    else:
        with pytest.raises(ValueError, match="^batch_size="):
            run.check()


def test_an_epoch_count_that_takes_years_is_a_warning_not_a_refusal():
    typo = _run(1000, epochs=1_000_000_000, batch_size=10)
    typo.check()  # not refused
    (warning,) = typo.warnings()
    assert warning.startswith("epochs=1000000000 x 50 steps per epoch would take at least ")
    assert "years on 2 CPU process(es) even at the fastest rate measured" in warning
    assert _run(1000, epochs=300, batch_size=10).warnings() == []  # a long run, not a typo
    # On GPUs, at 224 px, a year is about 5,772 images/s x 2 GPUs x 3.15e7 s; 1.2M images/epoch:
    imagenet = dict(gpus_per_worker=1, image_size=224, batch_size=256)
    assert _run(1_281_167, epochs=300, **imagenet).warnings() == []
    assert _run(1_281_167, epochs=300_000, **imagenet).warnings() != []


def test_a_step_used_without_the_sizes_checks_nothing():
    assert RunSize.of(5, **(SIZE | {"workers": 0, "batch_size": 64})) is None
    assert RunSize.of(5, **(SIZE | {"batch_size": 0})) is None


STEPS = {
    "object-store": lambda uri, tmp, **size: list_dataset_step(
        data_uri=uri, endpoint_url="", dataset=dsl.Dataset(uri=str(tmp / "ds")), **size
    ),
    "shared-volume": lambda uri, tmp, **size: stage_dataset_step(
        data_uri=uri,
        endpoint_url="",
        workspace_path=str(tmp / "ws"),
        dataset=dsl.Dataset(uri=str(tmp / "ds")),
        **size,
    ),
}


@pytest.mark.parametrize("storage", STEPS)
def test_the_data_step_fails_in_seconds_with_the_words_a_user_sees(s3, tmp_path, capsys, storage):
    folder = write_image_folder(tmp_path / "data", classes=("cat", "dog"), per_class=6)
    uri = upload_folder(s3, folder, "run-size", f"small-{storage}")
    with pytest.raises(SystemExit) as failed:
        STEPS[storage](uri, tmp_path, **SIZE, batch_size=64)
    out = capsys.readouterr().out
    assert "data: images per class: train/ cat 6, dog 6" in out
    assert (
        "bad argument: batch_size=64: each of the 2 ranks trains on 6 of the 12 training images"
    ) in out
    assert str(failed.value).startswith("bad pipeline argument: batch_size=64: ")


@pytest.mark.parametrize("storage", STEPS)
def test_the_data_step_warns_of_a_run_of_years_and_goes_on(s3, tmp_path, capsys, storage):
    folder = write_image_folder(tmp_path / "data", classes=("cat", "dog"), per_class=6)
    uri = upload_folder(s3, folder, "run-size", f"long-{storage}")
    size = SIZE | {"batch_size": 2, "epochs": 10**10}
    assert len(STEPS[storage](uri, tmp_path, **size).digest) == 64  # the step went on
    out = capsys.readouterr().out
    assert "data: warning: epochs=10000000000 x 3 steps per epoch would take at least" in out


@pytest.mark.parametrize("name", ["training_pipeline.yaml", "training_pipeline_shared_volume.yaml"])
def test_the_compiled_pipelines_hand_the_data_step_the_run_parameters(name):

    from pipelines.training import RUN_SIZE_INPUTS

    path = Path(__file__).resolve().parents[2] / "pipelines" / "compiled" / name
    spec = next(yaml_fast.safe_load_all(path.read_text()))
    tasks = spec["components"]["comp-exit-handler-1"]["dag"]["tasks"]
    (data,) = [t for n, t in tasks.items() if n in ("list-dataset-step", "stage-dataset-step")]
    given = data["inputs"]["parameters"]
    for parameter in RUN_SIZE_INPUTS:
        assert given[parameter] == {"componentInputParameter": f"pipelinechannel--{parameter}"}
