"""When two class folder names are the same class: their text compared in Unicode NFC.

A name with an accent has two spellings in Unicode: composed ('é', one code point: NFC, what
Linux and Windows tools write) and decomposed ('e' then a combining accent: NFD, what macOS file
systems return). They print alike, but as bytes they differ, and so do S3 keys and folder names
made from them: a data set uploaded from a Mac has ``train/café/`` in NFD, the same data set
uploaded from Linux has it in NFC. The data step, the trainer, the evaluation and a warm start's
head compare class names by :func:`class_key`, so that

- a val/ folder, an evaluated folder, or a published model's class is the training class it
  reads as, whichever spelling each side has;
- two folders of one split that are one class spelt two ways (a data set merged from both
  kinds of machine) are refused by :func:`spelling_twins`, naming both: as two classes they
  would train on two labels for the same pictures.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable


def class_key(name: str) -> str:
    """The form two names of one class share: ``name`` in Unicode NFC."""
    return unicodedata.normalize("NFC", name)


def spelling_twins(names: Iterable[str]) -> list[list[str]]:
    """Groups of two or more of ``names`` that are one class spelt two ways, each sorted, in
    the order of their first member."""
    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(class_key(name), []).append(name)
    return sorted((sorted(group) for group in groups.values() if len(group) > 1), key=str)


def twins_problem(names: Iterable[str]) -> str | None:
    """What is wrong with class folders of one split that are one class spelt two ways, and the
    fix; None when there are none."""
    twins = spelling_twins(names)
    if not twins:
        return None
    shown = "; ".join(" and ".join(_spelt(name) for name in group) for group in twins[:5])
    more = f" (and {len(twins) - 5} more)" if len(twins) > 5 else ""
    return (
        f"class folders {shown}{more} are one name spelt two ways in Unicode (composed NFC, as "
        "Linux writes it, and decomposed NFD, as macOS does): they would train as two classes "
        "of the same pictures; move the images of one into the other and remove it"
    )


def _spelt(name: str) -> str:
    """``name`` with its spelling, e.g. ``'café' (NFD)``."""
    if name == unicodedata.normalize("NFC", name):
        form = "NFC"
    elif name == unicodedata.normalize("NFD", name):
        form = "NFD"
    else:
        form = "mixed"
    return f"{name!r} ({form})"
