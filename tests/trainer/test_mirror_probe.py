"""--augment auto mirrors the training images only when a mirror keeps their class: real
digits lose the mirror (a mirrored 2 is no 2), photos and the band images keep it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pipelines.digits import write_digits_image_folder
from tests.image_data import write_image_folder
from tests.trainer.trainer_launch import TINY
from trainer.listing import load_splits
from trainer.mirror_probe import probe_mirror
from trainer.train import main


def _photo_crops(root: Path) -> Path:
    """96x96 crops of scikit-learn's two sample photographs, one class each."""
    from sklearn.datasets import load_sample_images

    rng = np.random.default_rng(0)
    for name, picture in zip(("china", "flower"), load_sample_images().images, strict=True):
        folder = root / "train" / name
        folder.mkdir(parents=True)
        for i in range(40):
            y = int(rng.integers(0, picture.shape[0] - 96))
            x = int(rng.integers(0, picture.shape[1] - 96))
            Image.fromarray(picture[y : y + 96, x : x + 96]).save(folder / f"{i}.png")
    return root


@pytest.mark.parametrize(
    ("data", "augment"),
    [
        (lambda root: write_digits_image_folder(root, image_size=16) and root, "crop"),
        (lambda root: write_image_folder(root, per_class=20), "crop-flip"),
        (_photo_crops, "crop-flip"),
    ],
    ids=["digits", "bands", "photos"],
)
def test_the_probe_keeps_the_mirror_only_where_it_keeps_the_classes(tmp_path, data, augment):
    folder = data(tmp_path / "data")
    probe = probe_mirror(load_splits(folder, val_fraction=0.2, seed=0).train)
    assert probe.augment() == augment, probe.line()
    assert probe.images > 0 and 0.0 <= probe.mirrored <= 1.0 and 0.0 <= probe.plain <= 1.0


def test_digits_mirrored_are_mostly_other_digits_to_the_probe(tmp_path):
    write_digits_image_folder(tmp_path / "digits", image_size=16)
    probe = probe_mirror(load_splits(tmp_path / "digits", val_fraction=0.2, seed=0).train)
    assert probe.plain > 0.85 and probe.mirrored < 0.45, probe.line()  # measured 0.912, 0.356


def test_auto_is_decided_before_step_1_logged_and_kept_in_the_summary(tmp_path, capsys):
    write_digits_image_folder(tmp_path / "digits", image_size=16)
    out = tmp_path / "out"
    args = ["--data-dir", str(tmp_path / "digits"), "--output-dir", str(out), *TINY]
    assert main([*args, "--epochs", "1", "--max-steps", "2", "--augment", "auto"]) == 0
    said = capsys.readouterr()
    assert "augment auto: crop (mirroring changes the classes" in said.out + said.err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["augment"]["augment"] == "crop"
    assert summary["augment"]["probe"]["plain"] > summary["augment"]["probe"]["mirrored"]
