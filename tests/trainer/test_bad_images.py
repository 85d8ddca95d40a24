"""A data set as people have them: every unreadable file is found before step 1 and named in
one error, or left out with --skip-bad-images and counted in summary.json."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
from PIL import Image

from tests.trainer.trainer_launch import TINY
from trainer.errors import EXIT_DATA
from trainer.image_check import find_bad_images, read_problem
from trainer.listing import load_splits
from trainer.train import main


def _messy_folder(root: Path) -> None:
    """Two classes with odd names, every common picture mode, clutter and two broken files."""
    cafe, circle = root / "train" / "café", root / "train" / "red circle"
    for folder in (cafe, circle):
        folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(6):
        for folder in (cafe, circle):
            pixels = rng.integers(0, 255, (20, 20, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / f"rgb-{i}.jpg")
    Image.new("RGBA", (20, 20), (255, 0, 0, 128)).save(cafe / "alpha.png")
    Image.new("L", (20, 20), 90).save(cafe / "grey.png")
    Image.new("CMYK", (20, 20), (0, 255, 0, 0)).save(circle / "print.jpg")
    Image.fromarray(np.full((20, 20), 40000, dtype=np.uint16)).save(circle / "deep.png")
    Image.new("RGB", (20, 20), (0, 0, 200)).save(circle / "CAMERA.JPG")
    (cafe / "empty.jpg").write_bytes(b"")
    whole = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(whole, format="PNG")
    (circle / "cut.png").write_bytes(whole.getvalue()[: len(whole.getvalue()) // 2])
    for clutter in (".DS_Store", "Thumbs.db", "notes.txt"):
        (cafe / clutter).write_bytes(b"\x00\x01")


def test_every_unreadable_file_is_named_in_one_error_before_step_1(tmp_path, capsys):
    data = tmp_path / "data"
    _messy_folder(data)
    out = tmp_path / "out"
    args = ["--data-dir", data, "--output-dir", out, *TINY, "--epochs", "1"]
    assert main([str(a) for a in args]) == EXIT_DATA
    err = capsys.readouterr().err
    assert "2 of 19 images cannot be read" in err
    assert "train/café/empty.jpg (class café)" in err
    assert "train/red circle/cut.png (class red circle)" in err
    assert "--skip-bad-images, in the pipeline skip_bad_images=true," in err
    assert not (out / "summary.json").exists()
    assert not list(out.glob("checkpoints/step-*"))  # nothing trained


def test_skip_bad_images_trains_without_them_and_says_which(tmp_path, capsys):
    data = tmp_path / "data"
    _messy_folder(data)
    out = tmp_path / "out"
    args = ["--data-dir", data, "--output-dir", out, *TINY, "--epochs", "1", "--skip-bad-images"]
    args += ["--batch-size", "4"]
    assert main([str(a) for a in args]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["skipped_images"] == {
        "count": 2,
        "keys": ["train/café/empty.jpg", "train/red circle/cut.png"],
    }
    printed = capsys.readouterr()
    assert "2 unreadable images left out" in printed.out + printed.err


def test_the_ranks_share_the_reading_and_together_find_every_file(tmp_path):
    data = tmp_path / "data"
    _messy_folder(data)
    splits = load_splits(data, val_fraction=0.2, seed=0)
    found = [
        b.key
        for rank in range(3)
        for b in find_bad_images(
            (splits.train, splits.val), data, rank=rank, world_size=3, threads=2
        )
    ]
    assert sorted(found) == ["train/café/empty.jpg", "train/red circle/cut.png"]


def test_a_readable_file_has_no_problem_and_a_truncated_one_says_so(tmp_path):
    good = tmp_path / "good.png"
    Image.new("RGB", (8, 8)).save(good)
    assert read_problem(str(good)) is None
    cut = tmp_path / "cut.jpg"
    whole = io.BytesIO()
    Image.new("RGB", (256, 256), (9, 9, 9)).save(whole, format="JPEG")
    cut.write_bytes(whole.getvalue()[:300])
    assert "truncated" in (read_problem(str(cut)) or "").lower()


def test_a_jpeg_cut_short_is_found_and_a_long_camera_trailer_is_not_a_problem(tmp_path):
    rng = np.random.default_rng(1)
    whole = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (300, 400, 3), dtype=np.uint8)).save(whole, "JPEG")
    data = whole.getvalue()
    cut = tmp_path / "cut.jpg"
    cut.write_bytes(data[: len(data) * 2 // 3])  # the header whole, the pixels cut
    assert "truncated" in (read_problem(str(cut)) or "").lower()
    trailer = tmp_path / "trailer.jpg"
    trailer.write_bytes(data + b"\x00maker notes" * 10_000)  # ~120 KB after the end marker
    assert read_problem(str(trailer)) is None
