"""The KFP components: the plain step function with KFP's artifact classes, and kfp.local."""

from __future__ import annotations

import dataclasses
import inspect
import json
import textwrap
from pathlib import Path

import pytest
from kfp import dsl

from components.kfp.factory import make_component
from components.kfp.launcher import (
    make_cleanup_op,
    make_training_job_op,
    training_job_component,
    training_job_function,
    training_job_source,
)
from components.launcher import SpecError
from components.launcher.step import (
    TrainingStepInputs,
    run_folder,
    run_identity,
    run_training_step,
    trainer_args_for,
)
from tests.generated_modules import import_written
from tests.kfp_local import workspace_root

# Writes what the trainer writes (rank 0), so the step's export runs without minutes of training.
WRITER = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path

    args = sys.argv[1:]
    out = Path(args[args.index("--output-dir") + 1])
    print("args:", " ".join(args), flush=True)
    if os.environ["RANK"] == "0":
        (out / "model").mkdir(parents=True, exist_ok=True)
        (out / "model" / "weights.pt").write_bytes(b"weights")
        (out / "model" / "model.json").write_text(json.dumps({"arch": "resnet18"}))
        (out / "metrics.jsonl").write_text('{"type": "val", "val_accuracy": 0.75}\\n')
        summary = {"val_accuracy": 0.75, "steps": 12, "world_size": int(os.environ["WORLD_SIZE"]),
                   "resumed_from_step": None, "arch": "resnet18",
                   "skipped_images": {"count": 2, "keys": ["train/a/x.jpg", "val/a/y.png"]}}
        (out / "summary.json").write_text(json.dumps(summary))
    """
)


@pytest.fixture
def writer(tmp_path: Path) -> Path:
    path = tmp_path / "writer.py"
    path.write_text(WRITER)
    return path


def step_params(tmp_path: Path, writer: Path, **kw) -> dict:
    return {
        "api": "pytorchjob",  # the writer reads RANK like a PyTorchJob pod with a Master
        "name": "",
        "namespace": "",
        "image": "img:1",
        "workers": 2,
        "nproc_per_node": 1,
        "gpus_per_worker": 0,
        "data_dir": str(tmp_path / "data"),
        "output_dir": str(tmp_path / "train"),
        "trainer_args": ["--seed", "3"],
        "backend": "local",
        "pvc_name": "",
        "pvc_mount_path": "",
        "data_digest": "sha256:abc",
        "overrides_json": json.dumps({"command": ["python", str(writer)], "pytorch_master": True}),
        "epochs": 2,
        "model_name": "resnet18",
    } | kw


def test_step_fills_the_model_and_metrics_artifacts(tmp_path: Path, writer: Path):
    run_uuid = "5d0c5e4e-1111-4a2b-9c3d-0123456789ab"
    model = dsl.Model(uri=str(tmp_path / "artifacts" / run_uuid / "train" / "model"))
    metrics = dsl.Metrics(uri=str(tmp_path / "artifacts" / run_uuid / "train" / "metrics"))
    result = run_training_step(
        TrainingStepInputs(**step_params(tmp_path, writer)), model=model, metrics=metrics
    )
    assert result.phase == "Succeeded"
    folder = Path(model.path)
    assert sorted(p.name for p in folder.iterdir()) == [
        "metrics.jsonl",
        "model.json",
        "summary.json",
        "weights.pt",
    ]
    assert model.metadata["arch"] == "resnet18"
    assert model.metadata["val_accuracy"] == 0.75
    assert model.metadata["data_digest"] == "sha256:abc"
    assert model.metadata["world_size"] == 2
    assert metrics.metadata["val_accuracy"] == 0.75 and metrics.metadata["steps"] == 12
    assert "resumed_from_step" not in metrics.metadata  # None is not a metric
    assert metrics.metadata["job_restarts"] == 0
    # The images --skip-bad-images left out: counted in the Metrics, as in summary.json.
    assert metrics.metadata["skipped_images"] == 2 and model.metadata["skipped_images"] == 2
    # The trainer got the common flags, then the extra ones.
    args_line = next(x for x in result.log_tail if "args:" in x)
    # The output folder: one per settings (readable, plus a digest of the rest) and data digest.
    folder = run_folder(TrainingStepInputs(**step_params(tmp_path, writer)))
    assert folder.startswith(f"{tmp_path / 'train'}/resnet18-sd-e2-bd-lrd-n2x1-")
    assert folder.endswith("/sha256-abc")
    assert args_line.endswith(
        f"--data-dir {tmp_path / 'data'} --output-dir {folder} --model resnet18 --epochs 2 --seed 3"
    )
    # The job is named from the run and task, labelled with the run id found in the URI.
    assert result.name.startswith("train-")


def test_run_identity_is_stable_across_retries():
    uri = "minio://mlpipeline/v2/artifacts/p/5d0c5e4e-1111-4a2b-9c3d-0123456789ab/train/42/model"
    run_id = run_identity("", uri)
    assert run_id == "5d0c5e4e-1111-4a2b-9c3d-0123456789ab"
    assert run_identity("", uri.replace("/42/", "/43/")) == run_id  # a retry: same run
    assert run_identity("given", uri) == "given"
    # kfp.local: <root>/<run name>/<task>/<output>
    assert run_identity("", "/root/kfp-ddp-training-2026-11-23-06/train/model") == (
        "kfp-ddp-training-2026-11-23-06"
    )


def test_step_refuses_bad_overrides_and_backend(tmp_path: Path, writer: Path):
    model, metrics = dsl.Model(uri=str(tmp_path / "m")), dsl.Metrics(uri=str(tmp_path / "x"))

    def step(**kw):
        inputs = TrainingStepInputs(**step_params(tmp_path, writer, **kw))
        return run_training_step(inputs, model=model, metrics=metrics)

    with pytest.raises(SpecError, match="overrides_json is not JSON"):
        step(overrides_json="{")
    with pytest.raises(SpecError, match="unknown field.*gpus"):
        step(overrides_json='{"gpus": 1}')
    # A TrainSpec field a step input sets is refused, naming the input (one place per setting).
    with pytest.raises(SpecError, match=r"'workers' \(the step input workers\)"):
        step(overrides_json='{"workers": 4, "shm_size": "8Gi"}')
    with pytest.raises(SpecError, match=r"'pvcs' \(the step input pvc_name\)"):
        step(overrides_json='{"pvcs": []}')
    with pytest.raises(SpecError, match="backend='slurm'"):
        step(backend="slurm")
    with pytest.raises(SpecError, match=r"unknown option\(s\) \['timeout'\].*timeout_s"):
        step(overrides_json='{"backend_options": {"timeout": 5}}')
    with pytest.raises(SpecError, match="cleanup='sometimes'"):
        step(backend="kubernetes", overrides_json='{"backend_options": {"cleanup": "sometimes"}}')


def test_missing_trainer_output_is_a_clear_error(tmp_path: Path):
    model, metrics = dsl.Model(uri=str(tmp_path / "m")), dsl.Metrics(uri=str(tmp_path / "x"))
    params = step_params(
        tmp_path, tmp_path, overrides_json=json.dumps({"command": ["true"]}), workers=1
    )
    with pytest.raises(FileNotFoundError, match="lack .*pvc_name"):
        run_training_step(TrainingStepInputs(**params), model=model, metrics=metrics)


def test_other_trainer_args_or_overrides_get_another_output_folder():
    base = TrainingStepInputs(data_dir="d", output_dir="/o", data_digest="sha256:ab", epochs=3)
    folders = {
        run_folder(base),
        run_folder(dataclasses.replace(base, trainer_args=["--augment", "none"])),
        run_folder(dataclasses.replace(base, overrides_json='{"shm_size": "8Gi"}')),
        run_folder(dataclasses.replace(base, retrain_token="2026-11-23")),
        run_folder(dataclasses.replace(base, epochs=4)),
        run_folder(dataclasses.replace(base, data_digest="sha256:cd")),
    }
    assert len(folders) == 6 and all(f.startswith("/o/") for f in folders)
    # backend options change nothing that is trained: same folder (a retry resumes there)
    timeout = dataclasses.replace(base, overrides_json='{"backend_options": {"timeout_s": 9}}')
    assert run_folder(timeout) == run_folder(base)


def test_trainer_args_pass_zero_values_and_leave_none_to_the_trainer():
    unset = TrainingStepInputs(data_dir="d", output_dir="o")
    assert trainer_args_for(unset) == ["--data-dir", "d", "--output-dir", run_folder(unset)]
    inputs = TrainingStepInputs(data_dir="d", output_dir="o", lr=0.0, epochs=0)
    assert trainer_args_for(inputs)[-4:] == ["--epochs", "0", "--lr", "0.0"]
    inputs = TrainingStepInputs(data_dir="d", output_dir="o", lr=0.1, batch_size=8)
    assert trainer_args_for(inputs)[-4:] == [
        "--batch-size",
        "8",
        "--lr",
        "0.1",
    ]


@dataclasses.dataclass(frozen=True, kw_only=True)
class InputsWithWarmup(TrainingStepInputs):
    """The step's inputs plus one a developer adds."""

    warmup_steps: int = 10
    """steps of linear learning-rate warmup;
    0: none."""


