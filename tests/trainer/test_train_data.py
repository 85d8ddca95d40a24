"""Data helpers: listing, decoding, transforms, seeded split, and exact mid-epoch positioning."""

from __future__ import annotations

import json

import pytest
import torch
from PIL import Image

from tests.image_data import write_image_folder
from tests.trainer.trainer_launch import TINY
from trainer.data import CachedImages, Normalizer, eval_transform, list_images, load_image
from trainer.errors import DataError
from trainer.listing import load_splits
from trainer.loader import StreamedImages
from trainer.train import main


def test_list_images_sorted_with_labels(image_folder):
    items, classes = list_images(image_folder / "train")
    assert classes == ["circle", "square", "stripe"]
    assert len(items) == 36 and items == sorted(items)
    assert {label for _, label in items} == {0, 1, 2}
    val, val_classes = list_images(image_folder / "val", ["x", "circle", "square", "stripe"])
    assert val_classes == ["x", "circle", "square", "stripe"]
    assert {label for _, label in val} == {1, 2, 3}


def test_list_images_errors_name_the_folder(tmp_path, image_folder):
    with pytest.raises(DataError, match="does not exist"):
        list_images(tmp_path / "nope")
    with pytest.raises(DataError, match="not one of the training classes"):
        list_images(image_folder / "val", ["circle"])
    (image_folder / "train" / "empty").mkdir()
    with pytest.raises(DataError, match=str(image_folder / "train" / "empty")):
        list_images(image_folder / "train")


def test_load_image_and_eval_transform(tmp_path, image_folder):
    items, _ = list_images(image_folder / "train")
    image = load_image(items[0][0])
    assert image.mode == "RGB" and image.size == (16, 16)
    gray = tmp_path / "gray.png"
    Image.new("L", (40, 20), 128).save(gray)
    tensor = eval_transform(16, [0.5] * 3, [0.25] * 3)(load_image(gray))
    assert tensor.shape == (3, 16, 16) and tensor.dtype == torch.float32
    assert torch.allclose(tensor, torch.full_like(tensor, (128 / 255 - 0.5) / 0.25), atol=1e-5)
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"nope")
    with pytest.raises(DataError, match=f"cannot read image {broken}"):
        load_image(broken)


def test_seeded_split_without_val_folder(tmp_path):
    root = write_image_folder(tmp_path / "d", val_per_class=None, per_class=10)
    splits = load_splits(root, val_fraction=0.2, seed=3)
    train, val = splits.train.items(), splits.val.items()
    assert len(train) == 24 and len(val) == 6 and not set(train) & set(val)
    assert {label for _, label in val} == {0, 1, 2}  # stratified
    assert load_splits(root, val_fraction=0.2, seed=3).val.items() == val
    assert load_splits(root, val_fraction=0.2, seed=4).val.items() != val


@pytest.mark.parametrize(("cached", "workers"), [(True, 0), (False, 0), (False, 1)])
def test_starting_mid_epoch_replays_the_exact_remaining_batches(image_folder, cached, workers):
    splits = load_splits(image_folder, val_fraction=0.1, seed=0)
    train, val = splits.train, splits.val
    normalize = Normalizer([0.5] * 3, [0.5] * 3, torch.device("cpu"), channels_last=False)
    options = dict(image_size=16, augment="crop-flip", batch_size=4, rank=1, world_size=2)
    source = (
        CachedImages(train, val, seed=5, normalize=normalize, **options)
        if cached
        else StreamedImages(train, val, seed=5, normalize=normalize, num_workers=workers, **options)
    )
    full = list(source.epoch(2))
    assert len(full) == source.steps_per_epoch == 4
    tail = list(source.epoch(2, start_batch=3))
    assert len(tail) == 1
    assert torch.equal(tail[0][0], full[3][0]) and torch.equal(tail[0][1], full[3][1])
    other_epoch = list(source.epoch(3))
    assert not torch.equal(other_epoch[0][0], full[0][0])  # a new order/augmentation each epoch
    val_images = sum(len(labels) for _, labels in source.validation(5))
    assert val_images == len(range(1, len(val), 2))  # rank 1's shard, no padding duplicates


def test_streamed_training_with_a_worker_and_synthetic_training(tmp_path, image_folder):
    out = tmp_path / "streamed"
    args = ["--data-dir", image_folder, "--output-dir", out, *TINY, "--batch-size", "4"]
    args += ["--cache-images", "never", "--num-workers", "1", "--max-steps", "3"]
    assert main([str(a) for a in args]) == 0
    assert json.loads((out / "summary.json").read_text())["steps"] == 3

    out = tmp_path / "synthetic"
    args = ["--synthetic", "--output-dir", out, *TINY, "--batch-size", "4", "--num-classes", "5"]
    args += ["--synthetic-size", "16", "--epochs", "2", "--channels-last", "--optimizer", "adamw"]
    assert main([str(a) for a in args]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 8 and summary["num_classes"] == 5
    assert summary["val_accuracy"] is None and summary["images_per_sec"] > 0


def test_batch_crop_and_flip():
    from trainer.data import _crop_flip_batch

    images = torch.arange(2 * 3 * 4 * 4, dtype=torch.uint8).view(2, 3, 4, 4)
    generator = torch.Generator().manual_seed(0)
    assert torch.equal(_crop_flip_batch(images, 0, False, generator), images)
    flipped = [_crop_flip_batch(images, 0, True, generator) for _ in range(8)]
    assert all(
        torch.equal(out[i], images[i]) or torch.equal(out[i], images[i].flip(-1))
        for out in flipped
        for i in range(2)
    )
    assert any(torch.equal(out[0], images[0].flip(-1)) for out in flipped)
    cropped = _crop_flip_batch(images, 2, False, generator)
    assert cropped.shape == images.shape and cropped.dtype == torch.uint8
