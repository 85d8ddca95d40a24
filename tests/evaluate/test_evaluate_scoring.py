"""evaluate(): exact numbers on the hand-checkable colour model, data checks, argument checks."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil

import pytest
import torch

from components.evaluate import EvalResult, EvaluationError, ScoreAccumulator, evaluate
from components.evaluate.evaluate import classes_without_images
from tests.evaluate.colour_model import CLASSES, hand_logits, write_colour_model
from tests.evaluate.conftest import LAYOUT

# Worked out by hand from LAYOUT (rows: true a..f, columns: predicted a..f).
CONFUSION = [
    [2, 1, 0, 0, 0, 0],
    [0, 1, 1, 0, 0, 0],
    [1, 0, 1, 0, 0, 0],
    [1, 0, 0, 0, 0, 0],
    [0, 1, 0, 0, 0, 0],
    [0, 0, 1, 0, 0, 0],
]
ACCURACY = 4 / 10  # a: 2 of 3, b: 1 of 2, c: 1 of 2
TOP5 = 8 / 10  # misses: a blue image of b (b ranks 6th), a red image of c (c ranks 6th)
PRECISION = [2 / 4, 1 / 3, 1 / 3, 0.0, 0.0, 0.0]  # d, e, f are never predicted
RECALL = [2 / 3, 1 / 2, 1 / 2, 0.0, 0.0, 0.0]
SUPPORT = [3, 2, 2, 1, 1, 1]


def hand_loss() -> float:
    """Mean cross-entropy: log(sum(exp(logits))) - logits[true class], per image."""
    losses = []
    for target, colours in enumerate(LAYOUT.values()):
        for colour in colours:
            logits = hand_logits(colour)
            losses.append(math.log(sum(math.exp(v) for v in logits)) - logits[target])
    return sum(losses) / len(losses)


# One batch; several with a short last one; decoded by DataLoader worker processes.
@pytest.mark.parametrize(("batch_size", "num_workers"), [(256, 0), (3, 0), (4, 2)])
def test_numbers_match_the_hand_computation(colour_model, colour_data, batch_size, num_workers):
    result = evaluate(
        colour_model, colour_data, batch_size=batch_size, num_workers=num_workers, device="cpu"
    )

    assert isinstance(result, EvalResult)
    assert result.class_names == list(CLASSES)
    assert result.num_samples == 10
    assert result.confusion == CONFUSION
    assert result.accuracy == ACCURACY
    assert result.top_k == 5
    assert result.top_k_accuracy == TOP5
    assert result.precision == pytest.approx(PRECISION, abs=1e-12)
    assert result.recall == pytest.approx(RECALL, abs=1e-12)
    assert result.support == SUPPORT
    assert result.loss == pytest.approx(hand_loss(), abs=1e-5)
    assert (result.arch, result.split, result.device) == ("resnet18", "val", "cpu")
    assert result.passed  # threshold 0, no baseline
    assert result.reason == "accuracy 0.4 ≥ threshold 0 (no baseline)"


def test_to_dict_is_plain_json_keyed_by_class(colour_model, colour_data):
    data = evaluate(colour_model, colour_data, device="cpu", threshold=0.5).to_dict()

    assert data["accuracy"] == ACCURACY and data["top_k_accuracy"] == TOP5
    assert data["num_samples"] == 10
    assert data["passed"] is False
    assert data["reason"] == "accuracy 0.4 < threshold 0.5 (no baseline)"
    assert data["confusion_matrix"] == CONFUSION
    assert list(data["per_class"]) == list(CLASSES)
    assert data["per_class"]["a"] == {"precision": 0.5, "recall": 2 / 3, "support": 3}
    assert data["per_class"]["f"] == {"precision": 0.0, "recall": 0.0, "support": 1}


def test_class_folders_are_matched_by_name_not_position(tmp_path, colour_data):
    # The same network, but its outputs are named in reverse: output 0 is "f", output 5 is "a".
    model = write_colour_model(tmp_path / "model", tuple(reversed(CLASSES)))
    result = evaluate(model, colour_data, device="cpu")

    assert result.class_names == list(reversed(CLASSES))
    # Red images are now predicted "f", green "e", blue "d": only the green image of "e" is right.
    assert result.accuracy == 1 / 10
    assert result.confusion[0] == [0, 0, 1, 0, 0, 0]  # true "f" (one blue image) → "d"
    assert result.support == list(reversed(SUPPORT))


def test_a_class_folder_spelt_in_nfd_is_the_models_nfc_class(tmp_path, colour_data):
    """A model trained on 'café' from Linux (NFC), scored on a val/ uploaded from a Mac (NFD)."""
    nfc, nfd = "caf\u00e9", "cafe\u0301"
    model = write_colour_model(tmp_path / "model", (nfc, *CLASSES[1:]))
    data = tmp_path / "data"
    shutil.copytree(colour_data, data)
    (data / "val" / CLASSES[0]).rename(data / "val" / nfd)

    result = evaluate(model, data, device="cpu")
    assert result.class_names == [nfc, *CLASSES[1:]]
    assert (result.confusion, result.support, result.accuracy) == (CONFUSION, SUPPORT, ACCURACY)


def test_a_batch_too_big_for_the_memory_is_scored_in_smaller_ones(
    colour_model, colour_data, monkeypatch, capsys
):
    """The step's batch size (256) is not a pipeline parameter: a model whose batch does not fit
    is scored in halves, to the same numbers, instead of failing the run after its training."""
    from torchvision.models.resnet import ResNet

    forward = ResNet.forward

    def fits_three(self, x):  # the allocator's answer for more than three images at once
        if x.shape[0] > 3:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB.")
        return forward(self, x)

    monkeypatch.setattr(ResNet, "forward", fits_three)
    result = evaluate(colour_model, colour_data, device="cpu", batch_size=16)
    assert (result.confusion, result.accuracy, result.top_k_accuracy) == (CONFUSION, ACCURACY, TOP5)
    said = capsys.readouterr().out
    assert "evaluate: out of memory on cpu at batch_size=16; scoring again in batches of 8" in said
    assert "at batch_size=4; scoring again in batches of 2" in said

    monkeypatch.setattr(ResNet, "forward", lambda self, x: fits_three(self, x.repeat(4, 1, 1, 1)))
    with pytest.raises(EvaluationError, match="out of memory on cpu scoring one image at a time"):
        evaluate(colour_model, colour_data, device="cpu", batch_size=4)


def test_class_mismatch_is_a_clear_error(tmp_path, colour_model, colour_data):
    data = tmp_path / "data"
    shutil.copytree(colour_data, data)
    (data / "val" / "f").rename(data / "val" / "zebra")

    with pytest.raises(EvaluationError) as err:
        evaluate(colour_model, data, device="cpu")
    message = str(err.value)
    assert "that are not among the model's class_names: ['zebra']" in message
    assert "and no folder for ['f']" in message
    assert str(data / "val") in message


def test_a_class_without_images_is_scored_with_support_0(tmp_path, colour_model, colour_data):
    """A split without a rare class's folder, as the trainer's validation and the data step
    allow: the model is scored on the other images, by name (no class shifts into a's place)."""
    data = tmp_path / "data"
    shutil.copytree(colour_data, data)
    shutil.rmtree(data / "val" / "a")  # its 3 images, 2 of them predicted right

    result = evaluate(colour_model, data, device="cpu")
    assert result.class_names == list(CLASSES)
    assert result.num_samples == 7
    assert result.confusion == [[0] * 6, *CONFUSION[1:]]
    assert result.accuracy == 2 / 7  # b: 1 of 2, c: 1 of 2
    assert result.support == [0, *SUPPORT[1:]]
    assert result.recall[0] == 0.0 and result.precision[0] == 0.0  # c and d predicted a
    assert classes_without_images(result) == ["a"]
    assert classes_without_images(evaluate(colour_model, colour_data, device="cpu")) == []


def test_missing_split_and_model_files_name_the_fix(tmp_path, colour_model, colour_data):
    with pytest.raises(EvaluationError, match=r"needs a test/ folder of class sub-folders"):
        evaluate(colour_model, colour_data, split="test", device="cpu")
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    with pytest.raises(EvaluationError, match=r"has no weights\.pt; pass the trainer's model/"):
        evaluate(empty, colour_data, device="cpu")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"threshold": 1.5}, "threshold=1.5 is out of range; allowed: 0.0 <= threshold <= 1.0"),
        ({"threshold": float("nan")}, "threshold=nan is out of range"),
        ({"tolerance": -0.1}, "tolerance=-0.1 is out of range; allowed: 0.0 <= tolerance <= 1.0"),
        ({"batch_size": 0}, "batch_size=0 must be an integer >= 1"),
        ({"batch_size": 2.5}, "batch_size=2.5 must be an integer >= 1"),
        ({"num_workers": -1}, "num_workers=-1 must be an integer >= 0"),
        ({"device": "tpu"}, "device='tpu' is not supported; allowed: 'auto', 'cpu', 'cuda'"),
        ({"split": "../train"}, "split='../train' must be a single folder name"),
        ({"split": ""}, "split='' is not a folder name"),
        ({"precision": "fp16"}, "precision='fp16' is not supported; allowed: fp32, bf16"),
        ({"baseline": {"loss": 0.1}}, "baseline has no 'accuracy' (or 'val_accuracy') key"),
        ({"baseline": {"accuracy": 97}}, "baseline['accuracy']=97 is out of range"),
    ],
)
def test_bad_arguments_name_the_knob_value_and_range(tmp_path, kwargs, message):
    # Arguments are checked before anything is read: the folders need not exist.
    with pytest.raises(EvaluationError) as err:
        evaluate(tmp_path / "model", tmp_path / "data", **kwargs)
    assert message in str(err.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a CPU-only machine")
def test_cuda_requested_without_cuda(colour_model, colour_data):
    with pytest.raises(EvaluationError, match=r"device='cuda' but CUDA is not available"):
        evaluate(colour_model, colour_data, device="cuda")


def test_bf16_autocast_gives_the_same_predictions(colour_model, colour_data):
    result = evaluate(colour_model, colour_data, device="cpu", precision="bf16")
    assert result.confusion == CONFUSION
    assert result.loss == pytest.approx(hand_loss(), abs=0.05)


def test_accumulator_on_hand_written_logits():
    scores = ScoreAccumulator(3)  # k = min(5, 3) = 3: every top-3 hits
    logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 0.0, 3.0], [0.0, 1.0, 0.0], [0.0, 1.0, 0.0]])
    scores.update(logits[:2], torch.tensor([0, 1]))
    scores.update(logits[2:], torch.tensor([1, 1]))
    summary = scores.summary()

    assert summary["confusion"] == [[1, 0, 0], [0, 2, 1], [0, 0, 0]]
    assert summary["accuracy"] == 3 / 4
    assert (summary["top_k"], summary["top_k_accuracy"]) == (3, 1.0)
    assert summary["precision"] == [1.0, 1.0, 0.0]
    assert summary["recall"] == [1.0, 2 / 3, 0.0]  # class 2 has no images: 0.0, not NaN
    assert summary["support"] == [1, 3, 0]
    expected_loss = (
        (math.log(math.exp(2) + 2) - 2)
        + (math.log(math.exp(3) + 2) - 0)
        + 2 * (math.log(math.e + 2) - 1)
    ) / 4
    assert summary["loss"] == pytest.approx(expected_loss, abs=1e-6)


