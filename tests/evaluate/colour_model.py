"""A real torchvision ResNet-18 whose predictions are known by hand: it reads an image's colour.

Every convolution is zeroed except the stem and the downsample shortcuts, which pass channel c
through unchanged (centre tap 1); every BatchNorm is the identity. Each residual block then
returns its input, so for a uniformly coloured image the pooled features are the normalised
colour after ReLU: pure red → (1, 0, 0, 0, …) with mean = std = 0.5. The classifier maps feature
c to class c and adds ``BIAS``, so

    logits(red)   = [1, -0.01, -0.02, 0.5, 0.4, 0.3]   → class 0, top-5 misses class 2
    logits(green) = [0,  0.99, -0.02, 0.5, 0.4, 0.3]   → class 1, top-5 misses class 2
    logits(blue)  = [0, -0.01,  0.98, 0.5, 0.4, 0.3]   → class 2, top-5 misses class 1
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

from trainer.export import save_model
from trainer.models import build_model

CLASSES = ("a", "b", "c", "d", "e", "f")
BIAS = (0.0, -0.01, -0.02, 0.5, 0.4, 0.3)
COLOURS = {"red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255)}
FEATURE = {"red": 0, "green": 1, "blue": 2}


def hand_logits(colour: str) -> list[float]:
    """The logits the colour model gives an image of ``colour``, written out by hand."""
    return [b + (1.0 if c == FEATURE[colour] else 0.0) for c, b in enumerate(BIAS)]


def write_colour_model(
    model_dir: Path, class_names: tuple[str, ...] = CLASSES, *, image_size: int = 16
) -> Path:
    """Save the colour-reading ResNet-18 as a trainer model folder (weights.pt + model.json)."""
    assert len(class_names) == len(BIAS)
    model = build_model("resnet18", len(class_names))
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Conv2d):
                module.weight.zero_()
                if name == "conv1" or name.endswith("downsample.0"):
                    kh, kw = module.kernel_size
                    for c in range(min(module.in_channels, module.out_channels)):
                        module.weight[c, c, kh // 2, kw // 2] = 1.0
            elif isinstance(module, torch.nn.BatchNorm2d):
                module.weight.fill_(1.0)
                module.bias.zero_()
                module.running_mean.zero_()
                module.running_var.fill_(1.0 - module.eps)
            elif isinstance(module, torch.nn.Linear):
                module.weight.zero_()
                module.bias.copy_(torch.tensor(BIAS))
                for c in range(3):
                    module.weight[c, c] = 1.0
    save_model(
        model_dir,
        model.state_dict(),
        arch="resnet18",
        class_names=list(class_names),
        image_size=image_size,
        mean=[0.5, 0.5, 0.5],
        std=[0.5, 0.5, 0.5],
    )
    return model_dir


def write_colour_images(split_dir: Path, layout: dict[str, list[str]], *, size: int = 8) -> Path:
    """``split_dir/<class>/<i>-<colour>.png``: uniformly coloured images, as ``layout`` says."""
    for class_name, colours in layout.items():
        folder = split_dir / class_name
        folder.mkdir(parents=True, exist_ok=True)
        for i, colour in enumerate(colours):
            pixels = np.broadcast_to(np.uint8(COLOURS[colour]), (size, size, 3))
            Image.fromarray(np.ascontiguousarray(pixels)).save(folder / f"{i:02d}-{colour}.png")
    return split_dir
