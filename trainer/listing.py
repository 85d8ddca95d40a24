"""The file list of an ImageFolder data set: listed once, held compactly, shared by broadcast.

At ImageNet scale (1.28 M files) the list itself costs: a ``Path`` per file is ~360 MB once a
DataLoader worker has unpickled it, and an ``is_file()`` stat per file takes minutes on NFS.
So:

* :func:`scan_split` lists ``split/<class>/*`` with :func:`os.scandir`, whose directory entries
  already carry the entry type (no stat per file where the file system reports ``d_type``);
* :class:`ImageListing` keeps the names in three NumPy arrays (one byte buffer of the file names,
  their offsets, an int32 label per file): ~30 bytes per image, pickled as three buffers;
* :func:`shared_splits` lists on rank 0 only and broadcasts one byte blob over the gloo control
  group; the other ranks never list the folder and resolve the same relative names under their
  own ``--data-dir`` (a node's local copy, or the shared volume).

Order: class folders by name, files by name inside each (what sorting ``Path`` objects gave),
identical on every rank.
"""

from __future__ import annotations

import io
import json
import os
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kfp_ddp.class_names import class_key, twins_problem
from kfp_ddp.image_files import IMAGE_EXTENSIONS, class_images
from trainer.errors import DataError
from trainer.randomness import derive_seed  # imports torch, which trainer.prepare needs not


@dataclass(frozen=True, eq=False)
class ImageListing:
    """Images of one split: ``root/<class_names[label]>/<name>`` for each index.

    Picklable into DataLoader workers as three flat arrays plus the class names.
    """

    root: Path
    """The split folder on this machine (e.g. ``DATA/train``)."""
    class_names: tuple[str, ...]
    """Class folder names; a label indexes this tuple."""
    names: np.ndarray
    """uint8: the file names (their paths relative to their class folder, file-system encoded),
    concatenated."""
    offsets: np.ndarray
    """int64, one longer than the listing: name ``i`` is ``names[offsets[i]:offsets[i + 1]]``."""
    labels: np.ndarray
    """int32: the class index of each image."""
    folders: tuple[str, ...] = ()
    """The class folders' names on this disk where one is spelt otherwise than its class (a val/
    folder in Unicode NFD, uploaded from a Mac, of a class trained in NFC:
    ``kfp_ddp.class_names``); empty when each folder is named as its class."""

    def __len__(self) -> int:
        return len(self.labels)

    def name(self, index: int) -> str:
        start, end = int(self.offsets[index]), int(self.offsets[index + 1])
        return os.fsdecode(self.names[start:end].tobytes())

    def label(self, index: int) -> int:
        return int(self.labels[index])

    def folder(self, label: int) -> str:
        """The folder of class ``label``'s images, in ``root``."""
        return (self.folders or self.class_names)[label]

    def path(self, index: int) -> str:
        """The file's path on this machine."""
        return os.path.join(self.root, self.folder(self.label(index)), self.name(index))

    def items(self) -> list[tuple[Path, int]]:
        """``(path, label)`` pairs (for small callers; a big listing stays in its arrays)."""
        return [(Path(self.path(i)), self.label(i)) for i in range(len(self))]

    def select(self, indices: Sequence[int] | np.ndarray) -> ImageListing:
        """The images at ``indices``, in that order."""
        indices = np.asarray(indices, dtype=np.int64)
        starts = self.offsets[indices]
        lengths = self.offsets[indices + 1] - starts
        offsets = np.zeros(len(indices) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        # Byte k of selected name j comes from starts[j] + (k - offsets[j]): one gather.
        source = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1])
        names = self.names[source]
        labels = self.labels[indices]
        return ImageListing(self.root, self.class_names, names, offsets, labels, self.folders)

    @classmethod
    def from_names(
        cls,
        root: Path,
        class_names: Sequence[str],
        names: Sequence[str],
        labels: Sequence[int],
        folders: Sequence[str] = (),
    ) -> ImageListing:
        encoded = [os.fsencode(name) for name in names]
        offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(name) for name in encoded], out=offsets[1:])
        blob = np.frombuffer(b"".join(encoded), dtype=np.uint8).copy()
        label_array = np.asarray(labels, dtype=np.int32).reshape(-1)
        return cls(Path(root), tuple(class_names), blob, offsets, label_array, tuple(folders))


