"""Score a trained model folder on a held-out split and decide whether it passes the gate.

The model folder is the trainer's ``model/`` output (``weights.pt`` + ``model.json``). Images are
listed, decoded and preprocessed by the trainer's own helpers, so evaluation sees exactly what
validation during training saw.

torch and the trainer are imported inside the functions that need them: the pipeline code imports
this package only to build the KFP component, and compiling a pipeline should not load torch.
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from components.artifacts import write_metadata_file
from components.evaluate.confusion import SHOWN_CLASSES, shown_confusion
from components.evaluate.errors import EvaluationError, check_fraction, check_int
from components.evaluate.gate import baseline_accuracy_of, decide_gate, load_baseline
from components.evaluate.report import write_report
from components.evaluate.scoring import ScoreAccumulator
from components.s3_sync import sync
from kfp_ddp.atomic_files import write_json_atomic
from kfp_ddp.class_names import class_key
from trainer.out_of_memory import is_out_of_memory

if TYPE_CHECKING:
    import torch

PRECISIONS = ("fp32", "bf16")
SHOWN_SKIPPED = 20
"""Skipped images named in the report's metadata (eval.json names all of them)."""


@dataclass(kw_only=True, frozen=True)
class EvalConfig:
    """How to score a model and what it must reach to pass."""

    split: str = "val"
    """Sub-folder of the data dir to score (class sub-folders of images)."""
    batch_size: int = 256
    """Images per forward pass."""
    device: str = "auto"
    """``auto`` (CUDA when available, else CPU), ``cpu``, ``cuda`` or ``cuda:N``."""
    threshold: float = 0.0
    """Minimum accuracy to pass, in [0, 1]."""
    tolerance: float = 0.01
    """How far below the baseline's accuracy the model may be and still pass, in [0, 1]."""
    precision: str = "fp32"
    """``fp32`` (exact, the default) or ``bf16`` autocast (faster on recent GPUs)."""
    num_workers: int = 0
    """DataLoader worker processes decoding images (0: decode in this process)."""

    def __post_init__(self) -> None:
        if not isinstance(self.split, str) or not self.split or self.split in (".", ".."):
            raise EvaluationError(
                f"split={self.split!r} is not a folder name; use e.g. 'val' or 'test'"
            )
        if "/" in self.split or "\\" in self.split:
            raise EvaluationError(
                f"split={self.split!r} must be a single folder name under the data dir "
                "(no path separators); e.g. 'val'"
            )
        check_int("batch_size", self.batch_size, minimum=1)
        check_int("num_workers", self.num_workers, minimum=0)
        check_fraction("threshold", self.threshold)
        check_fraction("tolerance", self.tolerance)
        if self.precision not in PRECISIONS:
            raise EvaluationError(
                f"precision={self.precision!r} is not supported; allowed: {', '.join(PRECISIONS)}"
            )
        device = self.device
        if not isinstance(device, str) or not (
            device in ("auto", "cpu", "cuda")
            or (device.startswith("cuda:") and device[5:].isdigit())
        ):
            raise EvaluationError(
                f"device={device!r} is not supported; allowed: 'auto', 'cpu', 'cuda', 'cuda:N'"
            )