def test_a_new_step_input_is_a_component_input_with_its_doc_and_default(tmp_path: Path):
    """A field added to the step's inputs is a component input: its type, default and docstring
    (the description KFP's UI shows), with no second list to edit: the function is written from
    the declaration (``training_job_source``) and imported."""
    written = import_written(training_job_source(InputsWithWarmup), tmp_path, "warmup_step")
    function = training_job_function(
        "registry.example/img:3", function=written.training_job_component
    )
    op = make_component(function, image="registry.example/img:3")
    warmup = op.component_spec.inputs["warmup_steps"]
    assert (warmup.type, warmup.default) == ("Integer", 10)
    assert warmup.description == "steps of linear learning-rate warmup;\n0: none."
    # The inherited fields keep their docs; image defaults to the component's own image.
    assert op.component_spec.inputs["workers"].description == "training nodes (pods)."
    assert op.component_spec.inputs["image"].default == "registry.example/img:3"
    assert set(op.component_spec.outputs) == {"model", "metrics"}
    # What KFP embeds builds the step's inputs of that class from every parameter.
    source = inspect.getsource(function)
    assert "    warmup_steps: int = 10,\n" in source
    assert f"from {__name__} import InputsWithWarmup" in source
    assert "run_training_step(InputsWithWarmup(**given), model=model, metrics=metrics)" in source


