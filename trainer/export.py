"""The trained-model folder: ``weights.pt`` (plain state_dict) and ``model.json``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from kfp_ddp.atomic_files import torch_save_atomic, write_json_atomic
from trainer.models import build_model

FORMAT_VERSION = 1
WEIGHTS_FILE = "weights.pt"
CONFIG_FILE = "model.json"


def save_model(
    model_dir: Path,
    state_dict: dict[str, torch.Tensor],
    *,
    arch: str,
    class_names: list[str],
    image_size: int,
    mean: list[float],
    std: list[float],
    starting_weights: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Write the model folder atomically (weights first, ``model.json`` last); return the json."""
    model_dir = Path(model_dir)
    weights = {name: tensor.detach().to("cpu").clone() for name, tensor in state_dict.items()}
    torch_save_atomic(weights, model_dir / WEIGHTS_FILE)
    info = {
        "format_version": FORMAT_VERSION,
        "arch": arch,
        "num_classes": len(class_names),
        "class_names": list(class_names),
        "image_size": image_size,
        "mean": [float(v) for v in mean],
        "std": [float(v) for v in std],
        "starting_weights": starting_weights,
    }
    write_json_atomic(model_dir / CONFIG_FILE, info)
    return info


def load_model(
    model_dir: Path | str, *, map_location: str | torch.device = "cpu"
) -> tuple[torch.nn.Module, dict[str, Any]]:
    """The model of a model folder with its weights loaded, in eval mode, and its ``model.json``."""
    model_dir = Path(model_dir)
    config_path = model_dir / CONFIG_FILE
    if not config_path.is_file():
        raise FileNotFoundError(f"{config_path} not found: {model_dir} is not a model folder")
    info = json.loads(config_path.read_text())
    if info.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"{config_path}: format_version {info.get('format_version')!r} is not supported "
            f"(expected {FORMAT_VERSION})"
        )
    model = build_model(info["arch"], int(info["num_classes"]))
    state = torch.load(model_dir / WEIGHTS_FILE, map_location=map_location, weights_only=True)
    model.load_state_dict(state)
    model.to(map_location)
    model.eval()
    return model, info
