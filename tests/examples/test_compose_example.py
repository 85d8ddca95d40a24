"""examples/compose: a pipeline of someone else's, built from the component files alone.

It compiles in a Python process where this package cannot be imported (as on a user's machine
with only kfp installed), loads the files from a folder or a URL, and runs end to end under
kfp.local with the local backend: one data stage, two trainings, two evaluations, the better model
published. The component bodies import our package at run time, as they do in the image.
"""

# No `from __future__ import annotations`: KFP reads the example's real annotations.
import functools
import http.server
import importlib.util
import json
import os
import subprocess
import sys
import sysconfig
import textwrap
import threading
from pathlib import Path

import pytest
from kfp import compiler
from kfp.dsl import Metrics

from components import DEFAULT_IMAGE
from components.s3_sync import sync
from pipelines.component_files import COMPILED_DIR
from tests import yaml_fast
from tests.image_data import write_image_folder
from tests.kfp_local import workspace_root
from tests.s3_env import use_s3_server

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "compose" / "pipeline.py"
OUR_PACKAGES = ("components", "pipelines", "kfp_ddp", "trainer", "tests")

# Runs with `python -I -S`: no PYTHONPATH, no user site, no cwd on sys.path (-I), and no
# site-packages processing (-S), so no .pth file runs: the editable install's meta-path finder
# (__editable___kfp_ddp_*_finder, installed by a .pth file) never exists. Only the venv's
# site-packages directory itself is put on sys.path, for kfp and its dependencies.
ISOLATED_COMPILE = textwrap.dedent(
    """
    import importlib.util, runpy, sys
    sys.path[:0] = {library_paths!r}
    finders = [type(f).__name__ + " " + getattr(f, "__module__", "") for f in sys.meta_path]
    assert not [f for f in finders if "editable" in f.lower()], finders
    for name in {packages!r}:
        found = importlib.util.find_spec(name)
        assert found is None, f"{{name}} is importable here: {{found.origin}}"
    sys.argv = ["pipeline.py", "--components", {components!r}, "--output", {output!r}]
    runpy.run_path({example!r}, run_name="__main__")
    leaked = sorted(m for m in sys.modules if m.split(".")[0] in {packages!r})
    assert not leaked, leaked
    print("compiled without kfp-ddp")
    """
)


