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


def build_model(arch: str, num_classes: int) -> torch.nn.Module:
    """A randomly initialised torchvision classification model ``arch`` with ``num_classes``."""
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
    return tv.models.get_model(arch, **kwargs)
