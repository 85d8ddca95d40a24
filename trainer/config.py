"""The trainer's one config object, :class:`TrainConfig`, and the loaders that build it.

The CLI (``trainer/train.py``), a ``--config`` file and tests all build this same dataclass; it
validates itself on construction, so a bad value fails before any process group or data loading.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kfp_ddp import field_docs as docstrings
from kfp_ddp.s3_uri import s3_uri_problem
from trainer.errors import ConfigError
from trainer.model_names import CLASSIFICATION_MODELS

OPTIMIZERS = ("sgd", "adamw")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
AUGMENTS = ("auto", "none", "crop", "crop-flip")
CACHE_MODES = ("auto", "always", "never")
DEVICES = ("auto", "cpu", "cuda")
DECODES = ("auto", "cpu", "gpu")
GRAD_COMPRESSIONS = ("none", "bf16", "fp16")
DEFAULT_LR = {"sgd": 0.1, "adamw": 1e-3}
DEFAULT_WEIGHT_DECAY = {"sgd": 5e-5, "adamw": 0.05}


# Warm-up when the LR is scaled up (global batch > 256, Goyal et al. 2017): 5 epochs' worth, at
# most WARMUP_MAX_STEPS and a tenth of the run.
WARMUP_EPOCHS = 5
WARMUP_MAX_STEPS = 2000


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
    init_from: str = ""
    """Where the weights start: '' random; imagenet (torchvision's pretrained weights for --model,
    from its cache in TORCH_HOME or downloaded); an s3:// model folder (weights.pt + model.json)
    or an s3://.../file.pt state dict; in the pipeline also latest (the model last published
    under publish_uri; none yet: random). Another number of classes gets a new classifier head."""
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
    head_epochs: int = 0
    """With --init-from: train only the classifier head for the first N epochs (the rest of
    the model keeps its starting weights, the head learns from them), then the whole model; 0:
    the whole model from the first step."""
    warmup_steps: int | None = None
    """Linear LR warm-up steps before the cosine decay (default: when the LR is scaled up, i.e. a
    global batch over 256, 5 epochs' worth, at most 2000 steps and a tenth of the run; else 0);
    0 switches it off."""
    label_smoothing: float = 0.0
    """Label smoothing of the cross-entropy loss, in [0, 1)."""
    grad_clip_norm: float | None = None
    """Clip the global gradient norm to this value (default: no clipping)."""
    seed: int = 0
    """Seed of every random choice (init, sampling order, augmentation, dropout)."""
    deterministic: bool = False
    """Deterministic algorithms (bit-exact reruns and resumes; slower on GPU)."""
    skip_bad_images: bool = False
    """Train without the images that cannot be read (named in the run log and in summary.json's
    skipped_images); default: stop before step 1, listing every one of them."""
    checkpoint_every_steps: int = 500
    """Save a checkpoint every N steps (also at the end and on SIGTERM); 0: only those."""
    keep_checkpoints: int = 3
    """Keep the newest K complete checkpoints (older ones are deleted once a write completes)."""
    checkpoint_uri: str | None = None
    """s3://bucket/prefix to mirror the checkpoints to (default: none, local only). Rank 0 uploads
    each complete step-N/ in the background (its COMPLETE marker last; the newest
    --keep-checkpoints kept there too), and a start resumes from the newest complete checkpoint
    here or in --checkpoint-dir, downloading it if need be. Credentials, endpoint and region come
    from the standard AWS environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
    AWS_ENDPOINT_URL_S3, AWS_DEFAULT_REGION, ...)."""
    checkpoint_upload_timeout_s: float = 60.0
    """With --checkpoint-uri: how long the end of the run and a SIGTERM wait for the last
    checkpoint to be complete in S3 (keep it well inside the pod's termination grace period), and
    how long a start keeps retrying an S3 endpoint that does not answer."""
    stop_check_every_steps: int = 10
    """Steps between the all-ranks check for a SIGTERM (and a failed checkpoint write): one small
    all-reduce over gloo, a host barrier across nodes. Lower it when a step takes seconds, so a
    SIGTERM is acted on well within the pod's grace period."""
    precision: str = "auto"
    """fp32, bf16 (autocast) or fp16 (autocast + GradScaler); auto: bf16 on CUDA, fp32 on CPU."""
    channels_last: bool | None = None
    """The channels_last memory format: faster convolutions on tensor cores (default: on with
    CUDA; off on the CPU, where it measured ~10x slower)."""
    compile: bool | None = None
    """torch.compile the model (default: on with CUDA, 1.42x ResNet-50's training rate on an
    H100; off on the CPU, where compiling costs more than it saves in short runs). The first
    compile took ~40 s there, a second one of the same model and batch ~2 s: Inductor keeps its
    work in TORCHINDUCTOR_CACHE_DIR (default: a folder in the temporary directory); point it at
    a volume that outlives the pod to keep it across runs."""
    num_workers: int | None = None
    """DataLoader workers per process (default: 0 on CPU, a share of the cores on GPU)."""
    image_size: int = 224
    """Square input size; images are resized (shorter side) and centre-cropped to it. 224 is
    the size torchvision's ImageNet weights were trained at; smaller is faster and less accurate,
    even for small pictures (README, Performance: Recipes)."""
    augment: str = "auto"
    """Training augmentation: none, crop (random crop), crop-flip (+ horizontal flip), or auto:
    crop-flip unless a mirror changes the classes (digits, letters, signs), judged before step 1
    by a probe of the training images (trainer.mirror_probe), else crop."""
    cache_images: str = "auto"
    """Decode the data set once into memory: auto (if it fits in 512 MiB), always, never."""
    decode: str = "auto"
    """Where streamed JPEGs are decoded: cpu (DataLoader workers, PIL), gpu (workers read bytes,
    nvJPEG decodes and crops on the GPU), auto (gpu on a CUDA device that can, else cpu)."""
    val_fraction: float = 0.1
    """Share of each class held out for validation when DATA_DIR has no val/ folder."""
    val_batch_size: int | None = None
    """Validation batch size per process (default: 2 x batch size)."""
    log_interval: int = 50
    """Log a progress line and a metrics.jsonl record every N steps."""
    device: str = "auto"
    """auto (CUDA if it starts; if the container was given GPUs but CUDA fails, exit 2 naming
    the driver/CUDA mismatch instead of training on the CPU), cpu, or cuda (exit 2 without
    CUDA)."""
    init_timeout_s: float = 1800.0
    """Start-up timeout (seconds): how long ranks wait for each other to join the job (node and
    image start-up) and for the resume broadcast."""
    collective_timeout_s: float = 600.0
    """Timeout (seconds) of each collective once training runs (set after the first step): a hung
    or lost peer fails the job after this, not after the start-up timeout. On CUDA, NCCL's
    flight recorder then dumps its trace to OUTPUT_DIR/nccl_trace_rank_N."""
    grad_compression: str = "none"
    """Gradient all-reduce in bf16 or fp16 (a DDP comm hook: half the bytes on the network, for
    TCP clusters; bf16 needs CUDA/NCCL); none: fp32."""
    output_uri: str | None = None
    """s3://bucket/prefix: at the end rank 0 uploads the model, metrics.jsonl, the TensorBoard
    files and, last, summary.json there (for nodes that share no volume with whoever reads the
    model). Endpoint and keys from the standard AWS environment."""
    metrics_port: int = 0
    """Serve Prometheus metrics over HTTP on this port (local rank k on PORT + k): step, loss,
    images/s, data wait, seconds since the last step (for hang alerts), ...; 0: off (then
    prometheus_client is not imported)."""
    metrics_job: str = ""
    """The job label of the metrics; the launcher sets the training job's name (default: the
    output folder's name)."""
    tensorboard_dir: str | None = None
    """Folder of TensorBoard event files, written by rank 0 (default: OUTPUT_DIR/tensorboard,
    uploaded with --output-uri); none: no event files."""
    progress_report_interval_s: float = 30.0
    """Where Kubeflow Trainer asks for progress reports (its TrainJobStatus feature gate sets
    KUBEFLOW_TRAINER_SERVER_URL in the pod), rank 0 sends progress %, ETA, loss, accuracy and
    images/s to the TrainJob's status.trainerStatus at most every this many seconds (at least 1;
    Kubeflow's own clients use 5), and a final report at the end; 0: never."""
    progress_report_timeout_s: float = 5.0
    """Timeout (seconds) of each step of a progress report (connect, TLS, answer); the end of the
    run waits for the final report at most this long after a report in flight."""

    def __post_init__(self) -> None:
        _coerce_types(self)
        if self.checkpoint_dir is None:
            self.checkpoint_dir = self.output_dir / "checkpoints"
        if self.tensorboard_dir is None:
            self.tensorboard_dir = str(self.output_dir / "tensorboard")
        elif self.tensorboard_dir.strip().lower() in ("", "none"):
            self.tensorboard_dir = "none"
        if self.synthetic == (self.data_dir is not None):
            raise ConfigError(
                f"--data-dir {self.data_dir} / --synthetic {self.synthetic}: give exactly one, "
                "a data folder or --synthetic"
            )
        if self.lr is None:
            self.lr = DEFAULT_LR.get(self.optimizer)
        if self.weight_decay is None:
            self.weight_decay = DEFAULT_WEIGHT_DECAY.get(self.optimizer)
        _check_choices(self)
        _check_counts(self)
        _check_ranges(self)
        _check_model_and_paths(self)
        _check_checkpoint_uri(self)
        _check_output_uri(self)

    @property
    def tensorboard_path(self) -> Path | None:
        """Where rank 0 writes TensorBoard event files (None: switched off)."""
        if self.tensorboard_dir in (None, "none"):
            return None
        return Path(self.tensorboard_dir)

    @property
    def metrics_job_label(self) -> str:
        """The ``job`` label of the metrics: --metrics-job, else the output folder's name."""
        return self.metrics_job or self.output_dir.resolve().name

    @property
    def checkpoint_folder(self) -> Path:
        """--checkpoint-dir, or its default: output_dir/checkpoints."""
        return Path(self.checkpoint_dir or Path(self.output_dir) / "checkpoints")

    @property
    def base_lr(self) -> float:
        return float(self.lr if self.lr is not None else DEFAULT_LR[self.optimizer])

    def warmup_for(self, *, global_batch: int, steps_per_epoch: int, total_steps: int) -> int:
        """The warm-up steps of this run: --warmup-steps, or the default rule (see its doc)."""
        if self.warmup_steps is not None:
            return self.warmup_steps
        if global_batch <= 256:  # the LR is not scaled up
            return 0
        return min(WARMUP_EPOCHS * steps_per_epoch, WARMUP_MAX_STEPS, total_steps // 10)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON/YAML-able values (paths as strings)."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = str(value) if isinstance(value, Path) else value
        return out


CHOICES = {
    "optimizer": OPTIMIZERS,
    "precision": PRECISIONS,
    "augment": AUGMENTS,
    "cache_images": CACHE_MODES,
    "device": DEVICES,
    "decode": DECODES,
    "grad_compression": GRAD_COMPRESSIONS,
}
"""The fields that take one of a few words, and those words (checked here, offered by --help)."""

TRAJECTORY_SETTINGS = (
    "init_from",
    "optimizer",
    "lr",
    "momentum",
    "weight_decay",
    "warmup_steps",
    "head_epochs",
    "label_smoothing",
    "grad_clip_norm",
    "grad_compression",
    "image_size",
    "augment",
    "val_fraction",
)
"""Settings that change what every step does: a checkpoint resumes only under the same values.
The run's length (--epochs, --max-steps) may change, to extend or shorten a run, and so may the
world size and batch size (the epoch then restarts from its first batch)."""


# --------------------------------------------------------------------------------- validation
def _check_choices(cfg: TrainConfig) -> None:
    for name, allowed in CHOICES.items():
        _choice(cfg, name, allowed)


def _check_counts(cfg: TrainConfig) -> None:
    for name in ("epochs", "batch_size", "image_size", "log_interval", "keep_checkpoints"):
        _at_least(cfg, name, 1)
    for name in ("stop_check_every_steps",):
        _at_least(cfg, name, 1)
    _at_least(cfg, "synthetic_size", 1)
    _at_least(cfg, "num_classes", 2)
    for name in ("checkpoint_every_steps", "seed", "head_epochs"):
        _at_least(cfg, name, 0)
    if cfg.warmup_steps is not None:
        _at_least(cfg, "warmup_steps", 0)
    for name in ("max_steps", "val_batch_size"):
        if getattr(cfg, name) is not None:
            _at_least(cfg, name, 1)
    if cfg.num_workers is not None:
        _at_least(cfg, "num_workers", 0)


def _check_ranges(cfg: TrainConfig) -> None:
    _in_range(cfg, "metrics_port", 0, 65535, "0 (off) or a TCP port in 1..65535")
    _in_range(cfg, "lr", 0.0, None, "a positive number", open_low=True)
    _in_range(cfg, "weight_decay", 0.0, None, "a number >= 0")
    _in_range(cfg, "momentum", 0.0, 1.0, "a number in [0, 1)", open_high=True)
    _in_range(cfg, "label_smoothing", 0.0, 1.0, "a number in [0, 1)", open_high=True)
    _in_range(cfg, "val_fraction", 0.0, 1.0, "a number in (0, 1)", open_low=True, open_high=True)
    _check_progress_reports(cfg)
    for name in ("init_timeout_s", "collective_timeout_s", "checkpoint_upload_timeout_s"):
        _in_range(cfg, name, 0.0, None, "a positive number of seconds", open_low=True)
    if cfg.grad_clip_norm is not None:
        _in_range(cfg, "grad_clip_norm", 0.0, None, "a positive number", open_low=True)


def _check_progress_reports(cfg: TrainConfig) -> None:
    allowed = "0 (never) or 1..86400 seconds"
    _in_range(cfg, "progress_report_interval_s", 0.0, 86400.0, allowed)
    if 0 < cfg.progress_report_interval_s < 1:
        raise ConfigError(
            f"--progress-report-interval-s {cfg.progress_report_interval_s!r} is too short; it "
            f"must be {allowed}"
        )
    _in_range(
        cfg,
        "progress_report_timeout_s",
        0.0,
        300.0,
        "a number of seconds in (0, 300]",
        open_low=True,
    )


def _check_model_and_paths(cfg: TrainConfig) -> None:
    if cfg.model not in CLASSIFICATION_MODELS:  # torchvision's names, without torchvision
        raise ConfigError(
            f"--model {cfg.model!r} is not a torchvision classification model; allowed: "
            + ", ".join(CLASSIFICATION_MODELS)
        )
    if cfg.data_dir is not None and not cfg.data_dir.is_dir():
        raise ConfigError(
            f"--data-dir {cfg.data_dir} is not a folder; expected DATA/train/<class>/*"
        )
    for name in ("output_dir", "checkpoint_dir"):
        path = getattr(cfg, name)
        if path.exists() and not path.is_dir():
            raise ConfigError(f"{flag(name)} {path} is a file; give a folder (new or existing)")
    if cfg.init_from:
        from trainer.init_weights import check_value  # torch: see the import above

        check_value(cfg.init_from)


def _check_checkpoint_uri(cfg: TrainConfig) -> None:
    """``s3://bucket[/prefix]`` with a valid bucket name and plain prefix segments (normalised
    without a trailing slash); the upload wait must end before the collectives time out."""
    if cfg.checkpoint_uri is None:
        return
    uri = cfg.checkpoint_uri.rstrip("/")
    problem = s3_uri_problem(uri)
    if problem:
        raise ConfigError(
            f"--checkpoint-uri {cfg.checkpoint_uri!r} is not usable: {problem}; use "
            "s3://bucket/prefix (e.g. s3://training/checkpoints/run-42)"
        )
    cfg.checkpoint_uri = uri
    if cfg.checkpoint_upload_timeout_s >= cfg.collective_timeout_s:
        raise ConfigError(
            f"--checkpoint-upload-timeout-s {cfg.checkpoint_upload_timeout_s:g} must be below "
            f"--collective-timeout-s {cfg.collective_timeout_s:g}: the other ranks wait that long "
            "for rank 0's last upload"
        )


def _check_output_uri(cfg: TrainConfig) -> None:
    if cfg.output_uri is None:
        return
    uri = cfg.output_uri.rstrip("/")
    problem = s3_uri_problem(uri, prefix_required=True)
    if problem:
        raise ConfigError(
            f"--output-uri {cfg.output_uri!r} is not usable: {problem}; use a prefix of its "
            "own, e.g. s3://my-bucket/runs/cats/output"
        )
    cfg.output_uri = uri


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
    if too_low or too_high or not math.isfinite(value):  # NaN, and inf where no bound stops it
        raise ConfigError(f"{flag(name)} {value!r} is out of range; it must be {allowed}")


def _field_types() -> dict[str, Any]:
    return typing.get_type_hints(TrainConfig)


def _coerce_types(cfg: TrainConfig) -> None:
    """Convert file/CLI values to the annotated types; reject values of the wrong kind."""
    for name, annotation in _field_types().items():
        value = getattr(cfg, name)
        setattr(cfg, name, _coerce(name, value, annotation))


_INVALID = object()


def _to_path(value: Any) -> Any:
    return Path(value) if isinstance(value, str | Path) and str(value) else _INVALID


def _to_bool(value: Any) -> Any:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
        return value.lower() in ("true", "1", "yes")
    return _INVALID


def _to_int(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    try:
        return int(value) if isinstance(value, str) else _INVALID
    except ValueError:
        return _INVALID


def _to_float(value: Any) -> Any:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    try:
        return float(value) if isinstance(value, str) else _INVALID
    except ValueError:
        return _INVALID


def _to_str(value: Any) -> Any:
    return value if isinstance(value, str) else _INVALID


_CONVERTERS = {Path: _to_path, bool: _to_bool, int: _to_int, float: _to_float, str: _to_str}


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
    convert = _CONVERTERS.get(wanted)
    if convert is None:  # pragma: no cover - every field type is handled above
        return value
    converted = convert(value)
    if converted is _INVALID:
        kind = getattr(wanted, "__name__", str(wanted))
        raise ConfigError(f"{flag(name)} {value!r} is not a valid {kind}")
    return converted


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


REQUIRED = object()
"""The default of a field that has none (see field_defaults)."""


def field_defaults() -> dict[str, Any]:
    """Each field's default value (``REQUIRED`` where the field has none)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(TrainConfig):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
        else:
            out[f.name] = REQUIRED
    return out


def field_docs() -> dict[str, str]:
    """The attribute docstrings of :class:`TrainConfig` (used as ``--help`` text)."""
    return docstrings.field_docs(TrainConfig)