def test_component_interfaces():
    op = make_training_job_op("registry.example/img:2")
    assert set(op.component_spec.inputs) == set(TrainingStepInputs.field_names())
    assert set(op.component_spec.outputs) == {"model", "metrics"}
    assert op.component_spec.implementation.container.image == "registry.example/img:2"
    cleanup = make_cleanup_op()
    assert set(cleanup.component_spec.inputs) == {"run_id", "namespace", "backend"}
    assert training_job_component.__doc__


@pytest.mark.filterwarnings("ignore:You may be attemping to run a task:RuntimeWarning")
def test_components_run_in_kfp_local(tmp_path: Path, writer: Path):
    from kfp import local

    local.init(
        runner=local.SubprocessRunner(use_venv=False),
        pipeline_root=str(tmp_path / "root"),
        workspace_root=workspace_root(tmp_path),
    )
    train_op, cleanup_op = make_training_job_op(), make_cleanup_op()
    params = step_params(tmp_path, writer)

    task = train_op(**params)  # kfp.local runs a component called outside a pipeline
    model = task.outputs["model"]
    assert (Path(model.path) / "weights.pt").read_bytes() == b"weights"
    assert model.metadata["arch"] == "resnet18" and model.metadata["data_digest"] == "sha256:abc"
    assert task.outputs["metrics"].metadata["val_accuracy"] == 0.75
    assert cleanup_op(run_id="r", namespace="", backend="local").output == 0


@pytest.mark.slow
@pytest.mark.skipif(
    not (Path(__file__).resolve().parents[2] / "trainer" / "train.py").is_file(),
    reason="trainer/train.py not written",
)
def test_step_with_the_real_trainer(tmp_path: Path, image_folder: Path):
    model = dsl.Model(uri=str(tmp_path / "artifacts" / "model"))
    metrics = dsl.Metrics(uri=str(tmp_path / "artifacts" / "metrics"))
    params = step_params(
        tmp_path,
        tmp_path,
        data_dir=str(image_folder),
        overrides_json="",
        model_name="shufflenet_v2_x0_5",
        epochs=1,
        trainer_args=["--image-size", "16", "--batch-size", "8"],
    )
    result = run_training_step(TrainingStepInputs(**params), model=model, metrics=metrics)
    assert result.phase == "Succeeded" and result.summary["world_size"] == 2
    assert model.metadata["arch"] == "shufflenet_v2_x0_5"
    assert 0.0 <= model.metadata["val_accuracy"] <= 1.0
    assert model.metadata["data_digest"] == "sha256:abc"
    assert metrics.metadata["world_size"] == 2.0 and metrics.metadata["steps"] >= 1
    assert (Path(model.path) / "weights.pt").stat().st_size > 0