def test_accumulator_rejects_logits_of_the_wrong_width():
    with pytest.raises(EvaluationError, match=r"expected \(batch, 4\) for 4 classes"):
        ScoreAccumulator(4).update(torch.zeros(2, 3), torch.tensor([0, 1]))


def test_result_needs_no_torch_to_serialise(colour_model, colour_data):
    import json

    result = evaluate(colour_model, colour_data, device="cpu")
    assert json.loads(json.dumps(result.to_dict())) == result.to_dict()


def _with_bad_images(colour_data, tmp_path, *keys: str):
    data = tmp_path / "data"
    shutil.copytree(colour_data, data)
    for key in keys:
        (data / key).write_bytes(b"<html>404</html>")  # what a scraper saves as an image
    return data


def _trained_leaving_out(tmp_path, *keys: str):
    model = write_colour_model(tmp_path / "model")
    summary = {"skipped_images": {"count": len(keys), "keys": list(keys)}}
    (model / "summary.json").write_text(json.dumps(summary))
    return model


def test_unreadable_images_fail_before_scoring_all_named(tmp_path, colour_model, colour_data):
    data = _with_bad_images(colour_data, tmp_path, "val/a/x.png", "val/f/y.jpg")
    with pytest.raises(EvaluationError) as err:
        evaluate(colour_model, data, device="cpu")
    message = str(err.value)
    assert message.startswith("2 of 12 images to score cannot be read"), message
    assert "val/a/x.png (class a)" in message and "val/f/y.jpg (class f)" in message


