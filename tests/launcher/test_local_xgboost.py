"""XGBoost jobs through the local backend, with real XGBoost (CPU) and the example program: an
XGBoostJob (Master + Worker, the operator's env) and a TrainJob on ``xgboost-distributed`` (the
DMLC_* env) train as 2 workers around rank 0's tracker; the KFP training step exports the
program's model tree; the example pipeline compiles for both APIs."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
import yaml
from kfp import dsl

from components.launcher import LocalOptions, TrainSpec, build_manifest, run_job
from components.launcher.step import TrainingStepInputs, run_training_step, training_spec
from tests.crds import schema_errors

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "xgboost"
IMAGE = "registry.example.com/xgb-example:1"
ENV = {"OMP_NUM_THREADS": "1"}  # two workers on two cores: no oversubscription
APIS = {
    "xgboostjob": ({"api": "xgboostjob"}, ["master-0", "worker-0"]),
    "trainjob": ({"api": "trainjob", "runtime_name": "xgboost-distributed"}, ["node-0", "node-1"]),
}


def example_pipeline_module():
    spec = importlib.util.spec_from_file_location("xgb_example_pipeline", EXAMPLE / "pipeline.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def assert_trained_in_sync(output: str, replicas: list[str]) -> None:
    """Every replica joined the tracker (rank + 1 summed over 2 ranks: 3) and ended with the
    same trees (XGBoost all-reduces each round's histograms)."""
    for replica in replicas:
        assert re.search(rf"\[{replica}\] \[xgb-example\] rank \d/2: .*collective_sum=3\b", output)
    checksums = set(re.findall(r"\] \[xgb-example\] rank \d/2: .*model_checksum=(\w+)", output))
    assert len(checksums) == 1, output


@pytest.mark.slow
@pytest.mark.parametrize("api", sorted(APIS))
def test_two_workers_train_around_rank_0s_tracker(api: str, tmp_path: Path):
    pytest.importorskip("xgboost")
    settings, replicas = APIS[api]
    lines: list[str] = []
    spec = TrainSpec.flat(
        **settings,
        name=f"xgb-{api}",
        image=IMAGE,
        command=["python", str(EXAMPLE / "train.py")],
        args=["--output-dir", str(tmp_path / "out"), "--epochs", "12"],
        workers=2,
        env=ENV,
    )
    options = LocalOptions(workdir=str(tmp_path), log=lines.append, timeout_s=300)
    result = run_job(spec, backend="local", options=options)
    output = "\n".join(lines)
    assert result.phase == "Succeeded" and result.restarts == 0, output
    assert_trained_in_sync(output, replicas)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["rounds"] == 12
    assert summary["train_rows"] == 455  # 80% of breast_cancer's 569 rows, split over 2 ranks
    assert summary["test_accuracy"] > 0.9
    assert (tmp_path / "out" / "model" / "model.json").is_file()
    assert result.summary["world_size"] == 2  # the launcher read the program's summary


def test_the_example_pipeline_compiles_for_both_apis(tmp_path: Path):
    from kfp import compiler

    module = example_pipeline_module()
    for api in APIS:
        package = tmp_path / f"{api}.yaml"
        compiler.Compiler().compile(
            module.build_xgboost_pipeline("reg.example/kfp-ddp:2", api), str(package)
        )
        text = package.read_text()
        assert f"constant: {api}" in text and '"/app/train.py"' in text
        pipeline, _platform = yaml.safe_load_all(text)
        assert pipeline["pipelineInfo"]["name"] == f"kfp-ddp-xgboost-example-{api}"
    with pytest.raises(ValueError, match="the example runs on xgboostjob, trainjob"):
        module.build_xgboost_pipeline(api="mpijob")


@pytest.mark.parametrize("api", sorted(APIS))
def test_the_pipelines_arguments_make_a_valid_job_running_the_program(api: str):
    module = example_pipeline_module()
    arguments = module.training_arguments(
        api=api,
        xgb_image="reg.example/xgb-example:1",
        workers=3,
        rounds=40,
        dataset="wine",
        retrain_token="r",
        workspace_pvc="ws",
        namespace="team-a",
    )
    spec = training_spec(TrainingStepInputs(**arguments), run_id="run-1")
    manifest = build_manifest(spec)
    assert schema_errors(api, manifest) == []
    text = json.dumps(manifest)
    assert '"/app/train.py"' in text and '"--dataset", "wine"' in text and '"40"' in text
    if api == "trainjob":
        assert manifest["spec"]["runtimeRef"]["name"] == "xgboost-distributed"
        assert manifest["spec"]["trainer"]["numNodes"] == 3
    else:
        assert manifest["spec"]["xgbReplicaSpecs"]["Worker"]["replicas"] == 2


@pytest.mark.slow
def test_the_step_exports_the_xgboost_programs_model_and_metrics(tmp_path: Path, capfd):
    pytest.importorskip("xgboost")
    model = dsl.Model(uri=str(tmp_path / "artifacts" / "run" / "train" / "model"))
    metrics = dsl.Metrics(uri=str(tmp_path / "artifacts" / "run" / "train" / "metrics"))
    inputs = TrainingStepInputs(
        api="trainjob",
        image=IMAGE,
        workers=2,
        data_dir=str(tmp_path / "no-npz-here"),  # the program falls back to --dataset
        output_dir=str(tmp_path / "out"),
        epochs=8,
        checkpoint_every_steps=4,
        trainer_args=["--dataset", "wine"],
        backend="local",
        overrides_json=json.dumps(
            {
                "runtime_name": "xgboost-distributed",
                "command": ["python", str(EXAMPLE / "train.py")],
                "env": ENV,
                "backend_options": {"timeout_s": 300},
            }
        ),
    )
    result = run_training_step(inputs, model=model, metrics=metrics)
    output = capfd.readouterr().out
    assert result.phase == "Succeeded" and result.api == "trainjob", output
    assert_trained_in_sync(output, ["node-0", "node-1"])
    folder = Path(model.path)
    assert sorted(p.name for p in folder.iterdir()) == [
        "metrics.jsonl",
        "model.json",
        "summary.json",
    ]
    rounds = [
        json.loads(line)["round"] for line in (folder / "metrics.jsonl").read_text().splitlines()
    ]
    assert rounds == list(range(1, 9))
    assert metrics.metadata["world_size"] == 2
