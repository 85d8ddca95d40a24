"""The whole pipeline through kfp.local with the local PyTorchJob backend and the test S3 server.

Tiny data and model, one epoch: these check the wiring and both branches of the gate, not the
accuracy (tests/demo does that on real data).
"""

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from components.s3_sync import sync
from pipelines.cli import main
from pipelines.local_run import run_local
from tests.image_data import write_image_folder
from tests.s3_env import use_s3_server

pytestmark = pytest.mark.slow


@pytest.fixture
def dataset_uri(s3_server, monkeypatch, tmp_path_factory) -> str:
    """A tiny ImageFolder uploaded to the test server; the AWS env points at the server."""
    use_s3_server(monkeypatch, s3_server, tmp_path_factory.mktemp("sync-cache"))
    bucket = s3_server.create_bucket("pipeline-local-run")
    data = write_image_folder(tmp_path_factory.mktemp("dataset") / "data", per_class=8)
    uri = f"s3://{bucket}/data"
    sync(str(data), uri)
    return uri


def _arguments(data_uri: str, s3_server, threshold: float, publish_uri: str) -> dict:
    return {
        "data_uri": data_uri,
        "s3_endpoint": s3_server.endpoint_url,
        "workers": 2,
        "gpus_per_worker": 0,
        "model": "mobilenet_v3_small",
        "image_size": 16,
        "epochs": 1,
        "batch_size": 4,
        "accuracy_threshold": threshold,
        "publish_uri": publish_uri,
    }


def _published(s3_server, uri: str) -> list[str]:
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    listing = s3_server.client().list_objects_v2(Bucket=bucket, Prefix=prefix)
    return sorted(o["Key"][len(prefix) :] for o in listing.get("Contents", []))


def test_shared_volume_gate_passes_and_the_model_is_published(
    dataset_uri, s3_server, tmp_path, monkeypatch
):
    publish = f"{dataset_uri.rsplit('/', 1)[0]}/models-passed"
    system_tmp = tmp_path / "system-tmp"  # this machine's /tmp, as the steps would see it
    system_tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(system_tmp))
    run = run_local(
        _arguments(dataset_uri, s3_server, 0.0, publish),
        workspace=tmp_path / "ws",
        storage="shared-volume",
    )
    assert run.passed is True
    assert run.data_sync["files"] == 3 * (8 + 4) and run.data_sync["transferred"] == 36
    assert run.training["world_size"] == 2 and run.training["steps"] > 0
    assert 0.0 <= run.metrics["accuracy"] <= 1.0 and run.metrics["num_samples"] == 12
    assert run.report is not None and "<img" in run.report.read_text()
    assert run.published_uri and run.published_uri.startswith(publish + "/")
    files = _published(s3_server, run.published_uri)
    assert {"weights.pt", "model.json", "summary.json", "eval.json", "report.html"} <= set(files)
    # The checkpoints of the run live in the workspace, per data digest and configuration.
    digest = run.data_sync["digest"]
    pattern = f"*/{digest[:16]}/checkpoints/step-*/COMPLETE"
    assert list(Path(tmp_path / "ws" / "train").glob(pattern))
    # The data the run trained on is frozen under its source and digest.
    (frozen,) = Path(tmp_path / "ws" / "data").glob(f"*/{digest[:16]}")
    assert (frozen / "train").is_dir() and (frozen / "val").is_dir()
    # The steps' temporary folders (kfp.local's copies of their code, the evaluation's download)
    # were in the workspace, and are gone; nothing was left in the machine's temp folder.
    assert not list(system_tmp.iterdir())
    assert not (tmp_path / "ws" / ".kfp-steps-tmp").exists()


def _keys(s3_server, uri: str) -> list[str]:
    return _published(s3_server, uri.rstrip("/") + "/")


