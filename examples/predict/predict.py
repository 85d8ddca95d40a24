"""Classify pictures with a model the pipeline published: torch, torchvision and Pillow alone
(what a serving image has), not this package.

    aws s3 cp --recursive s3://my-bucket/models/cats/<run id>/ model/
    python predict.py model/ photo.jpg scan.png --top 3

One JSON line per picture: ``{"image": "photo.jpg", "top": [["cat", 0.91], ["dog", 0.07], ...]}``
(classes with their probabilities, the likeliest first). Exit 2 when the folder is no model
folder of the pipeline's, or when a picture cannot be read (named; the others are classified).

The model folder is the training's ``model/``: ``weights.pt`` (a plain state_dict of the
torchvision model ``arch``) and ``model.json`` (``arch``, ``class_names``, ``image_size``, and the
``mean`` and ``std`` the pictures were normalised with). A picture is prepared as the trainer's
validation and the evaluation step prepared theirs (``trainer.image_modes``, ``trainer.data``):

- upright (its EXIF orientation applied); transparency composited over white; 16-bit grey
  scaled from its full range (``convert("RGB")`` alone would clip it at 255); other modes
  converted by Pillow;
- its shorter side resized to ``image_size`` (bilinear, antialiased, on its 8-bit pixels), the
  centre ``image_size`` square cropped, scaled to [0, 1] and normalised.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from PIL import Image, ImageOps, UnidentifiedImageError

try:
    from torchvision import models
    from torchvision.transforms import v2
except RuntimeError as err:  # "operator torchvision::nms does not exist": another torch's build
    sys.exit(
        f"predict.py: torchvision does not load with torch {torch.__version__} ({err}): install "
        "the torchvision built for it (the same CUDA or CPU index as torch)"
    )

FORMAT_VERSION = 1
"""The ``model.json`` format this reads (the pipeline's ``trainer.export``)."""
AUX_HEADS = ("googlenet", "inception_v3")


def load_model(folder: Path) -> tuple[torch.nn.Module, dict]:
    """The model of a published model folder, in eval mode, and its ``model.json``."""
    info_file, weights_file = folder / "model.json", folder / "weights.pt"
    if not info_file.is_file() or not weights_file.is_file():
        raise ValueError(
            f"{folder} has no model.json and weights.pt: give a published model folder"
        )
    info = json.loads(info_file.read_text())
    if info.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{info_file}: format_version {info.get('format_version')!r}, not 1")
    # The pipeline trains these two without their auxiliary heads (none in weights.pt).
    no_aux = {"aux_logits": False, "init_weights": False} if info["arch"] in AUX_HEADS else {}
    model = models.get_model(info["arch"], num_classes=len(info["class_names"]), **no_aux)
    model.load_state_dict(torch.load(weights_file, map_location="cpu", weights_only=True))
    return model.eval(), info


def rgb(path: Path) -> Image.Image:
    """``path`` as an upright 8-bit RGB picture (floating-point pixels are refused, as the
    trainer refuses them: they have no one range to scale)."""
    with Image.open(path) as opened:
        image = ImageOps.exif_transpose(opened)
        image.load()
    mode = image.mode
    if mode == "RGB":
        return image
    if mode in ("RGBA", "LA", "PA", "RGBa", "La") or (mode == "P" and "transparency" in image.info):
        white = Image.new("RGBA", image.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, image.convert("RGBA")).convert("RGB")
    if mode.startswith("I;16") or mode == "I":
        return image.convert("I").point(lambda value: value / 257, mode="L").convert("RGB")
    if mode == "F":
        raise ValueError("its pixels are 32-bit floating point: save it as 8-bit RGB or grey")
    return image.convert("RGB")


def preprocessing(info: dict) -> v2.Compose:
    """The evaluation's, on the picture's 8-bit pixels (torchvision's v2 transforms: the older
    ones, or resizing the PIL picture, differ from it by one level in a pixel here and there)."""
    size = int(info["image_size"])
    return v2.Compose(
        [
            v2.PILToTensor(),
            v2.Resize(size, antialias=True),
            v2.CenterCrop(size),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(info["mean"], info["std"]),
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", type=Path, help="the published model folder")
    parser.add_argument("images", type=Path, nargs="+", help="pictures to classify")
    parser.add_argument("--top", type=int, default=3, help="classes shown a picture (default 3)")
    args = parser.parse_args(argv)
    try:
        model, info = load_model(args.model_dir)
    except (OSError, ValueError, KeyError) as err:
        print(f"predict.py: {err}", file=sys.stderr)
        return 2
    prepare, names = preprocessing(info), info["class_names"]
    top = max(1, min(args.top, len(names)))
    unreadable = 0
    for path in args.images:
        try:
            batch = prepare(rgb(path)).unsqueeze(0)
        except (OSError, UnidentifiedImageError, ValueError) as err:
            print(f"predict.py: cannot read {path}: {err}", file=sys.stderr)
            unreadable += 1
            continue
        with torch.inference_mode():
            probabilities = model(batch).softmax(dim=1)[0]
        values, indices = probabilities.topk(top)
        ranked = [
            [names[i], round(v, 6)] for v, i in zip(values.tolist(), indices.tolist(), strict=True)
        ]
        print(json.dumps({"image": str(path), "top": ranked}), flush=True)
    return 2 if unreadable else 0


if __name__ == "__main__":
    sys.exit(main())
