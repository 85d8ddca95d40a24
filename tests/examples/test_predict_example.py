"""examples/predict: a published model used with torch, torchvision and Pillow alone gives the
probabilities the evaluation step computes (the trainer's own loading and preprocessing), for
every kind of picture the trainer reads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from trainer.data import eval_transform, load_image
from trainer.export import load_model, save_model
from trainer.models import build_model

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "predict" / "predict.py"
CLASSES = ["ant", "bee", "cat", "dog"]
# PyPI's torchvision here is a CUDA build beside a CPU torch: its import needs trainer.tv_compat
# first (in a serving image torch and torchvision match). Then the example runs as its own
# program would.
RUN = (
    "import runpy, sys; from trainer.tv_compat import import_torchvision; import_torchvision(); "
    "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
)


def _predict(*args: object) -> subprocess.CompletedProcess:
    command = [sys.executable, "-c", RUN, str(EXAMPLE), *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, check=False)


EXIF_ORIENTATION = 0x0112


# GoogLeNet: the pipeline builds it without its auxiliary heads, and the example must too.
@pytest.fixture(scope="module", params=[("resnet18", 32), ("googlenet", 48)], ids=lambda p: p[0])
def model_dir(request, tmp_path_factory) -> Path:
    arch, image_size = request.param
    torch.manual_seed(7)
    model = build_model(arch, len(CLASSES)).eval()
    folder = tmp_path_factory.mktemp("published") / "model"
    save_model(
        folder,
        model.state_dict(),
        arch=arch,
        class_names=CLASSES,
        image_size=image_size,
        mean=[0.5, 0.4, 0.3],  # not ImageNet's: the example must read them from model.json
        std=[0.2, 0.25, 0.3],
    )
    return folder


def _pictures(folder: Path) -> list[Path]:
    """One of each kind the trainer reads, none of them square."""
    rng = np.random.default_rng(3)

    def pixels(height: int, width: int, bands: int = 3) -> np.ndarray:
        return rng.integers(0, 256, size=(height, width, bands), dtype=np.uint8)

    folder.mkdir()
    made = {}
    upright = Image.fromarray(pixels(37, 50))
    exif = upright.getexif()
    exif[EXIF_ORIENTATION] = 6  # stored sideways, as a phone stores a portrait photo
    upright.save(made.setdefault("rotated", folder / "rotated.jpg"), exif=exif.tobytes())
    Image.fromarray(pixels(64, 20, 4)).save(made.setdefault("rgba", folder / "see-through.png"))
    Image.fromarray(pixels(33, 45, 1)[..., 0]).save(made.setdefault("grey", folder / "grey.png"))
    wide = rng.integers(0, 65536, size=(30, 40), dtype=np.uint16)
    Image.fromarray(wide).save(made.setdefault("16-bit", folder / "16-bit.png"))
    cmyk = Image.fromarray(pixels(60, 45, 4), mode="CMYK")
    cmyk.save(made.setdefault("cmyk", folder / "print.jpg"))
    palette = Image.fromarray(pixels(30, 31)).convert("P")
    palette.save(made.setdefault("palette", folder / "icon.gif"), transparency=0)
    assert Image.open(made["16-bit"]).mode.startswith("I")
    return list(made.values())


def _reference(model_dir: Path, pictures: list[Path]) -> list[list[float]]:
    """The evaluation step's probabilities (trainer.export, trainer.data)."""
    model, info = load_model(model_dir)
    prepare = eval_transform(info["image_size"], info["mean"], info["std"])
    batch = torch.stack([prepare(load_image(path)) for path in pictures])
    with torch.inference_mode():
        return model(batch).softmax(dim=1).tolist()


def test_the_example_gives_the_evaluations_probabilities(model_dir, tmp_path):
    pictures = _pictures(tmp_path / "pictures")
    page = tmp_path / "page.jpg"
    page.write_text("<html>404</html>")  # what a scraper saves as a picture
    done = _predict(model_dir, pictures[0], page, *pictures[1:], "--top", 4)
    assert done.returncode == 2, done.stderr  # one unreadable, named; the others classified
    assert f"cannot read {page}" in done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [line["image"] for line in lines] == [str(p) for p in pictures]
    for line, expected in zip(lines, _reference(model_dir, pictures), strict=True):
        got = {name: probability for name, probability in line["top"]}
        assert sorted(got) == CLASSES, line
        assert [got[name] for name in CLASSES] == pytest.approx(expected, abs=1e-6), line
        assert [p for _, p in line["top"]] == sorted(got.values(), reverse=True)


def test_a_folder_that_is_no_model_is_exit_2_naming_it(tmp_path):
    not_a_model = tmp_path / "downloads"
    not_a_model.mkdir()
    done = _predict(not_a_model, "x.jpg")
    assert done.returncode == 2
    assert f"{not_a_model} has no model.json and weights.pt" in done.stderr
