"""What a model's shapes allow, found without its memory: the model built on the meta device.

- ``head_parameter_names``: the classifier head's parameters (those that follow the classes).
- ``image_size_problem``: why a model cannot take images of a size, and the size to use, before
  anything starts (the pipeline's check step, and each trainer before it meets the others).
  torchvision's models take different sizes: inception_v3 75 px or more, alexnet 63, vgg 32,
  the ViTs exactly the 224 they are built for; a wrong one used to fail in the first training
  step, with a shape error, once every node had started.
- ``batch_size_problem``: the same for a batch of one image, which the BatchNorm layers of most
  models refuse in training at small sizes (it failed at step 1, a traceback on every rank).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch

from trainer.errors import ConfigError
from trainer.models import build_model

LARGEST_SIDE = 1024
"""The largest image side searched for the smallest one a model takes."""
BUILT_SIDE = 224
"""The side torchvision builds a model for when the model fixes it (the ViTs, MaxViT)."""
META_BATCH = 2
"""The batch of the probe's forward pass: BatchNorm in training needs two values a channel."""


def build_on_meta(arch: str, num_classes: int) -> torch.nn.Module:
    """``arch`` with its parameters and buffers on the meta device: shapes, no memory.

    Most builders run whole under ``torch.device("meta")``. RegNet's works out its widths with
    tensor arithmetic (``.tolist()``), which meta tensors cannot answer: it runs on the CPU, each
    parameter and buffer moved to the meta device as a module registers it.
    """
    try:
        with torch.device("meta"):
            return build_model(arch, num_classes)
    except NotImplementedError:
        with _registered_on_meta():
            return build_model(arch, num_classes)


@contextlib.contextmanager
def _registered_on_meta() -> Iterator[None]:
    """Every parameter and buffer a module registers goes to the meta device (for the whole
    process while it lasts: a model built in another thread meanwhile would be empty too)."""
    module = torch.nn.Module
    register_parameter, register_buffer = module.register_parameter, module.register_buffer

    def on_meta_parameter(self, name, param):
        if param is not None:
            param = torch.nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register_parameter(self, name, param)

    def on_meta_buffer(self, name, tensor, persistent=True):
        register_buffer(self, name, None if tensor is None else tensor.to("meta"), persistent)

    module.register_parameter = on_meta_parameter  # type: ignore[method-assign]
    module.register_buffer = on_meta_buffer  # type: ignore[method-assign]
    try:
        yield
    finally:
        module.register_parameter = register_parameter  # type: ignore[method-assign]
        module.register_buffer = register_buffer  # type: ignore[method-assign]


def head_parameter_names(arch: str, num_classes: int) -> set[str]:
    """The names of the classifier head's parameters: those whose shape follows the number of
    classes (the model built twice on the meta device, with one class more; nothing allocated)."""
    params = dict(build_on_meta(arch, num_classes).named_parameters())
    more = dict(build_on_meta(arch, num_classes + 1).named_parameters())
    return {name for name, param in params.items() if param.shape != more[name].shape}


@functools.lru_cache(maxsize=256)
def image_size_problem(arch: str, image_size: int) -> str | None:
    """Why ``arch`` cannot train on images of ``image_size`` px, and what to use instead (None:
    it can, or the meta device cannot tell). Found once per process for each pair (the model's
    forward passes on the meta device take 0.05-0.2 s of CPU, a size search some more)."""
    model = build_on_meta(arch, 2).train()
    failure = _forward_failure(model, image_size)
    if failure is None:
        return None
    if _forward_failure(model, LARGEST_SIDE) is None:
        fix = f"use --image-size {_smallest_side(model, image_size)} or more"
    elif _forward_failure(model, BUILT_SIDE) is None:
        fix = f"use --image-size {BUILT_SIDE}, the size torchvision builds it for"
    else:
        fix = "choose another --model or --image-size"
    return f"--image-size {image_size} does not fit --model {arch} ({failure}); {fix}"


@functools.lru_cache(maxsize=256)
def batch_size_problem(arch: str, image_size: int, batch_size: int) -> str | None:
    """Why ``arch`` cannot train on batches of ``batch_size`` images of ``image_size`` px (None:
    it can, or the meta device cannot tell). Only a batch of one can fail where two pass: a
    BatchNorm layer that sees a 1x1 map (or a vector) then has one value a channel, which it
    refuses in training, at step 1 of every rank (a batch of one is never the last one of an
    epoch: the trainer drops a short last batch)."""
    if batch_size != 1:
        return None
    model = build_on_meta(arch, 2).train()
    failure = _forward_failure(model, image_size, batch=1)
    if failure is None or _forward_failure(model, image_size) is not None:
        return None  # a batch of 2 fails too: the image size is the problem, named by its check
    return (
        f"--batch-size 1 does not fit --model {arch} at --image-size {image_size} ({failure}): "
        "its BatchNorm layers need 2 or more images a batch in training; use --batch-size 2 "
        "or more"
    )


def model_input_problem(arch: str, image_size: int, batch_size: int) -> tuple[str, str] | None:
    """The setting (``image_size`` or ``batch_size``) that keeps ``arch`` from training on
    batches of ``batch_size`` images of ``image_size`` px, and why; None when it can."""
    problem = image_size_problem(arch, image_size)
    if problem is not None:
        return "image_size", problem
    problem = batch_size_problem(arch, image_size, batch_size)
    if problem is not None:
        return "batch_size", problem
    return None


def check_model_input(arch: str, image_size: int, batch_size: int) -> None:
    """Raise ConfigError (exit 2, not retried) when ``arch`` cannot train on ``image_size`` px
    images in batches of ``batch_size``."""
    found = model_input_problem(arch, image_size, batch_size)
    if found is not None:
        raise ConfigError(found[1])


def _forward_failure(model: torch.nn.Module, side: int, *, batch: int = META_BATCH) -> str | None:
    """The first line of what a training forward pass on a batch of ``side`` px images raises
    (None: it passes, or an operator has no meta kernel to tell)."""
    images = torch.empty(batch, 3, side, side, device="meta")
    try:
        with torch.no_grad():
            model(images)
    except NotImplementedError:
        return None
    except (RuntimeError, ValueError, AssertionError) as exc:
        said = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return said[:200]
    return None


def _smallest_side(model: torch.nn.Module, failing: int) -> int:
    """The smallest side above ``failing`` the model takes, ``LARGEST_SIDE`` taking it."""
    low, high = failing, LARGEST_SIDE
    while high - low > 1:
        middle = (low + high) // 2
        if _forward_failure(model, middle) is None:
            high = middle
        else:
            low = middle
    return high