def load_example():
    spec = importlib.util.spec_from_file_location("compose_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # KFP reads pick_better's source through its module
    spec.loader.exec_module(module)
    return module


def _library_paths() -> list[str]:
    paths = sysconfig.get_paths()
    return sorted({paths["purelib"], paths["platlib"]})


def test_the_example_compiles_from_the_component_files_alone(tmp_path: Path) -> None:
    output = tmp_path / "two_models.yaml"
    code = ISOLATED_COMPILE.format(
        library_paths=_library_paths(),
        packages=OUR_PACKAGES,
        components=str(COMPILED_DIR),
        output=str(output),
        example=str(EXAMPLE),
    )
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "compiled without kfp-ddp" in result.stdout
    pipeline_doc, platform_doc = [d for d in yaml_fast.safe_load_all(output.read_text()) if d]
    executors = pipeline_doc["deploymentSpec"]["executors"]
    assert {e["container"]["image"] for e in executors.values()} == {DEFAULT_IMAGE}
    tasks = dict(pipeline_doc["root"]["dag"]["tasks"])
    for component in pipeline_doc["components"].values():
        tasks.update(component.get("dag", {}).get("tasks", {}))
    trainings = [t for name, t in tasks.items() if name.startswith("training-job-component")]
    assert sorted(
        t["inputs"]["parameters"]["model_name"]["componentInputParameter"] for t in trainings
    ) == ["pipelinechannel--model_a", "pipelinechannel--model_b"]
    assert sorted(
        t["inputs"]["parameters"]["task_name"]["runtimeValue"]["constant"] for t in trainings
    ) == ["train-a", "train-b"]
    conditions = sorted(
        t["triggerPolicy"]["condition"]
        for t in tasks.values()
        if t.get("triggerPolicy")
        if "condition" in t["triggerPolicy"]
    )
    assert len(conditions) == 2 and all("pick-better-Output" in c for c in conditions)
    mounted = platform_doc["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    with_claim = {name for name, m in mounted.items() if "pvcMount" in m}
    assert all(mounted[n]["pvcMount"][0]["mountPath"] == "/workspace" for n in with_claim)
    # the data, training and evaluation steps share the claim; publishing reads the Model
    # artifact and needs only the S3 keys
    assert {n.rstrip("-2") for n in with_claim} == {
        "exec-stage-dataset-step",
        "exec-training-job-component",
        "exec-evaluate-component",
    }
    assert all("secretAsEnv" in mounted[n] for n in mounted if "publish" in n)


def test_the_example_loads_the_files_from_a_url(tmp_path: Path) -> None:
    """load_component_from_url, as with a release tag's raw URL (here a loopback server)."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(COMPILED_DIR))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        pipeline = load_example().build_pipeline(url)
        compiler.Compiler().compile(pipeline, str(tmp_path / "p.yaml"))
    finally:
        server.shutdown()
        server.server_close()
    from_url = (tmp_path / "p.yaml").read_text()
    compiler.Compiler().compile(
        load_example().build_pipeline(str(COMPILED_DIR)), str(tmp_path / "q.yaml")
    )
    assert from_url == (tmp_path / "q.yaml").read_text()


# A training program of someone else's: reads the launcher's arguments and the distributed
# environment torchrun gives it, writes what the step exports (rank 0 only).
CUSTOM_TRAINER = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path

    args = sys.argv[1:]
    out = Path(args[args.index("--output-dir") + 1])
    data = args[args.index("--data-dir") + 1]
    arch = args[args.index("--model") + 1]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    print(f"custom trainer rank {rank}/{world} on {data}", flush=True)
    if rank == 0:
        (out / "model").mkdir(parents=True, exist_ok=True)
        (out / "model" / "weights.pt").write_bytes(b"my weights")
        (out / "model" / "model.json").write_text(json.dumps({"arch": arch}))
        (out / "metrics.jsonl").write_text(json.dumps({"val_accuracy": 0.5}) + "\\n")
        summary = {"val_accuracy": 0.5, "world_size": world, "arch": arch, "extra": args[-1]}
        (out / "summary.json").write_text(json.dumps(summary))
    """
)


def test_the_loaded_launcher_runs_your_own_command(tmp_path: Path) -> None:
    """The README's recipe: training_job.yaml with your image and command, api=trainjob (the
    local backend gives each node the TrainJob's PET_* variables; torchrun turns them into
    RANK and WORLD_SIZE, as in the pod)."""
    from kfp import components, local

    script = tmp_path / "my_train.py"
    script.write_text(CUSTOM_TRAINER)
    local.init(
        runner=local.SubprocessRunner(use_venv=False),
        pipeline_root=str(tmp_path / "r"),
        workspace_root=workspace_root(tmp_path),
    )
    train_op = components.load_component_from_file(str(COMPILED_DIR / "training_job.yaml"))
    task = train_op(
        api="trainjob",
        image="registry.example.com/team/my-trainer:3",
        overrides_json=json.dumps({"command": ["torchrun", str(script)]}),
        workers=2,
        data_dir=str(tmp_path / "data"),
        output_dir=str(tmp_path / "train"),
        model_name="my-net",
        trainer_args=["--my-flag"],
        backend="local",
        task_name="train-mine",
    )
    model = task.outputs["model"]
    assert (Path(model.path) / "weights.pt").read_bytes() == b"my weights"
    assert json.loads((Path(model.path) / "summary.json").read_text())["extra"] == "--my-flag"
    assert model.metadata["arch"] == "my-net" and model.metadata["job_api"] == "trainjob"
    assert model.metadata["world_size"] == 2
    assert task.outputs["metrics"].metadata["val_accuracy"] == 0.5


def _metrics(accuracy: float) -> Metrics:
    return Metrics(name="metrics", uri="", metadata={"accuracy": accuracy})


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ((True, 0.8), (True, 0.6), "a"),
        ((True, 0.6), (True, 0.8), "b"),
        ((True, 0.7), (True, 0.7), "a"),
        ((False, 0.9), (True, 0.6), "b"),
        ((True, 0.6), (False, 0.9), "a"),
        ((False, 0.9), (False, 0.9), "none"),
    ],
)
def test_pick_better(a, b, expected) -> None:
    pick = load_example().pick_better
    assert pick(a[0], _metrics(a[1]), b[0], _metrics(b[1])) == expected


