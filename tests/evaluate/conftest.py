"""Fixtures of the evaluation tests: the hand-checkable colour model and its data."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.evaluate.colour_model import write_colour_images, write_colour_model

# true class → colours of its val images; the colour model predicts red→a, green→b, blue→c.
LAYOUT = {
    "a": ["red", "red", "green"],
    "b": ["green", "blue"],
    "c": ["blue", "red"],
    "d": ["red"],
    "e": ["green"],
    "f": ["blue"],
}


@pytest.fixture(scope="session")
def colour_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A trainer model folder (weights.pt + model.json) whose predictions are known by hand."""
    return write_colour_model(tmp_path_factory.mktemp("colour") / "model")


@pytest.fixture(scope="session")
def colour_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``data/val/<class>/*.png`` laid out as ``LAYOUT``."""
    data = tmp_path_factory.mktemp("colour-data") / "data"
    write_colour_images(data / "val", LAYOUT)
    return data