def test_the_images_the_training_left_out_are_left_out(tmp_path, colour_data):
    """skip_bad_images=true: the trainer left them out of its validation (its summary.json
    names them); the evaluation scores the same images, where it failed on the first one."""
    data = _with_bad_images(colour_data, tmp_path, "val/a/x.png", "val/f/y.jpg")
    model = _trained_leaving_out(tmp_path, "train/a/z.png", "val/a/x.png", "val/f/y.jpg")
    result = evaluate(model, data, device="cpu")
    assert result.skipped_images == ["val/a/x.png", "val/f/y.jpg"]
    assert result.num_samples == 10 and result.confusion == CONFUSION  # the others, as before
    assert result.to_dict()["skipped_images"] == ["val/a/x.png", "val/f/y.jpg"]
    # One more the training read fine: the data changed since, which is not the model's choice.
    again = _with_bad_images(data, tmp_path / "again", "val/b/w.png")
    with pytest.raises(EvaluationError, match=r"1 of 13 images to score cannot be read") as err:
        evaluate(model, again, device="cpu")
    assert "val/b/w.png (class b)" in str(err.value) and "x.png" not in str(err.value)


def test_a_model_whose_weights_are_nan_is_refused_not_scored(tmp_path, colour_data):
    """A diverged training's model predicts class 0 for everything (argmax of nan): scored, it
    could pass a low threshold and be published."""
    model = write_colour_model(tmp_path / "model")
    weights = torch.load(model / "weights.pt", weights_only=True)
    first = next(iter(weights))
    weights[first] = torch.full_like(weights[first], float("nan"))
    torch.save(weights, model / "weights.pt")
    with pytest.raises(EvaluationError, match=r"its weights are not all finite \(nan or inf\)"):
        evaluate(model, colour_data, device="cpu")


def test_a_loss_that_is_not_finite_is_left_out_of_what_kfp_stores(colour_model, colour_data):
    scored = evaluate(colour_model, colour_data, device="cpu")
    result = dataclasses.replace(scored, loss=float("inf"))  # e.g. a confident wrong answer
    assert "loss" not in result.scalar_metrics() and result.scalar_metrics()["accuracy"] == 0.4
    assert result.to_dict()["loss"] is None
    json.dumps(result.to_dict(), allow_nan=False)
