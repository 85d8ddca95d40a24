"""trainer/pixels.py gives torchvision's pixels, bit for bit, and a DataLoader worker that uses it
never imports torchvision (2.2 CPU-s and 85 MB less in each worker)."""

from __future__ import annotations

import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from tests.trainer.trainer_launch import REPO
from trainer import pixels
from trainer.data import _v2, augmented_tensor, eval_transform, resize_crop
from trainer.randomness import sample_augmentation

# Shapes of every kind: square, wide, tall, thin strips, odd sizes, smaller than the output.
SHAPES = ((16, 16), (37, 53), (53, 37), (375, 500), (500, 375), (5, 300), (300, 5), (9, 11))
SIZES = (8, 16, 24, 32, 224)


def _image(height: int, width: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8))


def _torchvisions_eval(size: int):
    v2 = _v2()
    return v2.Compose([v2.PILToTensor(), v2.Resize(size, antialias=True), v2.CenterCrop(size)])


@pytest.fixture(params=[True, False], ids=["native-uint8", "through-float32"])
def kernel(request, monkeypatch):
    """Both of torchvision's paths (its choice depends on the CPU): the same one on both sides."""
    _v2()  # torchvision, importable on a CPU-only torch (trainer.tv_compat)
    from torchvision.transforms.v2.functional import _geometry

    native = request.param
    monkeypatch.setattr(pixels, "_native_uint8_bilinear", lambda: native)
    monkeypatch.setattr(_geometry, "_do_native_uint8_resize_on_cpu", lambda mode: native)
    return native


def test_the_evaluation_resize_and_crop_are_torchvisions(kernel):
    for seed, (height, width) in enumerate(SHAPES):
        image = _image(height, width, seed)
        assert torch.equal(pixels.pil_to_tensor(image), _v2().functional.pil_to_tensor(image))
        for size in SIZES:
            ours, theirs = resize_crop(size)(image), _torchvisions_eval(size)(image)
            assert ours.shape == (3, size, size)
            assert torch.equal(ours, theirs), (height, width, size, kernel)


def test_the_evaluation_transform_pickles_into_spawned_workers():
    image = _image(40, 30, seed=3)
    transform = eval_transform(16)
    assert torch.equal(pickle.loads(pickle.dumps(transform))(image), transform(image))


def test_augmented_windows_are_torchvisions_crop_resize_and_flip(kernel):
    functional = _v2().functional
    for seed, (height, width) in enumerate(SHAPES):
        image = _image(height, width, seed)
        for index in range(12):
            window = sample_augmentation(seed, 1, index, height, width, "crop-flip")
            assert window is not None
            top, left, crop_height, crop_width, flip = window
            expected = functional.resized_crop(
                functional.pil_to_tensor(image),
                top,
                left,
                crop_height,
                crop_width,
                [24, 24],
                antialias=True,
            )
            if flip:
                expected = functional.horizontal_flip(expected)
            assert torch.equal(augmented_tensor(image, window, 24), expected), (height, width)


def test_a_worker_decodes_crops_and_resizes_without_importing_torchvision(image_folder):
    program = f"""
import sys
from trainer.listing import scan_split
from trainer.loader import DecodedImages
images = DecodedImages(scan_split({str(image_folder / "train")!r}), image_size=24,
                       augment="crop-flip", seed=1)
for key in ((0, 3), (1, None)):
    image, label = images[key]
    assert image.shape == (3, 24, 24), image.shape
print("torchvision" in sys.modules, "torch._dynamo" in sys.modules)
"""
    ran = subprocess.run(
        [sys.executable, "-c", program], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert ran.stdout.split() == ["False", "False"], ran.stdout
