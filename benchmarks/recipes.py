"""Training recipes side by side on the real data sets available here: accuracy and time.

Each recipe is one ``python -m trainer.train`` run in a fresh process (one process, CPU), on the
same data, seed and machine; the table prints the validation accuracy, the wall time and both
against the first recipe of its data set (the baseline: the pipeline's defaults of 0.2.0).

Data sets (nothing downloaded):

* ``digits`` — scikit-learn's 1,797 handwritten digits (8x8 scans, upscaled), 10 classes; a
  mirrored digit is another symbol;
* ``bands`` — the tests' synthetic images (a bright band at a class-specific row): a mirror
  keeps the class;
* ``photos`` — 96x96 crops of scikit-learn's two sample photographs (``china``, ``flower``): a
  mirror keeps the class.

Recipes: the pipeline's defaults with ``--augment crop-flip`` (0.2.0), ``crop`` (no mirror) and
``auto`` (the mirror probe decides, ``trainer.mirror_probe``); on digits also a warm start
(``--init-from`` the defaults' model, 3 epochs) at two learning rates, the fine-tuning recipe.

    python benchmarks/recipes.py                 # all, ~10 minutes on 2 cores
    python benchmarks/recipes.py --data digits --epochs 4
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


@dataclass(frozen=True)
class Recipe:
    name: str
    flags: list[str] = field(default_factory=list)
    init_from: str = ""
    """The name of an earlier recipe whose model this one starts from."""


def write_data(name: str, root: Path) -> Path:
    """The data set ``name`` as an ImageFolder with train/ and val/ under ``root``."""
    folder = root / name
    if name == "digits":
        from pipelines.digits import write_digits_image_folder

        write_digits_image_folder(folder, image_size=32)
    elif name == "bands":
        from tests.image_data import write_image_folder

        write_image_folder(folder, per_class=120, val_per_class=40, size=32)
    else:
        _write_photo_crops(folder)
    return folder


def _write_photo_crops(folder: Path) -> None:
    from PIL import Image
    from sklearn.datasets import load_sample_images

    rng = np.random.default_rng(0)
    for name, picture in zip(("china", "flower"), load_sample_images().images, strict=True):
        for split, count in (("train", 160), ("val", 40)):
            target = folder / split / name
            target.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                y = int(rng.integers(0, picture.shape[0] - 96))
                x = int(rng.integers(0, picture.shape[1] - 96))
                Image.fromarray(picture[y : y + 96, x : x + 96]).save(target / f"{i}.png")


def run(recipe: Recipe, data: Path, out: Path, base: list[str], models: dict[str, Path]):
    """(validation accuracy, seconds, the run's summary) of one recipe."""
    args = [sys.executable, "-m", "trainer.train", "--data-dir", str(data)]
    args += ["--output-dir", str(out), *base, *recipe.flags]
    if recipe.init_from:
        args += ["--init-from", str(models[recipe.init_from])]
    start = time.perf_counter()
    done = subprocess.run(args, cwd=REPO, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{recipe.name} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    summary = json.loads((out / "summary.json").read_text())
    models[recipe.name] = out / "model"
    return summary["val_accuracy"], seconds, summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", nargs="*", default=["digits", "bands", "photos"])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--model", default="resnet18")
    args = parser.parse_args()
    base = ["--model", args.model, "--image-size", "32", "--batch-size", "64", "--lr", "0.1"]
    base += ["--epochs", str(args.epochs), "--seed", "0"]
    defaults = Recipe("defaults 0.2.0 (crop-flip)", ["--augment", "crop-flip"])
    recipes = [defaults, Recipe("crop (no mirror)", ["--augment", "crop"])]
    recipes.append(Recipe("auto (mirror probe)", ["--augment", "auto"]))
    warm = [
        Recipe("warm start, 3 epochs, lr 0.1", ["--epochs", "3"], init_from=defaults.name),
        Recipe(
            "warm start, 3 epochs, lr 0.01",
            ["--epochs", "3", "--lr", "0.01"],
            init_from=defaults.name,
        ),
    ]
    with tempfile.TemporaryDirectory(prefix="kfp-ddp-recipes-") as tmp:
        for name in args.data:
            data = write_data(name, Path(tmp) / "data")
            models: dict[str, Path] = {}
            print(f"\n{name}: {args.model}, 32 px, {args.epochs} epochs, batch 64, one process")
            header = ("recipe", "accuracy", "× base", "seconds", "× base")
            print("  {:34s} {:>8s} {:>7s} {:>8s} {:>7s}".format(*header))
            baseline = None
            for k, recipe in enumerate(recipes + (warm if name == "digits" else [])):
                out = Path(tmp) / name / str(k)
                accuracy, seconds, summary = run(recipe, data, out, base, models)
                baseline = baseline or (accuracy, seconds)
                label = recipe.name
                if recipe.flags[-1:] == ["auto"]:
                    label += f" → {summary.get('augment', {}).get('augment', '?')}"
                print(
                    f"  {label:34s} {accuracy:8.3f} {accuracy / baseline[0]:7.3f} "
                    f"{seconds:8.1f} {seconds / baseline[1]:7.2f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
