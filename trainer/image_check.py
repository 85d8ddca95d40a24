"""Every image read once before step 1, and every unreadable one named in one error.

Without it a data set with bad files fails one file at a time, each time after the start-up of
every node (a truncated PNG, then a zero-byte JPEG, then a 16-bit float TIFF...). Here each rank
reads its share of the files (every ``world_size``-th, from its rank), in threads (Pillow
decodes without the GIL), and the ranks gather what failed: every rank raises the same
:class:`DataError` listing all of them, by their key under the data folder (the same key under
``data_uri``), class and problem.

The read is cheap by design, so that it costs a few % of an epoch, not one more epoch of
decoding (measured by ``benchmarks/image_check.py``: a decode at 1/8 scale still cost 0.56 of a
full decode, the entropy decoding being most of it). A JPEG is complete when its header parses
and its end-of-image marker is in its last 64 KiB (entropy-coded data never holds one: a file
cut short has none; one with a longer trailer is decoded to be sure); a PNG when every chunk's
CRC matches up to its IEND (``Image.verify``: no inflating). Every other format is decoded and
converted as the loaders convert it (:func:`trainer.image_modes.to_rgb`), so a mode they refuse
is refused here. A file damaged in the middle of its JPEG data passes and still fails, by name,
when it is decoded in training.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

from PIL import Image

from trainer.errors import DataError
from trainer.image_modes import to_rgb
from trainer.listing import ImageListing

JPEG_END = b"\xff\xd9"
JPEG_TAIL_BYTES = 64 * 1024
"""How far from a JPEG's end its end-of-image marker is looked for (trailers of cameras)."""
DRAFT_SIZE = (32, 32)
"""The size a JPEG without a marker near its end is decoded at, to be sure."""
SHOWN = 20
"""Bad files listed in the error (all of them are counted)."""
CHECK_THREADS_MAX = 32
"""Threads per process reading the images once (the trainer before step 1, the evaluation)."""
_IN_FLIGHT_PER_THREAD = 16


@dataclass(frozen=True)
class BadImage:
    key: str
    """The file's path under the data folder, ``train/<class>/<name>``."""
    class_name: str
    problem: str


def read_problem(path: str) -> str | None:
    """What stops ``path`` from being read as an image, None if it reads."""
    try:
        with Image.open(path) as image:
            if image.format == "JPEG" and _ends_as_a_jpeg(path):
                return None  # complete; L, RGB and CMYK, a JPEG's modes, all convert
            if image.format == "PNG":
                image.verify()  # every mode a PNG has converts
                return None
            if image.format == "JPEG":
                image.draft("RGB", DRAFT_SIZE)
            image.load()
            to_rgb(image)
    except Exception as err:  # noqa: BLE001 - any failure to read is the file's (PNG: SyntaxError)
        return str(err) or type(err).__name__
    return None


def _ends_as_a_jpeg(path: str) -> bool:
    with open(path, "rb") as handle:
        handle.seek(0, os.SEEK_END)
        size = handle.tell()
        handle.seek(max(0, size - JPEG_TAIL_BYTES))
        return JPEG_END in handle.read()


def find_bad_images(
    listings: Iterable[ImageListing], data_dir: Path, *, rank: int, world_size: int, threads: int
) -> list[BadImage]:
    """This rank's share of the unreadable files of ``listings`` (every ``world_size``-th
    file of each, from ``rank``), read by ``threads`` threads, a bounded number in flight."""
    bad = []
    with ThreadPoolExecutor(max(1, threads), thread_name_prefix="image-check") as pool:
        for listing in listings:
            indices = range(rank, len(listing), world_size)
            for index, problem in _streamed(pool, listing, indices, threads):
                if problem is not None:
                    path = Path(listing.path(index))
                    bad.append(
                        BadImage(
                            key=os.fspath(path.relative_to(data_dir)),
                            class_name=listing.class_names[listing.label(index)],
                            problem=problem,
                        )
                    )
    return bad


def _streamed(
    pool: ThreadPoolExecutor, listing: ImageListing, indices: range, threads: int
) -> Iterator[tuple[int, str | None]]:
    """``(index, problem)`` in order, with at most a few reads per thread queued (a listing
    of a million files is never turned into a million futures)."""
    window = max(1, threads) * _IN_FLIGHT_PER_THREAD
    todo = iter(indices)
    pending = deque((i, pool.submit(read_problem, listing.path(i))) for i in islice(todo, window))
    while pending:
        index, future = pending.popleft()
        yield index, future.result()
        for i in islice(todo, 1):
            pending.append((i, pool.submit(read_problem, listing.path(i))))


def gathered(bad: list[BadImage], group) -> list[BadImage]:
    """Every rank's bad images, on every rank of ``group`` (None: a one-process run), sorted."""
    if group is None:
        return sorted(bad, key=lambda b: b.key)
    import torch.distributed as dist

    everyone: list[list[BadImage] | None] = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, bad, group=group)
    return sorted((b for part in everyone for b in part or ()), key=lambda b: b.key)


def listed(bad: list[BadImage]) -> str:
    """The bad files one a line, key, class and problem (the first ``SHOWN``), then how many
    more."""
    lines = [f"  {b.key} (class {b.class_name}): {b.problem}" for b in bad[:SHOWN]]
    if len(bad) > SHOWN:
        lines.append(f"  ... and {len(bad) - SHOWN} more")
    return "\n".join(lines)


def bad_images_error(bad: list[BadImage], total: int) -> DataError:
    """One error naming the bad files (the first ``SHOWN``) and counting all of them."""
    return DataError(
        f"{len(bad)} of {total} images cannot be read (keys under the data folder, the same "
        f"under data_uri):\n{listed(bad)}\nfix or delete these files in the data set "
        "(or pass --skip-bad-images, in the pipeline skip_bad_images=true, to train without "
        "them, counted in summary.json)"
    )


def without(listing: ImageListing, bad: list[BadImage], data_dir: Path) -> ImageListing:
    """``listing`` less the files in ``bad``."""
    keys = {b.key for b in bad}
    root = os.fspath(listing.root.relative_to(data_dir))
    keep = [
        i
        for i in range(len(listing))
        if os.path.join(root, listing.folder(listing.label(i)), listing.name(i)) not in keys
    ]
    return listing if len(keep) == len(listing) else listing.select(keep)
