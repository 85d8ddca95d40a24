"""The images an evaluation scores: each read once before scoring, as the trainer reads its own
before step 1 (:mod:`trainer.image_check`, the same cheap read), so that unreadable files fail the
step in one error naming all of them, instead of the first one part-way through the scoring.

The files the training left out as unreadable (``--skip-bad-images``, in the pipeline
``skip_bad_images=true``; the model's ``summary.json`` names them) are left out here too: the
evaluation scores what the training's validation scored, where it used to fail on the first of
them after the whole training. Any other unreadable file is the data's fault (it changed since
the training, or this is other data) and fails the step.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from components.evaluate.errors import EvaluationError
from trainer.distributed import available_cpus
from trainer.image_check import CHECK_THREADS_MAX, BadImage, find_bad_images, listed, without
from trainer.listing import ImageListing, scan_split


@dataclass(frozen=True)
class ReadableSplit:
    listing: ImageListing
    """The split's images less the ones left out."""
    left_out: list[str]
    """Keys (``<split>/<class>/<name>``) of the unreadable images the training left out too."""


def left_out_by_training(model_dir: Path) -> set[str]:
    """The keys of the images the training left out as unreadable (its ``summary.json``'s
    ``skipped_images``); none without that file (a trainer of the user's own)."""
    try:
        summary = json.loads((model_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return set()
    skipped = summary.get("skipped_images") if isinstance(summary, dict) else None
    keys = skipped.get("keys") if isinstance(skipped, dict) else None
    return {str(key) for key in keys} if isinstance(keys, list) else set()


def readable_split(split_dir: Path, model_dir: Path) -> ReadableSplit:
    """``split_dir``'s images once each was read: less those the training left out, or an
    EvaluationError naming every other unreadable one (by its key under the data folder)."""
    listing = scan_split(split_dir)
    data_dir = split_dir.parent
    threads = min(CHECK_THREADS_MAX, available_cpus())
    bad = find_bad_images((listing,), data_dir, rank=0, world_size=1, threads=threads)
    if not bad:
        return ReadableSplit(listing, [])
    known = left_out_by_training(model_dir)
    new = [b for b in bad if b.key not in known]
    if new:
        raise _unreadable_error(new, len(listing))
    return ReadableSplit(without(listing, bad, data_dir), sorted(b.key for b in bad))


def _unreadable_error(bad: list[BadImage], total: int) -> EvaluationError:
    return EvaluationError(
        f"{len(bad)} of {total} images to score cannot be read (keys under the data folder, the "
        f"same under data_uri), and the training did not leave them out:\n{listed(bad)}\n"
        "fix or delete these files in the data set"
    )
