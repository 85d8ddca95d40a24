"""The confusion matrix as the KFP UI and its metadata store can take it: at most
``SHOWN_CLASSES`` rows and columns.

An artifact's metadata goes through ML Metadata's gRPC API, whose messages KFP backends cap at
4 MiB until kubeflow/pipelines#12803 (2026; the error: kubeflow/pipelines#11949): a full
1000-class matrix (ImageNet) is 11 MB as a protobuf Struct, so the evaluation step would fail
after the whole training. The UI draws every
cell as a table cell, so a thousand rows would not be readable either.

Above the cap, the matrix kept is the ``SHOWN_CLASSES - 1`` classes with the most mistakes (the
images of the class predicted as another, plus the images of other classes predicted as it), in
the model's order, and one "other" class that stands for all the rest. Every row and column of it
still sums to what the full matrix sums to, so nothing is silently dropped: the full matrix is in
eval.json (the evaluation artifact) and on the report page.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

SHOWN_CLASSES = 50
"""The most rows (and columns) the KFP confusion matrix gets: 2,500 cells, ~115 KB of metadata."""


@dataclass(frozen=True)
class ShownConfusion:
    """The confusion matrix as shown in KFP: the classes kept, their counts, what was merged."""

    class_names: list[str]
    """The classes kept, in the model's order, then the "other" class when there is one."""
    counts: list[list[int]]
    """``counts[true][predicted]`` over ``class_names``."""
    merged: int
    """How many classes the "other" row and column stand for (0: the full matrix)."""


def most_confused(confusion: Sequence[Sequence[int]], keep: int) -> list[int]:
    """The indices of the ``keep`` classes with the most mistakes, in ascending order (ties go
    to the class first in the model's order)."""
    n = len(confusion)
    column_totals = [sum(row[j] for row in confusion) for j in range(n)]
    mistakes = [
        (sum(confusion[i]) - confusion[i][i]) + (column_totals[i] - confusion[i][i])
        for i in range(n)
    ]
    ranked = sorted(range(n), key=lambda i: (-mistakes[i], i))
    return sorted(ranked[:keep])


def shown_confusion(
    class_names: Sequence[str], confusion: Sequence[Sequence[int]], limit: int = SHOWN_CLASSES
) -> ShownConfusion:
    """``confusion`` with at most ``limit`` classes (the rest merged into one "other" class)."""
    n = len(class_names)
    if n <= limit:
        return ShownConfusion(list(class_names), [list(row) for row in confusion], merged=0)
    kept = most_confused(confusion, limit - 1)
    slot = {index: position for position, index in enumerate(kept)}
    other = len(kept)  # the merged class's row and column
    counts = [[0] * (other + 1) for _ in range(other + 1)]
    for i, row in enumerate(confusion):
        into = counts[slot.get(i, other)]
        for j, count in enumerate(row):
            into[slot.get(j, other)] += count
    merged = n - len(kept)
    names = [str(class_names[i]) for i in kept] + [_other_name(class_names, merged)]
    return ShownConfusion(names, counts, merged=merged)


def _other_name(class_names: Sequence[str], merged: int) -> str:
    """A name for the merged class that no real class has."""
    name = f"(other {merged} classes)"
    while name in class_names:
        name = f"({name})"
    return name
