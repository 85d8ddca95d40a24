"""Model construction by torchvision name."""

from __future__ import annotations

import functools

import torch

from trainer.errors import ConfigError
from trainer.tv_compat import import_torchvision

# Models whose training-mode forward returns auxiliary outputs unless told otherwise.
_NO_AUX_LOGITS = {"googlenet", "inception_v3"}


@functools.cache
def classification_models() -> tuple[str, ...]:
    """Names of torchvision's image-classification models (``torchvision.models.list_models``)."""
    tv = import_torchvision()
    return tuple(sorted(tv.models.list_models(module=tv.models)))


MODEL_NAMES_TEMPLATE = '''\
"""Written by ``python -m pipelines.generate`` (``make generate``) from torchvision's model
registry, ``trainer.models.classification_models()``: do not edit.

The names ``--model`` takes, without importing torchvision (seconds): the pipeline's check
step and the trainer's config check read them here; the trainer builds the model through
torchvision's registry itself, and a test keeps this list equal to it.
"""

CLASSIFICATION_MODELS: tuple[str, ...] = (
{names})
'''
"""The text of ``trainer/model_names.py``, but for its names."""


def model_names_source() -> str:
    """The text of ``trainer/model_names.py``: :func:`classification_models`, written out."""
    names = "".join(f'    "{name}",\n' for name in classification_models())
    return MODEL_NAMES_TEMPLATE.format(names=names)


BATCHNORM_MOMENTUM = 0.1
"""The least running-statistics momentum of the models' BatchNorm layers (PyTorch's default).
torchvision builds some with less, for reference recipes of hundreds of epochs (MobileNetV3,
EfficientNet-B5/B6: 0.01; MNASNet: 0.0003). In a run of a few hundred steps their running
statistics, which evaluation uses, lag far behind the weights: mobilenet_v3_small trained for 2
epochs on Fashion-MNIST evaluated at chance (0.100), and at 0.703 with its statistics recomputed
over 31 training batches."""
_BATCHNORMS = (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d, torch.nn.BatchNorm3d)


def _batchnorm_keeps_up(model: torch.nn.Module) -> torch.nn.Module:
    for module in model.modules():
        momentum = getattr(module, "momentum", None)
        if isinstance(module, _BATCHNORMS) and momentum is not None:
            module.momentum = max(momentum, BATCHNORM_MOMENTUM)
    return model


def build_model(arch: str, num_classes: int) -> torch.nn.Module:
    """A randomly initialised torchvision classification model ``arch`` with ``num_classes``,
    its BatchNorm momentum at least ``BATCHNORM_MOMENTUM``."""
    if arch not in classification_models():
        raise ConfigError(
            f"--model {arch!r} is not a torchvision classification model; allowed: "
            + ", ".join(classification_models())
        )
    if not isinstance(num_classes, int) or num_classes < 2:
        raise ConfigError(f"num_classes must be an integer >= 2, got {num_classes!r}")
    tv = import_torchvision()
    kwargs: dict = {"weights": None, "num_classes": num_classes}
    if arch in _NO_AUX_LOGITS:
        kwargs.update(aux_logits=False, init_weights=True)
    return _batchnorm_keeps_up(tv.models.get_model(arch, **kwargs))
