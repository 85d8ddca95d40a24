"""The models the trainer builds keep their BatchNorm running statistics up with a short run:
torchvision builds MobileNetV3 (0.01) and MNASNet (0.0003) with a momentum meant for hundreds of
epochs; the trainer raises it to PyTorch's 0.1 and leaves higher ones alone."""

from __future__ import annotations

import pytest
import torch

from trainer.models import BATCHNORM_MOMENTUM, build_model
from trainer.tv_compat import import_torchvision


def _momenta(model: torch.nn.Module) -> set[float]:
    found = (m.momentum for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d))
    return {round(momentum, 6) for momentum in found if momentum is not None}


@pytest.mark.parametrize(
    ("arch", "torchvision_momenta"),
    [
        ("mobilenet_v3_small", {0.01}),
        ("mnasnet0_5", {0.0003}),
        ("resnet18", {0.1}),
    ],
)
def test_build_model_raises_a_batchnorm_momentum_below_pytorchs_default(arch, torchvision_momenta):
    with torch.device("meta"):
        theirs = import_torchvision().models.get_model(arch, weights=None, num_classes=10)
        ours = build_model(arch, num_classes=10)
    assert _momenta(theirs) == torchvision_momenta  # what the fix is for: still torchvision's
    assert _momenta(ours) == {BATCHNORM_MOMENTUM} == {0.1}
