"""The image runs the torch the tests ran, and can compile (Triton needs a C compiler)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _default_base_image() -> str:
    match = re.search(r"^ARG BASE_IMAGE=(\S+)$", (REPO / "Dockerfile").read_text(), re.M)
    assert match, "Dockerfile: no `ARG BASE_IMAGE=<image>` default"
    return match.group(1)


def test_the_base_images_torch_is_the_pinned_torch():
    image = _default_base_image()
    match = re.fullmatch(r"pytorch/pytorch:(\d+\.\d+\.\d+)-cuda(\d+\.\d+)-cudnn\d+-runtime", image)
    assert match, f"BASE_IMAGE {image}: expected pytorch/pytorch:<torch>-cuda<x.y>-cudnn<n>-runtime"
    pins = re.findall(r"^torch==(\S+)$", (REPO / "constraints.txt").read_text(), re.M)
    assert len(pins) == 1, "constraints.txt: expected exactly one torch== pin"
    assert match.group(1) == pins[0], (
        f"Dockerfile BASE_IMAGE has torch {match.group(1)}, constraints.txt pins torch=={pins[0]}: "
        "move both together"
    )


def test_the_image_has_a_c_compiler_for_triton_and_keeps_the_shared_package():
    text = (REPO / "Dockerfile").read_text()
    assert re.search(r"apt-get install[^\n]*\bgcc\b", text)
    assert "COPY kfp_ddp ./kfp_ddp" in text
