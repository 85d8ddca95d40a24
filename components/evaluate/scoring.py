"""Running totals over batches of logits: loss, top-1/top-k hits, confusion counts."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from components.evaluate.errors import EvaluationError

if TYPE_CHECKING:
    import torch

TOP_K = 5
"""Top-k accuracy uses k = min(TOP_K, number of classes)."""


class ScoreAccumulator:
    """Running totals over batches of logits: loss, top-1/top-k hits, confusion counts.

    Counts stay on the logits' device and are read once at the end (no per-batch sync).
    """

    def __init__(self, num_classes: int, *, device: str | torch.device = "cpu") -> None:
        import torch

        if num_classes < 1:
            raise EvaluationError(f"num_classes={num_classes} must be >= 1")
        self.num_classes = num_classes
        self.top_k = min(TOP_K, num_classes)
        self._loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        self._top_k_hits = torch.zeros((), dtype=torch.int64, device=device)
        self._confusion = torch.zeros(num_classes * num_classes, dtype=torch.int64, device=device)

    def update(self, logits: torch.Tensor, targets: torch.Tensor) -> None:
        """Add one batch: ``logits`` (N, C), ``targets`` (N,) class indices."""
        import torch
        import torch.nn.functional as F

        if logits.ndim != 2 or logits.shape[1] != self.num_classes:
            raise EvaluationError(
                f"the model returned logits of shape {tuple(logits.shape)}; expected "
                f"(batch, {self.num_classes}) for {self.num_classes} classes in model.json"
            )
        logits = logits.float()
        self._loss_sum += F.cross_entropy(logits, targets, reduction="sum").double()
        predictions = logits.argmax(dim=1)
        top_k = logits.topk(self.top_k, dim=1).indices
        self._top_k_hits += (top_k == targets[:, None]).any(dim=1).sum()
        self._confusion += torch.bincount(
            targets * self.num_classes + predictions, minlength=self.num_classes**2
        )

    def confusion(self) -> torch.Tensor:
        """``(C, C)`` counts, rows = true class, columns = predicted class (on CPU)."""
        return self._confusion.view(self.num_classes, self.num_classes).cpu()

    def summary(self) -> dict[str, Any]:
        """accuracy, top_k_accuracy, top_k, loss, num_samples, precision, recall, support,
        confusion."""
        confusion = self.confusion()
        num_samples = int(confusion.sum())
        if num_samples == 0:
            raise EvaluationError("no images were scored; the split is empty")
        correct = confusion.diagonal().tolist()
        predicted = confusion.sum(dim=0).tolist()
        support = confusion.sum(dim=1).tolist()
        return {
            "accuracy": sum(correct) / num_samples,
            "top_k_accuracy": int(self._top_k_hits.cpu()) / num_samples,
            "top_k": self.top_k,
            "loss": float(self._loss_sum.cpu()) / num_samples,
            "num_samples": num_samples,
            "precision": [_ratio(c, p) for c, p in zip(correct, predicted, strict=True)],
            "recall": [_ratio(c, s) for c, s in zip(correct, support, strict=True)],
            "support": support,
            "confusion": confusion.tolist(),
        }


def _ratio(numerator: int, denominator: int) -> float:
    # Zero-division → 0.0, as scikit-learn's zero_division=0: a class never predicted has no
    # precision to speak of, and 0.0 keeps the JSON numeric.
    return numerator / denominator if denominator else 0.0