# -------------------------------------------------------------------------------------- listing
def _entries(folder: str | Path) -> Iterator[os.DirEntry]:
    try:
        with os.scandir(folder) as entries:
            yield from entries
    except OSError as err:
        raise DataError(f"cannot list {folder}: {err}") from err


def _class_folders(split_dir: Path) -> list[str]:
    if not split_dir.is_dir():
        raise DataError(f"data folder {split_dir} does not exist; expected {split_dir}/<class>/*")
    folders = sorted(
        entry.name
        for entry in _entries(split_dir)
        if not entry.name.startswith(".") and entry.is_dir()
    )
    if not folders:
        raise DataError(
            f"no class folders in {split_dir}; expected one sub-folder of images per class"
        )
    return folders


def _image_names(folder: Path) -> list[str]:
    """The images of class folder ``folder`` (``kfp_ddp.image_files.class_images``: its
    sub-folders' too), by their paths relative to it, sorted; ``is_file()`` stats only where
    d_type is unknown."""
    try:
        names = sorted(class_images(folder))
    except OSError as err:
        raise DataError(f"cannot list {folder}: {err}") from err
    if not names:
        raise DataError(
            f"class folder {folder} has no images ({', '.join(IMAGE_EXTENSIONS)}); "
            "add images or remove the folder"
        )
    return sorted(names)


def scan_split(split_dir: Path, class_names: Sequence[str] | None = None) -> ImageListing:
    """List ``split_dir/<class>/*`` images, sorted, with labels.

    With ``class_names`` (e.g. the training classes when listing ``val/``) labels follow that list
    and a class folder outside it is an error; a class may be missing. Raises :class:`DataError`
    naming the folder when there is no class folder, an empty class folder, or an unknown class.
    """
    split_dir = Path(split_dir)
    folders = _class_folders(split_dir)
    twins = twins_problem(folders)
    if twins:
        raise DataError(f"{split_dir}: {twins}")
    names = list(folders) if class_names is None else list(class_names)
    label_of = {class_key(name): i for i, name in enumerate(names)}  # either spelling's class
    on_disk = list(names)
    files: list[str] = []
    labels: list[int] = []
    for folder in folders:
        label = label_of.get(class_key(folder))
        if label is None:
            raise DataError(
                f"class folder {split_dir / folder} is not one of the training classes {names}; "
                "remove it or add the class to the training data"
            )
        on_disk[label] = folder
        found = _image_names(split_dir / folder)
        files.extend(found)
        labels.extend([label] * len(found))
    spelt_otherwise = on_disk != names
    return ImageListing.from_names(
        split_dir, names, files, labels, on_disk if spelt_otherwise else ()
    )


def list_images(
    split_dir: Path, class_names: list[str] | None = None
) -> tuple[list[tuple[Path, int]], list[str]]:
    """Sorted ``(path, label)`` pairs of ``split_dir/<class>/*`` and the class names.

    The small-caller form of :func:`scan_split` (the evaluation step uses it).
    """
    listing = scan_split(split_dir, class_names)
    return listing.items(), list(listing.class_names)


def split_train_val(
    listing: ImageListing, fraction: float, seed: int
) -> tuple[ImageListing, ImageListing]:
    """Seeded, per-class split of ``listing`` into train and validation (at least one of each)."""
    by_class: dict[int, list[int]] = {}
    for index, label in enumerate(listing.labels.tolist()):
        by_class.setdefault(label, []).append(index)
    rng = random.Random(derive_seed(seed, "val-split"))
    train: list[int] = []
    val: list[int] = []
    for label in sorted(by_class):
        members = by_class[label]
        rng.shuffle(members)
        n_val = min(len(members) - 1, max(1, round(len(members) * fraction)))
        val.extend(members[:n_val])
        train.extend(members[n_val:])
    # Index order is path order: the listing is sorted.
    return listing.select(sorted(train)), listing.select(sorted(val))