def _executor_output(task_dir: Path) -> dict:
    return json.loads((task_dir / "executor_output.json").read_text())


def _artifact_metadata(task_dir: Path, name: str) -> dict:
    return _executor_output(task_dir)["artifacts"][name]["artifacts"][0]["metadata"]


@pytest.mark.slow
def test_the_example_runs_end_to_end_under_kfp_local(s3_server, monkeypatch, tmp_path) -> None:
    from kfp import local

    use_s3_server(monkeypatch, s3_server, tmp_path / "sync-cache")
    bucket = s3_server.create_bucket("compose-example")
    sync(str(write_image_folder(tmp_path / "dataset", per_class=8)), f"s3://{bucket}/data")
    publish_uri = f"s3://{bucket}/models"

    pipeline = load_example().build_pipeline(
        str(COMPILED_DIR), workspace=str(tmp_path / "ws"), backend="local"
    )
    root = tmp_path / "root"
    local.init(
        runner=local.SubprocessRunner(use_venv=False),
        pipeline_root=str(root),
        workspace_root=workspace_root(tmp_path),
        raise_on_error=True,
    )
    pipeline(
        data_uri=f"s3://{bucket}/data",
        publish_uri=publish_uri,
        model_a="mobilenet_v3_small",
        model_b="resnet18",
        s3_endpoint=s3_server.endpoint_url,
        workers=2,
        gpus_per_worker=0,
        epochs=1,
        batch_size=4,
        image_size=16,
        accuracy_threshold=0.0,
    )

    (run_dir,) = root.glob("kfp-ddp-two-models-*")
    # The data was staged once; both trainings read the same frozen folder.
    assert [p.name for p in run_dir.glob("stage-dataset-step*")] == ["stage-dataset-step"]
    staged = _executor_output(run_dir / "stage-dataset-step")["parameterValues"]
    archs = {}
    for train in ("training-job-component", "training-job-component-2"):
        model = _artifact_metadata(run_dir / train, "model")
        assert model["data_digest"] == staged["digest"] and model["world_size"] == 2
        archs[model["arch"]] = train
    assert set(archs) == {"mobilenet_v3_small", "resnet18"}
    # Both were evaluated; the more accurate one (a tie keeps model a) was published.
    evaluations = {}
    for task in ("evaluate-component", "evaluate-component-2"):
        evaluation = _artifact_metadata(run_dir / task, "report")["eval"]
        evaluations[evaluation["arch"]] = evaluation
    assert set(evaluations) == {"mobilenet_v3_small", "resnet18"}
    a, b = evaluations["mobilenet_v3_small"], evaluations["resnet18"]
    expected = "a" if a["accuracy"] >= b["accuracy"] else "b"
    choice = _executor_output(run_dir / "pick-better")["parameterValues"]["Output"]
    assert choice == expected
    chosen = a if expected == "a" else b
    (publish,) = list(run_dir.glob("publish-model-step*"))
    destination = _executor_output(publish)["parameterValues"]["Output"]
    assert destination.startswith(publish_uri + "/")
    client = s3_server.client()
    prefix = destination.removeprefix(f"s3://{bucket}/")
    listing = client.list_objects_v2(Bucket=bucket, Prefix=prefix)
    published = {o["Key"][len(prefix) :] for o in listing.get("Contents", [])}
    assert {"weights.pt", "model.json", "summary.json", "eval.json", "report.html"} <= published
    model_json = json.loads(
        client.get_object(Bucket=bucket, Key=prefix + "model.json")["Body"].read()
    )
    eval_json = json.loads(
        client.get_object(Bucket=bucket, Key=prefix + "eval.json")["Body"].read()
    )
    assert model_json["arch"] == chosen["arch"]
    assert eval_json["accuracy"] == chosen["accuracy"]
    # The exit handler ran the cleanup step (nothing to delete with the local backend).
    assert _executor_output(run_dir / "cleanup-component")["parameterValues"]["Output"] == 0
