"""The check step settles what a run starts from: init_from=latest and baseline_uri=latest
become the model latest.json names (nothing published: random weights, no baseline), s3://
weights are checked against the model and pinned, imagenet must be reachable for the nodes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from components.s3_sync import sync
from pipelines.latest_model import move_pointer, new_pointer
from pipelines.parameter_errors import ArgumentError
from pipelines.run_start import resolve_run_start
from trainer.export import save_model
from trainer.models import build_model

ARCH = "mobilenet_v3_small"


def _published(s3, tmp_path: Path, bucket: str, run: str, arch: str = ARCH) -> str:
    """A model folder published under s3://bucket/models/<run>/ and pointed at; its URI."""
    folder = tmp_path / run
    save_model(
        folder,
        build_model(arch, 3).state_dict(),
        arch=arch,
        class_names=["a", "b", "c"],
        image_size=16,
        mean=[0.5] * 3,
        std=[0.2] * 3,
    )
    (folder / "eval.json").write_text(json.dumps({"accuracy": 0.75}))
    publish_uri = f"s3://{bucket}/models"
    sync(str(folder), f"{publish_uri}/{run}/")
    pointer = new_pointer(
        run_id=run, uri=f"{publish_uri}/{run}/", evaluation={"accuracy": 0.75}, data_digest="d"
    )
    assert move_pointer(publish_uri, pointer, seen_run="")[0]
    return f"{publish_uri}/{run}/"


def _arguments(s3, bucket: str, **given) -> dict:
    return {
        "publish_uri": f"s3://{bucket}/models",
        "s3_endpoint": s3.endpoint_url,
        "model": ARCH,
        "init_from": "",
        "baseline_uri": "",
        "overrides_json": "{}",
    } | given


def test_latest_with_nothing_published_starts_from_random_weights_without_baseline(s3):
    bucket = s3.create_bucket("run-start-empty")
    start = resolve_run_start(_arguments(s3, bucket, init_from="latest", baseline_uri="latest"))
    assert (start.init_from, start.baseline_uri, start.latest_run) == ("", "", "")
    assert start.notes == [
        f"init_from=latest: nothing published under s3://{bucket}/models yet, so this run "
        "starts from random weights",
        "baseline_uri=latest: nothing published under publish_uri yet, so no baseline (the "
        "accuracy threshold alone decides)",
    ]


def test_latest_is_the_pointed_model_checked_and_pinned_and_its_evaluation(s3, tmp_path):
    bucket = s3.create_bucket("run-start-latest")
    model_uri = _published(s3, tmp_path, bucket, "run-1")
    start = resolve_run_start(_arguments(s3, bucket, init_from="latest", baseline_uri="latest"))
    assert start.init_from.startswith(f"{model_uri}#sha256=")
    assert start.baseline_uri == f"{model_uri}eval.json"
    assert start.latest_run == "run-1"


def test_weights_of_another_model_are_refused_naming_init_from(s3, tmp_path):
    bucket = s3.create_bucket("run-start-arch")
    model_uri = _published(s3, tmp_path, bucket, "run-r18", arch="resnet18")
    with pytest.raises(ArgumentError) as refused:
        resolve_run_start(_arguments(s3, bucket, init_from=model_uri))
    (problem,) = refused.value.problems
    assert problem == (
        f"init_from={model_uri!r}: is a resnet18 model, not model {ARCH}: set model=resnet18"
    )
    with pytest.raises(ArgumentError) as refused:  # the same through latest: both are named
        resolve_run_start(_arguments(s3, bucket, init_from="latest"))
    assert refused.value.problems[0].startswith(f"init_from='latest': {model_uri}: is a resnet18")


def test_a_state_dict_that_is_none_is_refused_before_anything_is_submitted(s3, tmp_path):
    bucket = s3.create_bucket("run-start-bad")
    (tmp_path / "w").mkdir()
    torch.save({"not": "tensors"}, tmp_path / "w" / "weights.pth")
    sync(str(tmp_path / "w"), f"s3://{bucket}/pretrained/")
    value = f"s3://{bucket}/pretrained/weights.pth"
    with pytest.raises(ArgumentError) as refused:
        resolve_run_start(_arguments(s3, bucket, init_from=value))
    assert "holds a dict with keys ['not'], not a state dict" in refused.value.problems[0]


def test_imagenet_offline_is_refused_with_the_two_fixes_unless_the_nodes_have_a_cache(
    s3, tmp_path, monkeypatch
):
    bucket = s3.create_bucket("run-start-imagenet")
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "empty"))
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("https_proxy", "http://127.0.0.1:9")
    with pytest.raises(ArgumentError) as refused:
        resolve_run_start(_arguments(s3, bucket, init_from="imagenet"))
    (problem,) = refused.value.problems
    assert problem.startswith("init_from='imagenet': torchvision's weights for mobilenet_v3_small")
    assert "copy the file into S3 and set init_from to its s3:// URI" in problem
    assert "point TORCH_HOME at it in the nodes' env" in problem
    # The nodes read a cache of their own (TORCH_HOME in their env): the check trusts it.
    overrides = json.dumps({"env": {"TORCH_HOME": "/cache/torch"}})
    start = resolve_run_start(
        _arguments(s3, bucket, init_from="imagenet", overrides_json=overrides)
    )
    assert start.init_from == "imagenet"


def test_a_path_is_refused_by_the_pipeline_before_anything_is_submitted(tmp_path):
    from click.testing import CliRunner

    from pipelines.cli import main
    from tests.pipelines.test_parameters import REQUIRED

    result = CliRunner().invoke(main, ["render", *REQUIRED, "-p", f"init_from={tmp_path}"])
    assert result.exit_code == 2
    assert f"-p init_from='{tmp_path}': the training nodes cannot read the files" in result.output
    assert "give its s3:// URI" in result.output
