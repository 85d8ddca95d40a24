"""A TFJob through the KFP training step: the example pipeline compiles and hands the step a
valid TFJob; the step exports a TensorFlow program's own outputs; and (slow, real TensorFlow on
CPU) the example program trains as Chief + Worker through ``run_training_step``."""

from __future__ import annotations

import importlib.util
import json
import re
import textwrap
from pathlib import Path

import numpy as np
import pytest
import yaml
from kfp import dsl

from components.launcher import build_tfjob
from components.launcher.step import (
    TrainingStepInputs,
    run_folder,
    run_training_step,
    training_spec,
)
from tests.crds import schema_errors

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "tensorflow"


def example_pipeline_module():
    spec = importlib.util.spec_from_file_location("tf_example_pipeline", EXAMPLE / "pipeline.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_example_pipeline_compiles_with_a_tfjob_step_on_the_workspace(tmp_path: Path):
    from kfp import compiler

    module = example_pipeline_module()
    package = tmp_path / "tf.yaml"
    compiler.Compiler().compile(
        module.build_tensorflow_pipeline("reg.example/kfp-ddp:2"), str(package)
    )
    pipeline, platform = yaml.safe_load_all(package.read_text())
    (train,) = [k for k in pipeline["deploymentSpec"]["executors"] if "training-job" in k]
    assert pipeline["deploymentSpec"]["executors"][train]["container"]["image"] == (
        "reg.example/kfp-ddp:2"  # the launcher step; the TFJob's replicas run tf_image
    )
    mounts = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"][train]
    assert mounts["pvcMount"][0]["mountPath"] == "/workspace"
    text = package.read_text()
    assert "constant: tfjob" in text and '"/app/train.py"' in text


def test_the_pipelines_arguments_make_a_valid_tfjob_running_the_program():
    module = example_pipeline_module()
    arguments = module.training_arguments(
        tf_image="reg.example/tf-example:1",
        workers=3,
        gpus_per_worker=1,
        epochs=2,
        retrain_token="r",
        workspace_pvc="ws",
        namespace="team-a",
    )
    inputs = TrainingStepInputs(**arguments)
    spec = training_spec(inputs, run_id="run-1")
    manifest = build_tfjob(spec)
    assert schema_errors("tfjob", manifest) == []
    chief = manifest["spec"]["tfReplicaSpecs"]["Chief"]["template"]["spec"]
    (container,) = chief["containers"]
    assert container["image"] == "reg.example/tf-example:1"
    assert container["command"] == ["python", "/app/train.py"]
    assert container["args"] == [
        "--data-dir",
        "/workspace/tf-example/data",
        "--output-dir",
        # output_dir/<settings>/<data digest>, as for every program the step launches
        run_folder(inputs),
        "--epochs",
        "2",
        "--synthetic",
    ]
    assert run_folder(inputs).startswith("/workspace/tf-example/e2-w3-r/")
    assert {"name": "TF_CPP_MIN_LOG_LEVEL", "value": "2"} in container["env"]
    assert {"mountPath": "/workspace", "name": "pvc-0"} in container["volumeMounts"]
    assert manifest["spec"]["tfReplicaSpecs"]["Worker"]["replicas"] == 2


# -- what the step exports for a TensorFlow program ---------------------------------------------

WRITER = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path

    args = sys.argv[1:]
    out = Path(args[args.index("--output-dir") + 1])
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    if task["type"] == "chief" and "--write" in args:
        (out / "model" / "variables").mkdir(parents=True, exist_ok=True)
        (out / "model" / "saved_model.pb").write_bytes(b"graph")
        (out / "model" / "variables" / "variables.index").write_bytes(b"index")
        (out / "summary.json").write_text(json.dumps({"steps": 7, "world_size": 2}))
    """
)


def tf_step(tmp_path: Path, *args: str, **kw) -> TrainingStepInputs:
    writer = tmp_path / "writer.py"
    writer.write_text(WRITER)
    params = {
        "api": "tfjob",
        "image": "reg.example/tf:1",
        "workers": 2,
        "data_dir": str(tmp_path / "data"),
        "output_dir": str(tmp_path / "out"),
        "trainer_args": list(args),
        "backend": "local",
        "overrides_json": json.dumps({"command": ["python", str(writer)]}),
    }
    return TrainingStepInputs(**(params | kw))


def test_the_step_exports_the_programs_model_tree_and_summary(tmp_path: Path):
    model = dsl.Model(uri=str(tmp_path / "artifacts" / "run" / "train" / "model"))
    metrics = dsl.Metrics(uri=str(tmp_path / "artifacts" / "run" / "train" / "metrics"))
    result = run_training_step(tf_step(tmp_path, "--write"), model=model, metrics=metrics)
    assert result.api == "tfjob" and result.phase == "Succeeded"
    folder = Path(model.path)
    exported = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    assert exported == ["saved_model.pb", "summary.json", "variables/variables.index"]
    assert model.metadata["job_api"] == "tfjob" and model.metadata["world_size"] == 2
    assert metrics.metadata["steps"] == 7


def test_a_program_that_wrote_nothing_fails_the_step_clearly(tmp_path: Path):
    model, metrics = dsl.Model(uri=str(tmp_path / "m")), dsl.Metrics(uri=str(tmp_path / "x"))
    with pytest.raises(FileNotFoundError, match=r"wrote nothing to export.*model/.*pvc_name"):
        run_training_step(tf_step(tmp_path), model=model, metrics=metrics)


def test_the_step_refuses_a_tfjob_without_the_programs_image():
    from components.launcher import SpecError

    inputs = TrainingStepInputs(data_dir="d", output_dir="o", api="tfjob")
    with pytest.raises(SpecError, match="TrainSpec.image=.*api=tfjob runs your TensorFlow"):
        training_spec(inputs, run_id="r")


# -- the example program through the step, with real TensorFlow ---------------------------------


@pytest.mark.slow
def test_the_example_trains_as_chief_and_worker_through_the_step(tmp_path: Path, capfd):
    pytest.importorskip("tensorflow")
    data = tmp_path / "data"
    data.mkdir()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 4)).astype(np.float32)
    np.savez(data / "train.npz", x=x, y=x @ np.array([0.5, -1.0, 2.0, 0.0], dtype=np.float32))
    model = dsl.Model(uri=str(tmp_path / "artifacts" / "run" / "train" / "model"))
    metrics = dsl.Metrics(uri=str(tmp_path / "artifacts" / "run" / "train" / "metrics"))
    inputs = TrainingStepInputs(
        api="tfjob",
        image="registry.example.com/tf-example:1",
        workers=2,
        data_dir=str(data),
        output_dir=str(tmp_path / "out"),
        epochs=2,
        batch_size=32,
        checkpoint_every_steps=20,
        trainer_args=["--steps-per-epoch", "40"],
        backend="local",
        overrides_json=json.dumps(
            {
                "command": ["python", str(EXAMPLE / "train.py")],
                "env": {"TF_CPP_MIN_LOG_LEVEL": "2"},
                "backend_options": {"timeout_s": 400},
            }
        ),
    )
    result = run_training_step(inputs, model=model, metrics=metrics)
    output = capfd.readouterr().out
    assert result.phase == "Succeeded" and result.api == "tfjob" and result.restarts == 0
    # Both processes joined the all-reduce: replica ids 0 and 1 add 1 + 2 = 3 on each of them.
    for replica in ("chief-0", "worker-0"):
        assert f"[{replica}] [tf-example] " in output
        assert re.search(rf"\[{replica}\] .*replicas_in_sync=2 collective_sum=3\b", output)
    checksums = re.findall(r"\[(chief-0|worker-0)\] .*weights_checksum=(\S+)", output)
    assert len(checksums) == 2 and checksums[0][1] == checksums[1][1]  # trained in sync
    folder = Path(model.path)
    assert sorted(p.name for p in folder.iterdir()) == [
        "metrics.jsonl",
        "model.keras",
        "summary.json",
    ]
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["collective_sum"] == 3 and summary["world_size"] == 2
    assert summary["steps"] == 80 and summary["resumed_from_step"] is None
    assert metrics.metadata["world_size"] == 2 and metrics.metadata["steps"] == 80
    assert model.metadata["job_api"] == "tfjob"
