"""What a model's shapes allow, found on the meta device (trainer.model_shapes): the image sizes
torchvision's models take, told before a node trains (the trainer's exit 2:
tests/trainer/test_train_config.py; the check step: tests/pipelines/test_late_checks.py); RegNet
built there too."""

from __future__ import annotations

import pytest
import torch

from trainer.model_shapes import batch_size_problem, build_on_meta, image_size_problem


@pytest.mark.parametrize(
    ("arch", "size", "fix"),
    [
        ("alexnet", 32, "use --image-size 63 or more"),  # its pooling leaves nothing below 63
        ("squeezenet1_0", 16, "use --image-size 21 or more"),
        ("vit_b_16", 128, "use --image-size 224, the size torchvision builds it for"),
    ],
)
def test_a_size_the_model_cannot_take_is_named_with_the_one_to_use(arch, size, fix):
    problem = image_size_problem(arch, size)
    assert problem is not None
    assert problem.startswith(f"--image-size {size} does not fit --model {arch} (")
    assert problem.endswith(fix)


@pytest.mark.parametrize(("arch", "size"), [("resnet18", 16), ("alexnet", 63), ("vit_b_16", 224)])
def test_a_size_the_model_takes_passes(arch, size):
    assert image_size_problem(arch, size) is None


def test_a_batch_of_one_is_refused_where_batchnorm_would_see_one_value_a_channel():
    """At 32 px ResNet-18's last BatchNorm sees 1x1 maps: a batch of one image gives it one
    value a channel, which it refuses in training (at step 1 of every rank, it did)."""
    problem = batch_size_problem("resnet18", 32, 1)
    assert problem is not None
    assert problem.startswith("--batch-size 1 does not fit --model resnet18 at --image-size 32 (")
    assert "Expected more than 1 value per channel" in problem
    assert problem.endswith("use --batch-size 2 or more")
    assert batch_size_problem("resnet18", 32, 2) is None
    assert batch_size_problem("resnet18", 224, 1) is None  # 7x7 maps: 49 values a channel
    assert batch_size_problem("alexnet", 64, 1) is None  # no BatchNorm
    assert batch_size_problem("alexnet", 32, 1) is None  # the size is the problem, said so


def test_regnet_is_built_on_the_meta_device_too():
    """RegNet's builder computes its widths with tensors, which the meta device cannot: its
    parameters go to the meta device as they are registered, and nothing else is left there."""
    model = build_on_meta("regnet_y_400mf", 5)
    assert {p.device.type for p in model.parameters()} == {"meta"}
    assert model.fc.out_features == 5
    assert image_size_problem("regnet_y_400mf", 32) is None
    assert torch.nn.Linear(2, 2).weight.device.type == "cpu"  # registration restored
