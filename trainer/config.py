"""The trainer's one config object, :class:`TrainConfig`, and the loaders that build it.

The CLI (``trainer/train.py``), a ``--config`` file and tests all build this same dataclass; it
validates itself on construction, so a bad value fails before any process group or data loading.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from trainer.errors import ConfigError

OPTIMIZERS = ("sgd", "adamw")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
AUGMENTS = ("none", "crop", "crop-flip")
CACHE_MODES = ("auto", "always", "never")
DEVICES = ("auto", "cpu", "cuda")
DEFAULT_LR = {"sgd": 0.1, "adamw": 1e-3}
DEFAULT_WEIGHT_DECAY = {"sgd": 5e-5, "adamw": 0.05}


def flag(name: str) -> str:
    """The CLI flag of a config field (``batch_size`` → ``--batch-size``)."""
    return "--" + name.replace("_", "-")


@dataclass(kw_only=True)
class TrainConfig:
    """Everything one training run needs. Field docs double as ``--help`` text."""

    output_dir: Path
    """Where model/, metrics.jsonl, summary.json (and by default checkpoints/) go."""
    data_dir: Path | None = None
    """ImageFolder root with train/<class>/* and optionally val/<class>/* (not with --synthetic)."""
    checkpoint_dir: Path | None = None
    """Folder of step-N/ checkpoints (default: OUTPUT_DIR/checkpoints); resumes from it."""
    synthetic: bool = False
    """Train on random tensors generated on the device (throughput benchmarks)."""
    synthetic_size: int = 12800
    """Images per epoch (all ranks together) with --synthetic."""
    num_classes: int = 1000
    """Number of classes with --synthetic (real data: the class folders)."""
    model: str = "resnet18"
    """Any torchvision classification model name (torchvision.models.list_models)."""
    epochs: int = 10
    """Passes over the training data."""
    max_steps: int | None = None
    """Stop after this many optimizer steps in total (default: epochs x steps per epoch)."""
    batch_size: int = 64
    """Images per step per process (global batch = batch_size x world size)."""
    lr: float | None = None
    """Base learning rate per 256 images, scaled linearly by the global batch (default: sgd 0.1,
    adamw 0.001)."""
    optimizer: str = "sgd"
    """sgd (Nesterov momentum) or adamw."""
    momentum: float = 0.9
    """SGD momentum."""
    weight_decay: float | None = None
    """Weight decay on weights (not biases/norms) (default: sgd 5e-5, adamw 0.05)."""
    warmup_steps: int = 0
    """Linear LR warmup steps before the cosine decay."""
    label_smoothing: float = 0.0
    """Label smoothing of the cross-entropy loss, in [0, 1)."""
    grad_clip_norm: float | None = None
    """Clip the global gradient norm to this value (default: no clipping)."""
    seed: int = 0
    """Seed of every random choice (init, sampling order, augmentation, dropout)."""
    deterministic: bool = False
    """Deterministic algorithms (bit-exact reruns and resumes; slower on GPU)."""
    checkpoint_every_steps: int = 500
    """Save a checkpoint every N steps (also at the end and on SIGTERM); 0: only those."""
    keep_checkpoints: int = 3
    """Keep the newest K complete checkpoints."""
    precision: str = "auto"
    """fp32, bf16 (autocast) or fp16 (autocast + GradScaler); auto: bf16 on CUDA, fp32 on CPU."""
    channels_last: bool = False
    """Use the channels_last memory format (faster convolutions on tensor cores)."""
    compile: bool = False
    """torch.compile the model."""
    num_workers: int | None = None
    """DataLoader workers per process (default: 0 on CPU, a share of the cores on GPU)."""
    image_size: int = 224
    """Square input size; images are resized (shorter side) and centre-cropped to it."""
    augment: str = "crop-flip"
    """Training augmentation: none, crop (random crop) or crop-flip (+ horizontal flip)."""
    cache_images: str = "auto"
    """Decode the data set once into memory: auto (if it fits in 512 MiB), always, never."""
    val_fraction: float = 0.1
    """Share of each class held out for validation when DATA_DIR has no val/ folder."""
    val_batch_size: int | None = None
    """Validation batch size per process (default: 2 x batch size)."""
    log_interval: int = 50
    """Log a progress line and a metrics.jsonl record every N steps."""
    device: str = "auto"
    """auto (CUDA if available), cpu or cuda."""
    dist_timeout_s: float = 1800.0
    """Timeout (seconds) for process-group init and collectives."""

    def __post_init__(self) -> None:
        _coerce_types(self)
        if self.checkpoint_dir is None:
            self.checkpoint_dir = self.output_dir / "checkpoints"
        if self.synthetic == (self.data_dir is not None):
            raise ConfigError(
                f"--data-dir {self.data_dir} / --synthetic {self.synthetic}: give exactly one, "
                "a data folder or --synthetic"
            )
        _choice(self, "optimizer", OPTIMIZERS)
        _choice(self, "precision", PRECISIONS)
        _choice(self, "augment", AUGMENTS)
        _choice(self, "cache_images", CACHE_MODES)
        _choice(self, "device", DEVICES)
        for name in ("epochs", "batch_size", "image_size", "log_interval", "keep_checkpoints"):
            _at_least(self, name, 1)
        for name in ("synthetic_size", "num_classes"):
            _at_least(self, name, 2 if name == "num_classes" else 1)
        for name in ("warmup_steps", "checkpoint_every_steps", "seed"):
            _at_least(self, name, 0)
        for name in ("max_steps", "val_batch_size"):
            if getattr(self, name) is not None:
                _at_least(self, name, 1)
        if self.num_workers is not None:
            _at_least(self, "num_workers", 0)
        if self.lr is None:
            self.lr = DEFAULT_LR[self.optimizer]
        if self.weight_decay is None:
            self.weight_decay = DEFAULT_WEIGHT_DECAY[self.optimizer]
        _in_range(self, "lr", 0.0, None, "a positive number", open_low=True)
        _in_range(self, "weight_decay", 0.0, None, "a number >= 0")
        _in_range(self, "momentum", 0.0, 1.0, "a number in [0, 1)", open_high=True)
        _in_range(self, "label_smoothing", 0.0, 1.0, "a number in [0, 1)", open_high=True)
        _in_range(
            self, "val_fraction", 0.0, 1.0, "a number in (0, 1)", open_low=True, open_high=True
        )
        _in_range(self, "dist_timeout_s", 0.0, None, "a positive number of seconds", open_low=True)
        if self.grad_clip_norm is not None:
            _in_range(self, "grad_clip_norm", 0.0, None, "a positive number", open_low=True)
        from trainer.models import classification_models

        if self.model not in classification_models():
            raise ConfigError(
                f"--model {self.model!r} is not a torchvision classification model; allowed: "
                + ", ".join(classification_models())
            )
        if self.data_dir is not None and not self.data_dir.is_dir():
            raise ConfigError(
                f"--data-dir {self.data_dir} is not a folder; expected DATA/train/<class>/*"
            )

    @property
    def base_lr(self) -> float:
        return float(self.lr)  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON/YAML-able values (paths as strings)."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = str(value) if isinstance(value, Path) else value
        return out


TRAJECTORY_SETTINGS = (
    "optimizer",
    "lr",
    "momentum",
    "weight_decay",
    "warmup_steps",
    "label_smoothing",
    "grad_clip_norm",
    "image_size",
    "augment",
    "val_fraction",
)
"""Settings that change what every step does: a checkpoint resumes only under the same values.
The run's length (--epochs, --max-steps) may change, to extend or shorten a run, and so may the
world size and batch size (the epoch then restarts from its first batch)."""


# --------------------------------------------------------------------------------- validation
def _choice(cfg: TrainConfig, name: str, allowed: tuple[str, ...]) -> None:
    value = getattr(cfg, name)
    if value not in allowed:
        choices = ", ".join(allowed)
        raise ConfigError(f"{flag(name)} {value!r} is not allowed; use one of: {choices}")


def _at_least(cfg: TrainConfig, name: str, minimum: int) -> None:
    value = getattr(cfg, name)
    if value < minimum:
        raise ConfigError(f"{flag(name)} {value!r} is too small; use an integer >= {minimum}")


def _in_range(
    cfg: TrainConfig,
    name: str,
    low: float,
    high: float | None,
    allowed: str,
    *,
    open_low: bool = False,
    open_high: bool = False,
) -> None:
    value = getattr(cfg, name)
    too_low = value <= low if open_low else value < low
    too_high = high is not None and (value >= high if open_high else value > high)
    if too_low or too_high or value != value:  # value != value: NaN
        raise ConfigError(f"{flag(name)} {value!r} is out of range; it must be {allowed}")


def _field_types() -> dict[str, Any]:
    return typing.get_type_hints(TrainConfig)


def _coerce_types(cfg: TrainConfig) -> None:
    """Convert file/CLI values to the annotated types; reject values of the wrong kind."""
    for name, annotation in _field_types().items():
        value = getattr(cfg, name)
        setattr(cfg, name, _coerce(name, value, annotation))


def _coerce(name: str, value: Any, annotation: Any) -> Any:
    optional = False
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        optional = len(args) < len(typing.get_args(annotation))
        annotation = args[0]
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{flag(name)} is required")
    wanted = typing.get_origin(annotation) or annotation
    if wanted is Path:
        if isinstance(value, str | Path) and str(value):
            return Path(value)
    elif wanted is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
    elif wanted is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
    elif wanted is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
    elif wanted is str:
        if isinstance(value, str):
            return value
    else:  # pragma: no cover - every field type is handled above
        return value
    kind = getattr(wanted, "__name__", str(wanted))
    raise ConfigError(f"{flag(name)} {value!r} is not a valid {kind}")


# ------------------------------------------------------------------------------------ loading
def field_names() -> list[str]:
    return [f.name for f in dataclasses.fields(TrainConfig)]


def load_config_file(path: Path) -> dict[str, Any]:
    """Read a YAML or JSON mapping of config fields (``batch_size`` or ``batch-size`` keys)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise ConfigError(f"--config {path}: cannot read the file ({err})") from err
    try:
        data = json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as err:
        raise ConfigError(f"--config {path}: not valid JSON/YAML ({err})") from err
    if data is None:
        return {}
    if not isinstance(data, dict):
        kind = type(data).__name__
        raise ConfigError(f"--config {path}: expected a mapping of settings, got a {kind}")
    known = set(field_names())
    out = {}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        if name not in known:
            raise ConfigError(
                f"--config {path}: unknown setting {key!r}; known settings: "
                + ", ".join(sorted(known))
            )
        out[name] = value
    return out


def config_from(
    file_values: dict[str, Any] | None = None, overrides: dict[str, Any] | None = None
) -> TrainConfig:
    """Build a :class:`TrainConfig` from a config file's values overridden by CLI values."""
    merged = dict(file_values or {}) | dict(overrides or {})
    if "output_dir" not in merged:
        raise ConfigError("--output-dir is required (on the command line or in the config file)")
    try:
        return TrainConfig(**merged)
    except TypeError as err:  # unknown keyword (only reachable from Python callers)
        raise ConfigError(str(err)) from err


def field_docs() -> dict[str, str]:
    """The attribute docstrings of :class:`TrainConfig` (used as ``--help`` text)."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(TrainConfig))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs = {}
    for node, following in zip(body, body[1:], strict=False):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[node.target.id] = " ".join(following.value.value.split())
    return docs
