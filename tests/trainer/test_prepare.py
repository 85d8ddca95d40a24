"""``python -m trainer.prepare``: re-encoding to a 256 px short side, incremental and safe."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from tests.trainer.trainer_launch import REPO, base_env
from trainer.errors import ConfigError
from trainer.prepare import MANIFEST, PrepareOptions, main, prepare


def _jpeg(path, width, height, mode="RGB"):
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(width * height)
    pixels = rng.integers(0, 255, (height, width, 3), dtype=np.uint8)
    Image.fromarray(pixels).convert(mode).save(path, format="JPEG", quality=90)


@pytest.fixture
def source(tmp_path):
    root = tmp_path / "src"
    _jpeg(root / "train" / "ant" / "big.jpg", 500, 375)
    _jpeg(root / "train" / "ant" / "tall.JPEG", 300, 600, "L")
    _jpeg(root / "train" / "bee" / "cmyk.jpg", 400, 300, "CMYK")
    _jpeg(root / "train" / "bee" / "small.jpg", 200, 150)
    (root / "val" / "bee").mkdir(parents=True)
    Image.new("RGB", (640, 480), (1, 2, 3)).save(root / "val" / "bee" / "x.png")
    return root


def test_reencodes_big_jpegs_copies_the_rest_and_keeps_the_layout(tmp_path, source):
    (source / "train" / "ant" / "notes.txt").write_text("not an image")
    (source / "train" / ".hidden.jpg").write_bytes(b"")
    destination = tmp_path / "dst"
    assert main([str(source), str(destination), "--workers", "2"]) == 0

    def size(relative):
        with Image.open(destination / relative) as image:
            return image.size, image.mode, image.format

    assert size("train/ant/big.jpg") == ((341, 256), "RGB", "JPEG")
    assert size("train/ant/tall.JPEG") == ((256, 512), "L", "JPEG")
    assert size("train/bee/cmyk.jpg") == ((341, 256), "RGB", "JPEG")
    for unchanged in ("train/bee/small.jpg", "val/bee/x.png"):  # small or not a JPEG: as is
        assert (destination / unchanged).read_bytes() == (source / unchanged).read_bytes()
    written = sorted(p.relative_to(destination) for p in destination.rglob("*") if p.is_file())
    assert [str(p) for p in written] == [
        MANIFEST,
        "train/ant/big.jpg",
        "train/ant/tall.JPEG",
        "train/bee/cmyk.jpg",
        "train/bee/small.jpg",
        "val/bee/x.png",
    ]  # no temp files, no hidden or non-image files
    assert json.loads((destination / MANIFEST).read_text()) == {"short_side": 256, "quality": 90}
    big = (source / "train/ant/big.jpg").stat().st_size
    assert (destination / "train/ant/big.jpg").stat().st_size < big


def test_a_second_run_skips_what_is_up_to_date(tmp_path, source):
    destination = tmp_path / "dst"
    options = PrepareOptions(source=source, destination=destination, workers=1)
    first = prepare(options)
    assert (first.reencoded, first.copied, first.up_to_date) == (3, 2, 0)
    again = prepare(options)
    assert (again.reencoded, again.copied, again.up_to_date) == (0, 0, 5)
    changed = source / "train" / "ant" / "big.jpg"
    _jpeg(changed, 600, 400)
    os.utime(changed, ns=(1, 1))  # any other mtime than the copy's marks it as changed
    third = prepare(options)
    assert (third.reencoded, third.up_to_date) == (1, 4)
    with Image.open(destination / "train/ant/big.jpg") as image:
        assert image.size == (384, 256)


def test_unsafe_or_inconsistent_runs_are_refused(tmp_path, source):
    with pytest.raises(ConfigError, match="lies inside SRC"):
        PrepareOptions(source=source, destination=source / "train" / "small")
    with pytest.raises(ConfigError, match="lies inside SRC"):
        PrepareOptions(source=source, destination=source)
    with pytest.raises(ConfigError, match="--quality 100 is out of range"):
        PrepareOptions(source=source, destination=tmp_path / "d", quality=100)
    with pytest.raises(ConfigError, match="is not a folder"):
        PrepareOptions(source=tmp_path / "missing", destination=tmp_path / "d")
    destination = tmp_path / "dst"
    assert main([str(source), str(destination), "--workers", "1"]) == 0
    assert main([str(source), str(destination), "--short-side", "128"]) == 2
    assert json.loads((destination / MANIFEST).read_text())["short_side"] == 256


def test_unreadable_images_exit_3_naming_them_after_writing_the_rest(tmp_path, source, capsys):
    broken = source / "train" / "bee" / "broken.jpg"
    broken.write_bytes(b"\xff\xd8\xff\xe0 truncated")
    destination = tmp_path / "dst"
    assert main([str(source), str(destination), "--workers", "1"]) == 3
    assert f"unreadable: {broken}" in capsys.readouterr().err
    assert not (destination / "train" / "bee" / "broken.jpg").exists()
    assert (destination / "train" / "ant" / "big.jpg").exists()


def test_runs_as_a_module(tmp_path, source):
    result = subprocess.run(
        [sys.executable, "-m", "trainer.prepare", str(source), str(tmp_path / "dst")],
        cwd=REPO,
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1].removeprefix("[prepare] "))
    assert summary["reencoded"] == 3 and summary["failed"] == 0


def test_a_sideways_photo_is_reencoded_upright(tmp_path):
    """The copy keeps no EXIF orientation, so it is applied before the resize."""
    source = tmp_path / "src" / "train" / "ant" / "phone.jpg"
    source.parent.mkdir(parents=True)
    exif = Image.Exif()
    exif[0x0112] = 6  # stored 600x400, shown 400x600
    Image.new("RGB", (600, 400), (10, 200, 10)).save(source, exif=exif, quality=90)
    assert main([str(tmp_path / "src"), str(tmp_path / "dst"), "--workers", "1"]) == 0
    with Image.open(tmp_path / "dst" / "train" / "ant" / "phone.jpg") as copy:
        assert copy.size == (256, 384)
        assert copy.getexif().get(0x0112, 1) == 1