@dataclass(kw_only=True, frozen=True)
class EvalResult:
    """What one evaluation measured, and the gate's verdict."""

    accuracy: float
    """Top-1 accuracy over the split."""
    top_k_accuracy: float
    """Top-k accuracy with k = min(5, number of classes) (see ``top_k``)."""
    top_k: int
    """The k of ``top_k_accuracy``."""
    loss: float
    """Mean cross-entropy loss per image."""
    num_samples: int
    """Images scored."""
    class_names: list[str]
    """Class names in the model's output order (rows and columns of ``confusion``)."""
    precision: list[float]
    """Per class: correct / predicted as that class (0.0 when never predicted)."""
    recall: list[float]
    """Per class: correct / images of that class (0.0 when the class has no images)."""
    support: list[int]
    """Per class: images of that class."""
    confusion: list[list[int]]
    """``confusion[true][predicted]`` counts."""
    passed: bool
    """Whether the model passes the gate (threshold and baseline)."""
    reason: str
    """Why it passed or failed, in words."""
    threshold: float
    """The accuracy threshold that was applied."""
    tolerance: float
    """The baseline tolerance that was applied."""
    baseline_accuracy: float | None = None
    """The baseline's accuracy, or None without a baseline."""
    split: str = "val"
    """The scored split."""
    arch: str = ""
    """The model's architecture (from model.json)."""
    device: str = "cpu"
    """Where it was scored."""
    seconds: float = 0.0
    """Wall time of scoring."""
    skipped_images: list[str] = field(default_factory=list)
    """Keys of the unreadable images left out, as the training left them out (``readable``)."""

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types; per-class numbers keyed by class name."""
        return {
            "accuracy": self.accuracy,
            "top_k_accuracy": self.top_k_accuracy,
            "top_k": self.top_k,
            "loss": self.loss if math.isfinite(self.loss) else None,  # JSON and KFP: no nan
            "num_samples": self.num_samples,
            "passed": self.passed,
            "reason": self.reason,
            "threshold": self.threshold,
            "tolerance": self.tolerance,
            "baseline_accuracy": self.baseline_accuracy,
            "split": self.split,
            "arch": self.arch,
            "device": self.device,
            "seconds": self.seconds,
            "skipped_images": list(self.skipped_images),
            "num_classes": len(self.class_names),
            "class_names": list(self.class_names),
            "per_class": {
                name: {"precision": p, "recall": r, "support": s}
                for name, p, r, s in zip(
                    self.class_names, self.precision, self.recall, self.support, strict=True
                )
            },
            "confusion_matrix": [list(row) for row in self.confusion],
        }

    def metadata_dict(self) -> dict[str, Any]:
        """:meth:`to_dict` as an artifact's metadata can hold it, whatever the data set: the
        per-class numbers and the matrix only up to ``SHOWN_CLASSES`` classes, the first
        ``SHOWN_SKIPPED`` skipped images (ML Metadata's messages are capped: ``confusion``).
        What is left out is in eval.json, named by ``left_out``."""
        summary = self.to_dict()
        left_out = []
        if len(self.class_names) > SHOWN_CLASSES:
            for key in ("class_names", "per_class", "confusion_matrix"):
                del summary[key]
            left_out = ["class_names", "per_class", "confusion_matrix"]
        if len(self.skipped_images) > SHOWN_SKIPPED:
            summary["skipped_images"] = list(self.skipped_images[:SHOWN_SKIPPED])
            left_out.append(f"skipped_images[{SHOWN_SKIPPED}:]")
        if left_out:
            summary["skipped_images_total"] = len(self.skipped_images)
            summary["left_out"] = f"{', '.join(left_out)}: in eval.json (the evaluation artifact)"
        return summary

    def scalar_metrics(self) -> dict[str, float]:
        """The headline numbers as floats (what a KFP ``Metrics`` artifact holds: a loss that
        is not finite is left out, as KFP cannot store it)."""
        numbers = {
            "accuracy": self.accuracy,
            "top_k_accuracy": self.top_k_accuracy,
            "loss": self.loss,
            "num_samples": float(self.num_samples),
            "passed": 1.0 if self.passed else 0.0,
        }
        return {name: value for name, value in numbers.items() if math.isfinite(value)}


# --------------------------------------------------------------------------- evaluation


def _resolve_device(name: str) -> torch.device:
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise EvaluationError(
                f"device={name!r} but CUDA is not available here; use device='cpu' or 'auto'"
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise EvaluationError(
                f"device={name!r} but only {torch.cuda.device_count()} CUDA device(s) exist"
            )
    return device


def _check_classes(model_classes: Sequence[str], found: Sequence[str], split_dir: Path) -> None:
    """Refuse class folders the model does not know. A class of the model's may have no folder
    (a split without images of a rare class): it is scored with support 0, as the trainer's own
    validation scores it, and the data step names it before training."""
    known = {class_key(name) for name in model_classes}
    unexpected = sorted(name for name in found if class_key(name) not in known)
    if not unexpected:
        return
    present = {class_key(name) for name in found}
    missing = sorted(name for name in model_classes if class_key(name) not in present)
    renamed = f"; and no folder for {missing}" if missing else ""
    raise EvaluationError(
        f"class folders under {split_dir} that are not among the model's class_names: "
        f"{unexpected}{renamed}; the model was trained on {list(model_classes)}: evaluate it on "
        "data whose class sub-folders are among those"
    )


def classes_without_images(result: EvalResult) -> list[str]:
    """The model's classes that the scored split had no images of (support 0)."""
    return [
        name for name, count in zip(result.class_names, result.support, strict=True) if not count
    ]


def evaluate(
    model_dir: str | os.PathLike,
    data_dir: str | os.PathLike,
    *,
    split: str = "val",
    batch_size: int = 256,
    device: str = "auto",
    threshold: float = 0.0,
    baseline: Mapping[str, Any] | None = None,
    tolerance: float = 0.01,
    precision: str = "fp32",
    num_workers: int = 0,
) -> EvalResult:
    """Score ``model_dir`` (weights.pt + model.json) on ``data_dir/<split>/<class>/*``.

    Args:
        model_dir: the trainer's model folder.
        data_dir: an ImageFolder-style data dir with a ``<split>/`` sub-folder.
        split: the sub-folder to score.
        batch_size: images per forward pass.
        device: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.
        threshold: minimum accuracy to pass, in [0, 1].
        baseline: a previous model's metrics (``{"accuracy": 0.95}``; an eval.json or the
            trainer's summary.json), or None.
        tolerance: how far below the baseline's accuracy still passes, in [0, 1].
        precision: ``fp32`` (default, exact) or ``bf16`` autocast.
        num_workers: DataLoader workers decoding images.

    Raises:
        EvaluationError: bad arguments, a missing model folder or split, or class folders that
            differ from the model's class names.
        trainer.errors.DataError: an empty class folder or an unreadable image (from the
            trainer's helpers, naming the path).
    """
    config = EvalConfig(
        split=split,
        batch_size=batch_size,
        device=device,
        threshold=threshold,
        tolerance=tolerance,
        precision=precision,
        num_workers=num_workers,
    )
    baseline_accuracy = None if baseline is None else baseline_accuracy_of(baseline)

    # Here, not at the top: torch and torchvision (~2 s, ~300 MB) for scoring only; the gate, the
    # pipeline's argument check (a small pod) and the compiler import this module without them.
    from components.evaluate.readable import readable_split
    from trainer.data import eval_transform, load_image
    from trainer.divergence import weights_are_finite
    from trainer.export import load_model

    model_dir, data_dir = Path(model_dir), Path(data_dir)
    for name in ("weights.pt", "model.json"):
        if not (model_dir / name).is_file():
            raise EvaluationError(
                f"model_dir={str(model_dir)!r} has no {name}; pass the trainer's model/ folder "
                "(weights.pt + model.json)"
            )
    split_dir = data_dir / config.split
    if not split_dir.is_dir():
        raise EvaluationError(
            f"{split_dir} does not exist: data_dir={str(data_dir)!r} needs a {config.split}/ "
            "folder of class sub-folders (set split= to score another one)"
        )
    torch_device = _resolve_device(config.device)
    model, model_config = load_model(model_dir, map_location="cpu")
    if not weights_are_finite(model):
        raise EvaluationError(
            f"model_dir={str(model_dir)!r}: its weights are not all finite (nan or inf): the "
            "training diverged, and such a model predicts nothing; train again with a lower lr"
        )
    class_names = model_config.get("class_names")
    if not isinstance(class_names, list) or len(class_names) != model_config.get("num_classes"):
        raise EvaluationError(
            f"{model_dir / 'model.json'}: class_names={class_names!r} must be a list of "
            f"num_classes={model_config.get('num_classes')!r} names; re-export the model"
        )
    class_names = [str(name) for name in class_names]
    readable = readable_split(split_dir, model_dir)
    samples, found_classes = readable.listing.items(), list(readable.listing.class_names)
    _check_classes(class_names, found_classes, split_dir)
    index_of = {class_key(name): i for i, name in enumerate(class_names)}  # either spelling
    samples = [(path, index_of[class_key(found_classes[target])]) for path, target in samples]

    transform = eval_transform(
        int(model_config["image_size"]), model_config["mean"], model_config["std"]
    )
    images = cast("torch.utils.data.Dataset", _ImageList(samples, transform, load_image))
    model = model.to(torch_device).eval()
    started = time.perf_counter()
    summary = _score_fitting_memory(model, images, len(class_names), config, torch_device)
    seconds = time.perf_counter() - started

    passed, reason = decide_gate(
        summary["accuracy"],
        threshold=config.threshold,
        baseline_accuracy=baseline_accuracy,
        tolerance=config.tolerance,
    )
    return EvalResult(
        **summary,
        class_names=class_names,
        passed=passed,
        reason=reason,
        threshold=float(config.threshold),
        tolerance=float(config.tolerance),
        baseline_accuracy=baseline_accuracy,
        split=config.split,
        arch=str(model_config.get("arch", "")),
        device=str(torch_device),
        seconds=seconds,
        skipped_images=readable.left_out,
    )


def _score_fitting_memory(
    model: Any, images: Any, num_classes: int, config: EvalConfig, device: Any
) -> dict[str, Any]:
    """The scores of ``model`` on ``images``, at ``config.batch_size`` or, when a batch does not
    fit in the device's memory, at half of it, and so on: in evaluation mode each image's
    prediction does not depend on the others in its batch, and the step's batch size is not a
    pipeline parameter, so a model too big for 256 images at once (a ViT-H at 518 px on a 16 GB
    GPU) is scored in smaller batches instead of failing the run after its training."""
    import torch

    batch_size = config.batch_size
    while True:
        try:
            return _score(
                model, images, num_classes, replace(config, batch_size=batch_size), device
            )
        except RuntimeError as err:
            if not is_out_of_memory(err):
                raise
            if batch_size == 1:
                raise EvaluationError(
                    f"out of memory on {device} scoring one image at a time ({err}); give the "
                    "evaluation step more memory, or a GPU"
                ) from None
            if device.type == "cuda":
                torch.cuda.empty_cache()
            smaller = batch_size // 2
            print(
                f"evaluate: out of memory on {device} at batch_size={batch_size}; scoring again "
                f"in batches of {smaller}",
                flush=True,
            )
            batch_size = smaller


def _score(
    model: Any, images: Any, num_classes: int, config: EvalConfig, device: Any
) -> dict[str, Any]:
    """The ScoreAccumulator's summary of ``model`` on ``images`` in batches of
    ``config.batch_size``."""
    import torch

    loader: torch.utils.data.DataLoader = torch.utils.data.DataLoader(
        images,  # a map-style data set: __len__ and __getitem__
        batch_size=config.batch_size,
        shuffle=False,
        num_workers=config.num_workers,
        pin_memory=device.type == "cuda",
    )
    scores = ScoreAccumulator(num_classes, device=device)
    autocast = torch.autocast(
        device_type=device.type, dtype=torch.bfloat16, enabled=config.precision == "bf16"
    )
    with torch.inference_mode(), autocast:
        for batch, targets in loader:
            batch = batch.to(device, non_blocking=True)
            targets = targets.to(device, non_blocking=True)
            scores.update(model(batch), targets)
    return scores.summary()


class _ImageList:
    """(path, target) pairs → (tensor, target), decoded with the trainer's helpers."""

    def __init__(
        self,
        samples: list[tuple[Path, int]],
        transform: Callable[[Any], torch.Tensor],
        load_image: Callable[[Path], Any],
    ) -> None:
        self.samples = samples
        self.transform = transform
        self.load_image = load_image

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, target = self.samples[index]
        return self.transform(self.load_image(path)), target


# --------------------------------------------------------------------------- files


def run_evaluation(
    model_dir: str | os.PathLike,
    data_dir: str | os.PathLike,
    *,
    report_path: str | os.PathLike,
    threshold: float = 0.0,
    baseline_uri: str = "",
    tolerance: float = 0.01,
    metrics_jsonl: str | os.PathLike | None = None,
    endpoint_url: str | None = None,
    tensorboard: str = "",
    **options: Any,
) -> EvalResult:
    """The pipeline step: load the baseline, :func:`evaluate`, and write the HTML report.

    ``metrics_jsonl`` defaults to ``model_dir/metrics.jsonl`` (the training curves; the page
    renders without them when the file is missing); ``tensorboard`` is the folder or S3 URI of
    the training's TensorBoard files, named on the page. ``options`` go to :func:`evaluate`.
    """

    baseline = load_baseline(baseline_uri, endpoint_url=endpoint_url)
    result = evaluate(
        model_dir,
        data_dir,
        threshold=threshold,
        baseline=baseline,
        tolerance=tolerance,
        **options,
    )
    if metrics_jsonl is None:
        metrics_jsonl = Path(model_dir) / "metrics.jsonl"
    write_report(result, report_path, metrics_jsonl=metrics_jsonl, tensorboard=tensorboard)
    return result


def evaluate_into_artifacts(
    model_dir: str,
    data_dir: str,
    *,
    threshold: float,
    baseline_uri: str,
    tolerance: float,
    metrics: Any,
    confusion: Any,
    report: Any,
    evaluation: Any = None,
    endpoint_url: str = "",
    tensorboard: str = "",
) -> bool:
    """The KFP step on KFP's artifact objects (duck-typed, so this module needs no kfp):
    :func:`run_evaluation` writes ``report.path``, the whole result goes to ``evaluation.path``
    (eval.json; None: only into metadata, as before it existed) and the numbers into the
    artifacts' metadata.

    Kept out of components/kfp/evaluate.py: the component's body imports this at run time,
    inside KFP's executor, where importing kfp's component-building modules would be circular.

    ``data_dir`` may be an ``s3://bucket/prefix`` ImageFolder (no shared volume): its ``val/``
    is downloaded into a temporary folder first (verified, like every sync).
    """
    with _local_data(data_dir, endpoint_url or None) as local_dir:
        result = run_evaluation(
            model_dir,
            local_dir,
            report_path=report.path,
            threshold=threshold,
            baseline_uri=baseline_uri,
            tolerance=tolerance,
            metrics_jsonl=Path(model_dir) / "metrics.jsonl",
            endpoint_url=endpoint_url or None,
            tensorboard=tensorboard,
        )
    if evaluation is not None:
        write_json_atomic(Path(evaluation.path), result.to_dict())
    return _fill_artifacts(result, metrics, confusion, report)


@contextlib.contextmanager
def _local_data(data_dir: str, endpoint_url: str | None):
    """``data_dir`` as a local folder: itself, or ``val/`` of an S3 prefix in a temp folder."""
    if not str(data_dir).startswith("s3://"):
        yield data_dir
        return

    with tempfile.TemporaryDirectory(prefix="kfp-ddp-eval-") as tmp:
        report = sync(
            f"{str(data_dir).rstrip('/')}/val",
            Path(tmp) / "val",
            endpoint_url=endpoint_url,
            progress=False,
        )
        print(f"evaluation data: {report.summary()}")
        try:
            yield tmp
        except Exception as err:  # a file named by the URI the user set, not our temp folder
            if tmp not in str(err):
                raise
            raise EvaluationError(str(err).replace(tmp, str(data_dir).rstrip("/"))) from None


def _fill_artifacts(result: Any, metrics: Any, confusion: Any, report: Any) -> bool:
    """The numbers into the artifacts' metadata (the page is already at ``report.path``)."""
    for name, value in result.scalar_metrics().items():
        metrics.log_metric(name, value)
    shown = shown_confusion(result.class_names, result.confusion)
    confusion.log_confusion_matrix(shown.class_names, shown.counts)
    if shown.merged:
        print(
            f"evaluation: the KFP confusion matrix shows the {len(shown.class_names) - 1} of "
            f"{len(result.class_names)} classes with the most mistakes and one row for the "
            f"other {shown.merged}; eval.json and the report have all of them"
        )

    for artifact in (metrics, confusion):
        write_metadata_file(artifact)
    report.metadata.update({"passed": result.passed, "reason": result.reason})
    report.metadata["eval"] = result.metadata_dict()
    if result.skipped_images:
        print(
            f"evaluation: {len(result.skipped_images)} unreadable image(s) left out, as the "
            "training left them out (skip_bad_images; the training's log and summary.json, and "
            "the report's eval metadata, name them)"
        )
    unscored = classes_without_images(result)
    if unscored:
        print(
            f"evaluation: {result.split}/ has no images of {unscored}: the accuracy is over the "
            "other classes (these have support 0)"
        )
    print(f"evaluation {'PASSED' if result.passed else 'FAILED'}: {result.reason}")
    return result.passed


__all__ = [
    "EvalConfig",
    "EvalResult",
    "EvaluationError",
    "ScoreAccumulator",
    "baseline_accuracy_of",
    "decide_gate",
    "evaluate",
    "evaluate_into_artifacts",
    "load_baseline",
    "run_evaluation",
]