def test_object_store_run_keeps_everything_in_s3_and_a_failed_gate_exits_1(
    dataset_uri, s3_server, tmp_path
):
    """Through the CLI, object-store storage (its default): the data step only lists, each node
    stages its own copy, checkpoints and the model outputs go through S3 (to checkpoint_uri),
    the model comes back as the training step's artifact; a model the gate holds back is no
    success (exit 1, saying why) and nothing is published. (The demo's run checks a passing
    object-store run's publication.)"""
    # An accuracy of 1.0 on noisy data after one epoch is not reachable: the gate must hold.
    publish = f"{dataset_uri.rsplit('/', 1)[0]}/models-object-store"
    # checkpoints elsewhere (by default they go under <publish_uri>/training/)
    checkpoints = f"{dataset_uri.rsplit('/', 1)[0]}/checkpoints-object-store"
    arguments = _arguments(dataset_uri, s3_server, 1.0, publish) | {"checkpoint_uri": checkpoints}
    params = [f"-p{name}={value}" for name, value in arguments.items()]
    workspace = tmp_path / "ws"
    result = CliRunner().invoke(main, ["run-local", "--workspace", str(workspace), *params])
    said = result.output
    assert result.exit_code == 1, said
    assert re.search(r"gate: +failed \(accuracy [0-9.]+ < threshold 1", said)
    assert "published:   no" in said
    assert re.search(
        r"Error: the evaluation gate failed: accuracy [0-9.]+ < threshold 1 .*; the model was "
        r"not published \(lower accuracy_threshold or tolerance, or train longer\); report: ",
        said,
    )
    assert _published(s3_server, publish + "/") == []
    # The data step listed the data set (36 files, 3 classes) and downloaded nothing.
    listed = re.search(r"data: 36 files \(3 classes\) in \S+, listed in .*\(digest (\w+)\)", said)
    assert listed, said
    digest = listed.group(1)
    assert "transferred" not in said
    assert not (workspace / "data").exists() and not (workspace / "train").exists()
    # Each node staged the data onto its own disk, frozen by the digest the data step saw.
    for node in ("node-0", "node-1"):
        (frozen,) = (workspace / "nodes" / node / "stage").glob(f"*/{digest}")
        assert len(list((frozen / "train").rglob("*.png"))) == 24
    # Checkpoints and the model outputs are in S3 under the run's settings and digest.
    trained = re.search(r"training: .*\bsteps=(\d+)\b.*\bworld_size=2\b", said)
    assert trained, said
    keys = _keys(s3_server, checkpoints)
    steps = trained.group(1)
    assert any(k.endswith(f"/{digest}/checkpoints/step-{steps}/COMPLETE") for k in keys), keys
    outputs = [k for k in keys if f"/{digest}/output/" in k]
    assert {k.rsplit("/output/", 1)[1] for k in outputs} >= {
        "model/weights.pt",
        "model/model.json",
        "metrics.jsonl",
        "summary.json",
    }
    # The model came back as the training step's artifact, which the evaluation read.
    model_line = re.search(r"^model: +(\S+)$", said, re.MULTILINE)
    assert model_line, said
    model_dir = Path(model_line.group(1))
    assert model_dir.is_relative_to(workspace) and (model_dir / "weights.pt").is_file()


def test_run_local_on_a_folder_of_ones_own_finds_every_bad_image_before_training(tmp_path):
    """`run-local --data FOLDER`: the folder is served by a local S3 server of its own; a data
    set with unreadable files fails once, before any step of training, naming all of them."""
    from tests.trainer.test_bad_images import _messy_folder

    data = tmp_path / "My Photos"
    _messy_folder(data)
    val = data / "val"
    for folder in ("café", "red circle"):  # the pipeline needs val/ too
        (val / folder).mkdir(parents=True)
        for source in sorted((data / "train" / folder).glob("rgb-[01].jpg")):
            (val / folder / source.name).write_bytes(source.read_bytes())
    workspace = tmp_path / "ws"
    params = ["-pworkers=1", "-pmodel=mobilenet_v3_small", "-pimage_size=16", "-pbatch_size=4"]
    result = CliRunner().invoke(
        main, ["run-local", "--workspace", str(workspace), "--data", str(data), *params]
    )
    assert result.exit_code == 1, result.output
    assert "no GPU on this machine: gpus_per_worker=0" in result.output
    assert "serving" in result.output and "s3://kfp-ddp-local/datasets/my-photos" in result.output
    assert "2 of 23 images cannot be read" in result.output, result.output
    assert "train/café/empty.jpg (class café)" in result.output
    assert "train/red circle/cut.png (class red circle)" in result.output
    assert "in the pipeline skip_bad_images=true" in result.output  # the fix, as a parameter
    assert "3 file(s) are not images in a class folder and will be skipped" in result.output
    assert not list(workspace.rglob("checkpoints/step-*"))  # not one step trained


def test_run_local_refuses_a_batch_no_rank_can_fill_in_the_data_step(tmp_path):
    """The data step counts the training images: a batch size larger than a rank's share fails
    there, naming batch_size and the largest that fits, before any node starts."""
    data = write_image_folder(tmp_path / "photos", classes=("cat", "dog"), per_class=6)
    workspace = tmp_path / "ws"
    params = ["-pworkers=2", "-pmodel=mobilenet_v3_small", "-pimage_size=16", "-pbatch_size=64"]
    result = CliRunner().invoke(
        main, ["run-local", "--workspace", str(workspace), "--data", str(data), *params]
    )
    assert result.exit_code == 1, result.output
    assert "✗ list the data in S3" in result.output, result.output
    assert (
        "batch_size=64: each of the 2 ranks trains on 6 of the 12 training images, fewer than "
        "one batch: set batch_size to 6 or less"
    ) in result.output
    assert "[node-" not in result.output  # no training node started
