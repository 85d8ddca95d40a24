"""--init-from: a run starts from torchvision's ImageNet weights (read from a TORCH_HOME cache
filled beforehand: no network here), a published model folder or a state dict in S3; a new
head for another number of classes; every refusal names the flag, before step 1."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from tests.image_data import write_image_folder
from tests.trainer.trainer_launch import TINY
from trainer.errors import EXIT_CONFIG
from trainer.init_weights import StartingWeights, StartingWeightsError, fetch, load_into
from trainer.models import build_model
from trainer.train import main
from trainer.tv_compat import import_torchvision

ARCH = "mobilenet_v3_small"


def _train(tmp_path: Path, name: str, *extra: str, classes=("circle", "square")) -> Path:
    """A one-epoch run on a small folder of ``classes``; its output folder."""
    data = write_image_folder(tmp_path / f"data-{len(classes)}", classes=classes, per_class=8)
    out = tmp_path / name
    args = ["--data-dir", str(data), "--output-dir", str(out), *TINY, "--epochs", "1"]
    assert main([*args, "--batch-size", "4", *extra]) == 0
    return out


def _upload(s3_env, folder: Path, name: str) -> str:
    from components.s3_sync import sync

    uri = f"s3://{s3_env.create_bucket('init-weights')}/{name}"
    sync(str(folder), uri)
    return uri


def test_a_published_model_folder_starts_a_run_with_a_new_head_for_more_classes(
    s3_env, tmp_path, capsys
):
    first = _train(tmp_path, "first")
    uri = _upload(s3_env, first / "model", "runs/first")
    capsys.readouterr()
    second = _train(tmp_path, "second", "--init-from", uri, classes=("circle", "square", "stripe"))
    said = capsys.readouterr()
    assert f"weights from {uri}/weights.pt" in said.out + said.err
    assert "head by class name: 2 of the 3 classes kept, new 'stripe'" in said.out + said.err
    digest = __import__("hashlib").sha256((first / "model" / "weights.pt").read_bytes())
    record = {"init_from": uri, "uri": f"{uri}/weights.pt", "sha256": digest.hexdigest()}
    assert json.loads((second / "summary.json").read_text())["starting_weights"] == record
    assert json.loads((second / "model" / "model.json").read_text())["starting_weights"] == record


def test_the_weights_are_the_published_ones_but_for_the_new_head(s3_env, tmp_path):
    first = _train(tmp_path, "first")
    uri = _upload(s3_env, first / "model", "runs/same")
    weights = fetch(uri, ARCH)
    assert weights is not None and weights.arch == ARCH and weights.classes == 2
    model = build_model(ARCH, 5)
    change = load_into(model, weights, arch=ARCH, num_classes=5)
    assert change is not None and change.was == 2 and change.now == 5
    published = torch.load(first / "model" / "weights.pt", weights_only=True)
    mine = model.state_dict()
    for key, tensor in published.items():
        if key in change.keys:
            assert mine[key].shape[0] == 5
        else:
            assert torch.equal(mine[key], tensor), key


def test_a_state_dict_saved_from_ddp_is_read_and_pinned_by_its_digest(s3_env, tmp_path):
    model = build_model(ARCH, 10)
    folder = tmp_path / "sd"
    folder.mkdir()
    torch.save({f"module.{k}": v for k, v in model.state_dict().items()}, folder / "my [v1].pth")
    uri = _upload(s3_env, folder, "state-dicts") + "/my [v1].pth"
    weights = fetch(uri, ARCH)
    assert weights is not None and weights.uri == uri
    pinned = weights.pinned()
    assert pinned == f"{uri}#sha256={weights.sha256}"
    assert fetch(pinned, ARCH) is not None  # the same file: accepted
    torch.save(build_model(ARCH, 10).state_dict(), folder / "my [v1].pth")  # replaced since
    _upload(s3_env, folder, "state-dicts")
    with pytest.raises(StartingWeightsError, match="the weights changed since they were checked"):
        fetch(pinned, ARCH)


@pytest.mark.parametrize(
    ("saved", "refusal"),
    [
        (
            "resnet18",
            "not weights of --model mobilenet_v3_small (244 of the model's tensors missing",
        ),
        ("list", "holds a list, not a state dict (parameter names to tensors)"),
        ("text", "is not a state dict torch.load(weights_only=True) can read"),
    ],
)
def test_weights_of_another_model_or_no_state_dict_are_refused_before_step_1(
    s3_env, tmp_path, capsys, saved, refusal
):
    folder = tmp_path / "bad"
    folder.mkdir()
    if saved == "resnet18":
        torch.save(build_model("resnet18", 2).state_dict(), folder / "w.pt")
    elif saved == "list":
        torch.save([torch.zeros(2)], folder / "w.pt")
    else:
        (folder / "w.pt").write_text("not weights")
    uri = _upload(s3_env, folder, f"bad-{saved}") + "/w.pt"
    data = write_image_folder(tmp_path / "data", classes=("a", "b"), per_class=4)
    out = tmp_path / "out"
    args = ["--data-dir", str(data), "--output-dir", str(out), *TINY, "--batch-size", "2"]
    assert main([*args, "--init-from", uri]) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert f"--init-from {uri!r}: " in err and refusal in err, err
    assert not list(out.glob("checkpoints/step-*"))


def test_a_model_folder_of_another_architecture_says_which(s3_env, tmp_path):
    first = _train(tmp_path, "first")
    uri = _upload(s3_env, first / "model", "runs/arch")
    weights = fetch(uri, "resnet18")
    assert weights is not None
    with pytest.raises(StartingWeightsError) as refused:
        load_into(build_model("resnet18", 2), weights, arch="resnet18", num_classes=2)
    assert str(refused.value) == (
        f"--init-from {uri!r}: is a mobilenet_v3_small model, not --model resnet18: set "
        "model=mobilenet_v3_small"
    )


def test_nothing_at_the_uri_is_refused_by_name(s3_env, tmp_path):
    uri = _upload(s3_env, write_image_folder(tmp_path / "d", per_class=1), "not-a-model")
    with pytest.raises(StartingWeightsError, match="holds no weights.pt and model.json"):
        fetch(uri, ARCH)


@pytest.mark.parametrize("value", ["latest", "hf://x", "s3://", "s3://b/w.pt#sha256=12"])
def test_values_of_no_known_form_are_refused_by_the_flag_check(tmp_path, capsys, value):
    args = ["--synthetic", "--output-dir", str(tmp_path / "o"), *TINY, "--init-from", value]
    assert main(args) == EXIT_CONFIG
    assert f"--init-from {value!r}: " in capsys.readouterr().err


def _fill_torch_cache(home: Path) -> Path:
    """$TORCH_HOME/hub/checkpoints/<torchvision's file name> with weights of the right shapes
    (random: the test checks the path, not ImageNet)."""
    tv = import_torchvision()
    weights = tv.models.get_model_weights(ARCH).DEFAULT
    path = home / "hub" / "checkpoints" / Path(weights.url).name
    path.parent.mkdir(parents=True)
    torch.save(build_model(ARCH, 1000).state_dict(), path)
    return path


def test_imagenet_weights_come_from_a_torch_home_cache_filled_beforehand(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")  # no network, as on the cluster
    cached = _fill_torch_cache(tmp_path / "torch")
    out = _train(tmp_path, "fine-tuned", "--init-from", "imagenet")
    said = capsys.readouterr()
    assert "new head for 2 classes (was 1000)" in said.out + said.err
    record = json.loads((out / "summary.json").read_text())["starting_weights"]
    assert record["init_from"] == "imagenet" and record["uri"].endswith(cached.name)
    assert record["sha256"] == __import__("hashlib").sha256(cached.read_bytes()).hexdigest()


def test_imagenet_without_network_or_cache_names_the_two_fixes(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "empty"))
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("https_proxy", "http://127.0.0.1:9")
    with pytest.raises(StartingWeightsError) as refused:
        fetch("imagenet", ARCH)
    message = str(refused.value)
    assert message.startswith("--init-from 'imagenet': torchvision's weights for ")
    assert "this machine cannot download it" in message
    assert "copy the file into S3 and set init_from to its s3:// URI" in message
    assert "point TORCH_HOME at it" in message


def test_the_trainer_alone_also_starts_from_a_model_folder_on_its_disk(tmp_path, capsys):
    first = _train(tmp_path, "first")
    capsys.readouterr()
    second = _train(tmp_path, "second", "--init-from", str(first / "model"))
    record = json.loads((second / "summary.json").read_text())["starting_weights"]
    assert record["uri"] == f"{first / 'model'}/weights.pt"
    with pytest.raises(StartingWeightsError, match="no such file or folder here"):
        fetch(str(tmp_path / "nowhere"), ARCH)


@pytest.mark.parametrize(
    ("arch", "head"),
    [
        ("resnet18", {"fc.weight", "fc.bias"}),
        ("mobilenet_v3_small", {"classifier.3.weight", "classifier.3.bias"}),
        ("squeezenet1_0", {"classifier.1.weight", "classifier.1.bias"}),  # a 1x1 conv head
        ("vit_b_16", {"heads.head.weight", "heads.head.bias"}),
        # RegNet's builder computes its widths with tensors: built on the CPU, its parameters
        # registered on the meta device (it failed with NotImplementedError under meta)
        ("regnet_y_400mf", {"fc.weight", "fc.bias"}),
    ],
)
def test_the_head_is_the_parameters_that_follow_the_class_count(arch, head):
    from trainer.model_shapes import head_parameter_names

    assert head_parameter_names(arch, 7) == head


def _parameters(folder: Path) -> dict[str, torch.Tensor]:
    """The trainable tensors of a saved model (BatchNorm's running statistics left out)."""
    state = torch.load(folder / "model" / "weights.pt", weights_only=True)
    names = {name for name, _ in build_model(ARCH, 3).named_parameters()}
    return {k: v for k, v in state.items() if k in names}


@pytest.mark.parametrize("head_epochs", [0, 1])
def test_head_epochs_train_the_new_head_alone_from_the_starting_weights(
    tmp_path, capsys, head_epochs
):
    first = _train(tmp_path, "first")
    classes = ("circle", "square", "stripe")
    flags = ["--init-from", str(first / "model"), "--head-epochs", str(head_epochs)]
    capsys.readouterr()
    second = _train(tmp_path, "second", *flags, classes=classes)
    said = capsys.readouterr()
    start, end = _parameters(first), _parameters(second)
    head = {"classifier.3.weight", "classifier.3.bias"}
    kept = [k for k in start if k not in head and torch.equal(start[k], end[k])]
    if head_epochs:  # the one epoch trained the head alone: every other tensor is as it was
        assert "head only: the first 6 steps (1 epoch(s))" in said.out + said.err  # 24 images / 4
        assert len(kept) == len(start) - len(head)
    else:  # the whole model trained
        assert "head only" not in said.out + said.err
        assert len(kept) < (len(start) - len(head)) / 2
    assert end["classifier.3.weight"].shape[0] == 3


def test_head_epochs_without_starting_weights_say_they_have_nothing_to_keep(tmp_path, capsys):
    _train(tmp_path, "plain", "--head-epochs", "2")
    said = capsys.readouterr()
    assert "no starting weights: --head-epochs 2 has nothing to keep" in said.out + said.err


def _two_ranks(tmp_path: Path, init_from: list[str], name: str):
    """Two trainer processes as a v1 operator starts them, each with its own --init-from."""
    from tests.trainer.trainer_launch import run_operator_style

    data = write_image_folder(tmp_path / "data-2", classes=("circle", "square"), per_class=8)
    base = ["--data-dir", str(data), *TINY, "--epochs", "1", "--batch-size", "2"]
    rank_args = [
        [*base, "--output-dir", str(tmp_path / name / f"rank{r}"), "--init-from", value]
        for r, value in enumerate(init_from)
    ]
    return run_operator_style(rank_args, log_dir=tmp_path / f"{name}-logs")


def test_rank_0_alone_reads_the_starting_weights_for_every_rank(tmp_path):
    first = _train(tmp_path, "first")
    # Rank 1 is told a folder that does not exist: it never reads it, it gets rank 0's weights.
    codes, log = _two_ranks(tmp_path, [str(first / "model"), str(tmp_path / "nowhere")], "both")
    assert codes == [0, 0], log
    assert log.count(f"weights from {first / 'model'}/weights.pt") == 1, log  # rank 0 logs
    summary = json.loads((tmp_path / "both" / "rank0" / "summary.json").read_text())
    assert summary["starting_weights"]["uri"] == f"{first / 'model'}/weights.pt"


def test_every_rank_stops_when_rank_0_cannot_read_the_starting_weights(tmp_path):
    first = _train(tmp_path, "first")
    codes, log = _two_ranks(tmp_path, [str(tmp_path / "nowhere"), str(first / "model")], "none")
    assert codes == [EXIT_CONFIG, EXIT_CONFIG], log
    assert "read by rank 0 for every rank" in log and "no such file or folder here" in log, log


def _published(classes: list[str]) -> StartingWeights:
    """Weights of a model folder that trained on ``classes`` (its model.json names them)."""
    torch.manual_seed(1)
    state = build_model(ARCH, len(classes)).state_dict()
    return StartingWeights(
        init_from="s3://models/run-1/", uri="s3://models/run-1/weights.pt", sha256="0" * 64,
        state=state, arch=ARCH, classes=len(classes), class_names=classes,
    )  # fmt: skip


def test_the_head_follows_the_class_names_when_the_classes_change():
    """A data set that gained 'apple' and lost 'zebra' keeps its count (3) and shifts every
    class by one: the head, loaded as it was, gave each class the row of another."""
    weights = _published(["cat", "dog", "zebra"])
    torch.manual_seed(2)
    model = build_model(ARCH, 3)
    fresh = {k: v.clone() for k, v in model.state_dict().items()}
    change = load_into(
        model, weights, arch=ARCH, num_classes=3, class_names=["apple", "cat", "dog"]
    )
    assert change is not None
    assert (
        change.line() == "head by class name: 2 of the 3 classes kept, new 'apple', dropped 'zebra'"
    )
    mine = model.state_dict()
    assert sorted(change.keys) == ["classifier.3.bias", "classifier.3.weight"]
    for key in change.keys:
        assert torch.equal(mine[key][0], fresh[key][0])  # apple: the model's own fresh row
        assert torch.equal(mine[key][1], weights.state[key][0])  # cat
        assert torch.equal(mine[key][2], weights.state[key][1])  # dog
    for key, tensor in weights.state.items():
        if key not in change.keys:
            assert torch.equal(mine[key], tensor), key


def test_a_class_name_spelt_otherwise_keeps_its_row():
    """A model published from a data set uploaded from Linux ('café' in NFC), warm-started on one
    uploaded from a Mac (NFD): the same class, not a new one and a dropped one."""
    nfc, nfd = "caf\u00e9", "cafe\u0301"
    weights = _published(["apple", nfc, "tea"])
    model = build_model(ARCH, 3)
    same = load_into(model, weights, arch=ARCH, num_classes=3, class_names=["apple", nfd, "tea"])
    assert same is None  # loaded as it is
    assert all(torch.equal(model.state_dict()[k], v) for k, v in weights.state.items())

    model = build_model(ARCH, 3)
    change = load_into(model, weights, arch=ARCH, num_classes=3, class_names=[nfd, "kiwi", "tea"])
    assert change is not None and change.line() == (
        "head by class name: 2 of the 3 classes kept, new 'kiwi', dropped 'apple'"
    )
    for key in change.keys:
        assert torch.equal(model.state_dict()[key][0], weights.state[key][1])  # café


def test_more_classes_keep_the_rows_of_those_the_weights_had():
    weights = _published(["circle", "square"])
    model = build_model(ARCH, 3)
    change = load_into(
        model, weights, arch=ARCH, num_classes=3, class_names=["circle", "square", "stripe"]
    )
    assert change is not None and change.line() == (
        "head by class name: 2 of the 3 classes kept, new 'stripe'"
    )
    for key in change.keys:
        assert torch.equal(model.state_dict()[key][:2], weights.state[key])


def test_the_same_classes_load_as_they_are_and_unnamed_weights_by_their_count():
    weights = _published(["a", "b"])
    model = build_model(ARCH, 2)
    assert load_into(model, weights, arch=ARCH, num_classes=2, class_names=["a", "b"]) is None
    assert all(torch.equal(model.state_dict()[k], v) for k, v in weights.state.items())
    unnamed = dataclasses.replace(weights, class_names=None)  # a state dict: no names
    change = load_into(
        build_model(ARCH, 3), unnamed, arch=ARCH, num_classes=3, class_names=["x"] * 3
    )
    assert change is not None and change.line() == "new head for 3 classes (was 2)"