@dataclass(frozen=True)
class Splits:
    """The training and validation images of a data folder."""

    train: ImageListing
    val: ImageListing

    @property
    def class_names(self) -> list[str]:
        return list(self.train.class_names)


def load_splits(data_dir: Path, *, val_fraction: float, seed: int) -> Splits:
    """Train and validation images of ``data_dir`` (``val/`` if present, else a seeded split)."""
    data_dir = Path(data_dir)
    train = scan_split(data_dir / "train")
    if len(train.class_names) < 2:
        raise DataError(f"{data_dir / 'train'} has one class folder; a classifier needs >= 2")
    if (data_dir / "val").is_dir():
        return Splits(train, scan_split(data_dir / "val", train.class_names))
    return Splits(*split_train_val(train, val_fraction, seed))


# ------------------------------------------------------------------------------ sharing by rank 0
def encode_splits(splits: Splits | None, error: str | None = None) -> bytes:
    """One byte blob of both listings (or of the error rank 0 met); NumPy ``.npz``, no pickle."""
    header: dict[str, Any] = {"error": error}
    arrays: dict[str, np.ndarray] = {}
    if splits is not None:
        header |= {
            "class_names": list(splits.train.class_names),
            "train_folder": splits.train.root.name,
            "val_folder": splits.val.root.name,
            "train_class_folders": list(splits.train.folders),
            "val_class_folders": list(splits.val.folders),
        }
        for part, listing in (("train", splits.train), ("val", splits.val)):
            arrays |= {
                f"{part}_names": listing.names,
                f"{part}_offsets": listing.offsets,
                f"{part}_labels": listing.labels,
            }
    arrays["header"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # type: ignore[arg-type]  # numpy types **arrays as the allow_pickle flag
    return buffer.getvalue()


def decode_splits(blob: bytes, data_dir: Path) -> Splits:
    """The listings in ``blob`` under this machine's ``data_dir``; DataError if it holds one."""
    with np.load(io.BytesIO(blob), allow_pickle=False) as arrays:
        header = json.loads(arrays["header"].tobytes())
        if header["error"] is not None:
            raise DataError(header["error"])
        classes = tuple(header["class_names"])
        train, val = (
            ImageListing(
                Path(data_dir) / header[f"{part}_folder"],
                classes,
                arrays[f"{part}_names"],
                arrays[f"{part}_offsets"],
                arrays[f"{part}_labels"],
                tuple(header[f"{part}_class_folders"]),
            )
            for part in ("train", "val")
        )
    return Splits(train, val)


def broadcast_bytes(data: bytes, *, group, is_source: bool) -> bytes:
    """Rank 0's ``data`` on every rank of ``group`` (a gloo group: CPU tensors); two broadcasts."""
    import torch
    import torch.distributed as dist

    size = torch.tensor([len(data) if is_source else 0], dtype=torch.int64)
    dist.broadcast(size, src=0, group=group)
    if is_source:
        buffer = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else None
    else:
        buffer = torch.empty(int(size.item()), dtype=torch.uint8)
    if buffer is None or not buffer.numel():
        return data if is_source else b""
    dist.broadcast(buffer, src=0, group=group)
    return data if is_source else buffer.numpy().tobytes()


def shared_splits(
    data_dir: Path, *, val_fraction: float, seed: int, group, is_main: bool
) -> Splits:
    """The data set's listing, made by rank 0 alone and broadcast to every rank of ``group``.

    ``group`` is None in a one-process run. A listing error on rank 0 is raised on every rank (as
    :class:`DataError`), so no rank waits for a broadcast that never comes.
    """
    if group is None:
        return load_splits(data_dir, val_fraction=val_fraction, seed=seed)
    blob = b""
    if is_main:
        try:
            blob = encode_splits(load_splits(data_dir, val_fraction=val_fraction, seed=seed))
        except DataError as err:
            blob = encode_splits(None, error=str(err))
    return decode_splits(broadcast_bytes(blob, group=group, is_source=is_main), data_dir)
