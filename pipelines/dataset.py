"""The training data of a run: synced from S3 into a folder of its own source, checked, frozen
(``components.s3_sync.staging`` does the syncing and freezing; this module adds the ImageFolder
check and what the pipeline reports).

``stage_dataset(data_uri, workspace)``:

1. ``<workspace>/data/<source key>/mirror`` is the incremental sync target of ``data_uri`` (the
   key is a digest of the URI): two runs of different data never share a folder,
   and a typo in ``data_uri`` lands in a new, empty mirror (the sync then refuses the empty source
   instead of deleting anything). Runs of the same source take turns (a lock file).
2. The mirror must be an ImageFolder with a ``train/`` and a ``val/`` split, each holding class
   folders of images, the ``val/`` classes among ``train/``'s, at least two training classes —
   checked now, not after training (an error names ``data_uri`` and counts each split).
3. The mirror is frozen as ``<workspace>/data/<source key>/<digest>/`` with hard links (no bytes
   copied). The sync never writes into an existing file (it renames new ones into place), so a
   frozen folder stays exactly what was synced while a later run refreshes the mirror: a run
   trains and evaluates on its own data even when another run of the same source syncs meanwhile.

``inspect_dataset(data_uri)`` (the object-store pipeline, where every training node stages the
data on its own disk) only lists the source: the same layout check and the same digest, no
download.

Frozen folders are never deleted by the pipeline (a running job may read one); remove old ones
with ``rm -r <workspace>/data/<source key>/<digest>`` when no run uses them.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.s3_sync import staging
from components.s3_sync.api import sync
from components.s3_sync.one_object import is_archive
from components.s3_sync.s3_uri import is_s3_uri, parse_s3_uri
from components.s3_sync.selection import path_problem
from kfp_ddp.class_names import class_key, twins_problem
from kfp_ddp.image_files import IMAGE_EXTENSIONS, class_images, is_class_image, is_image_file
from pipelines.parameter_errors import ParameterError

SPLITS = ("train", "val")
SPLIT_NAMES = {
    "train": ("train", "training", "trn"),
    "val": ("val", "valid", "validation", "dev", "eval", "test", "testing"),
}
"""Lower-case folder names a data set gives each split (Kaggle's valid/, CIFAR's test/): named
in the error when that split's own name is missing."""


CLASSES_SHOWN = 50
"""Classes whose image counts the data step prints (all are in its metadata)."""
UNUSED_SHOWN = 20
"""Skipped files named in the data step's notes (all are counted)."""
MIN_CLASSES = 2
"""A classifier needs at least two classes in train/ (one class trains nothing)."""


class DatasetLayoutError(ParameterError):
    """The data set is not an ImageFolder with train/ and val/ splits of at least two classes;
    it names ``data_uri`` (``field``), the parameter that points at it."""

    def __init__(self, data_uri: str, fix: str):
        super().__init__("data_uri", data_uri, fix)


@dataclass(frozen=True)
class StagedDataset:
    """Where a run's data is and what the sync did."""

    source: str
    snapshot: Path
    """The frozen folder the run trains and evaluates on."""
    digest: str
    """The digest of the source listing (keys, sizes, ETags)."""
    files: int
    transferred: int
    skipped: int
    deleted: int
    bytes_total: int
    seconds: float
    classes: int
    images: dict[str, dict[str, int]] = field(default_factory=dict)
    """Images per class of each split."""
    unused: list[str] = field(default_factory=list)
    """Files the training skips (``unused_files``)."""
    notes: list[str] = field(default_factory=list)

    def report_lines(self) -> list[str]:
        """The images per class of each split, then the notes (the files to be skipped)."""
        return [per_class(self.images), *self.notes]

    def metadata(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "destination": str(self.snapshot),
            "images": self.images,
            "unused_files": len(self.unused),
            "files": self.files,
            "bytes": self.bytes_total,
            "digest": self.digest,
            "transferred": self.transferred,
            "skipped": self.skipped,
            "deleted": self.deleted,
            "classes": self.classes,
            "seconds": round(self.seconds, 3),
        }

    def summary(self) -> str:
        return (
            f"{self.files} files ({self.classes} classes) from {self.source}: "
            f"{self.transferred} transferred, {self.skipped} unchanged, {self.deleted} deleted "
            f"in {self.seconds:.1f} s; frozen as {self.snapshot}"
        )


def source_key(data_uri: str, endpoint_url: str | None = None) -> str:
    """The folder name of a source (see ``components.s3_sync.staging.source_key``)."""
    del endpoint_url  # the same bucket through another URL is the same data
    return staging.source_key(data_uri)


def snapshot_path(
    workspace: str | os.PathLike, data_uri: str, endpoint_url: str | None, digest: str
) -> Path:
    """The frozen folder of ``data_uri``'s listing ``digest`` in ``workspace``."""
    del endpoint_url
    return staging.snapshot_path(Path(workspace) / "data", data_uri, digest)


def stage_dataset(
    data_uri: str, workspace: str | os.PathLike, *, endpoint_url: str | None = None
) -> StagedDataset:
    """Sync ``data_uri`` into the workspace, check its layout, freeze it (see the module doc)."""
    found: dict[str, Layout] = {}

    def check(mirror: Path) -> None:
        found["layout"] = folder_layout(mirror)
        found["layout"].check(data_uri)

    staged = staging.stage(
        data_uri, Path(workspace) / "data", endpoint_url=endpoint_url, check=check
    )
    layout = found["layout"]
    report = staged.report
    return StagedDataset(
        source=data_uri,
        snapshot=staged.snapshot,
        digest=report.digest,
        files=report.files,
        transferred=report.transferred,
        skipped=report.skipped,
        deleted=report.deleted,
        bytes_total=report.bytes_total,
        seconds=report.seconds,
        classes=len(layout.splits["train"]),
        images=layout.images(),
        unused=layout.unused,
        notes=layout.notes() + refused_note(report.refused, data_uri),
    )


@dataclass(frozen=True)
class ListedDataset:
    """A data set looked at in S3 without downloading it (the object-store pipeline's data step):
    every training node stages it itself, and must find this digest."""

    source: str
    digest: str
    """The digest of the listing (keys, sizes, ETags): the same as a sync of it reports."""
    files: int
    bytes_total: int
    classes: int
    seconds: float
    images: dict[str, dict[str, int]] = field(default_factory=dict)
    """Images per class of each split."""
    unused: list[str] = field(default_factory=list)
    """Files the training skips (``unused_files``)."""
    notes: list[str] = field(default_factory=list)

    def report_lines(self) -> list[str]:
        """The images per class of each split, then the notes (the files to be skipped)."""
        return [per_class(self.images), *self.notes]

    def metadata(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "images": self.images,
            "unused_files": len(self.unused),
            "files": self.files,
            "bytes": self.bytes_total,
            "digest": self.digest,
            "classes": self.classes,
            "seconds": round(self.seconds, 3),
        }

    def summary(self) -> str:
        return (
            f"{self.files} files ({self.classes} classes) in {self.source}, listed in "
            f"{self.seconds:.1f} s (digest {self.digest[:16]}); each training node stages them"
        )


def inspect_dataset(data_uri: str, *, endpoint_url: str | None = None) -> ListedDataset:
    """List ``data_uri`` (a dry-run sync into a folder that does not exist: nothing is written)
    and check its layout."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="kfp-ddp-inspect-") as tmp:
        report = sync(
            data_uri, Path(tmp) / "none", endpoint_url=endpoint_url, dry_run=True, progress=False
        )
    layout = listing_layout(report.would_transfer)
    return ListedDataset(
        source=data_uri,
        digest=report.digest,
        files=report.files,
        bytes_total=report.bytes_total,
        classes=layout.check(data_uri),
        seconds=report.seconds,
        images=layout.images(),
        unused=layout.unused,
        notes=layout.notes() + refused_note(report.refused, data_uri),
    )


def _classes(split: Path) -> dict[str, int]:
    """Class folder → number of images in it (``class_images``: its sub-folders' too)."""
    found = {}
    for entry in sorted(os.scandir(split), key=lambda e: e.name):
        if entry.is_dir() and not entry.name.startswith("."):
            found[entry.name] = sum(1 for _ in class_images(entry.path))
    return found


def folder_layout(folder: Path) -> Layout:
    """The layout of a local folder: split → class → images (splits missing are left out)."""
    keys = []
    for split in SPLITS:
        for path in (folder / split).rglob("*") if (folder / split).is_dir() else ():
            if path.is_file():
                keys.append(path.relative_to(folder).as_posix())
    tops = sorted(p for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []
    return Layout(
        splits={split: _classes(folder / split) for split in SPLITS if (folder / split).is_dir()},
        top=[p.name for p in tops],
        unused=unused_files(keys),
        unsplit=[
            p.name
            for p in tops
            if p.name not in SPLITS
            and any(f.is_file() and is_image_file(f.name) for f in p.iterdir())
        ],
        nested=[p.name for p in tops if any((p / split).is_dir() for split in SPLITS)],
        grouped=[
            p.name
            for p in tops
            if p.name not in SPLITS
            and not any((p / split).is_dir() for split in SPLITS)
            and any(
                c.is_dir() and any(f.is_file() and is_image_file(f.name) for f in c.iterdir())
                for c in p.iterdir()
                if not c.name.startswith(".")
            )
        ],
        top_files=sorted(
            p.name for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")
        )
        if folder.is_dir()
        else [],
        outside=files_beside_splits(_paths_beside_splits(folder)),
    )


def _paths_beside_splits(folder: Path) -> Iterator[str]:
    """The files of ``folder`` outside train/ and val/, relative to it (as S3 keys are)."""
    for path in folder.iterdir() if folder.is_dir() else ():
        if path.name in SPLITS:
            continue
        if path.is_file():
            yield path.name
        for top, _, files in os.walk(path):  # nothing for a file
            yield from (Path(top, name).relative_to(folder).as_posix() for name in files)


def files_beside_splits(keys: Iterable[str]) -> dict[str, int]:
    """``Layout.outside`` from the paths of a data set's files (hidden tops left out)."""
    outside: dict[str, int] = {}
    for key in keys:
        top, below, _ = key.partition("/")
        if top in SPLITS or top.startswith("."):
            continue
        name = f"{top}/" if below else top
        outside[name] = outside.get(name, 0) + 1
    return dict(sorted(outside.items()))


def unused_files(keys: Iterable[str]) -> list[str]:
    """The keys under train/ and val/ that the training does not read: not an image by their
    extension, hidden (``.DS_Store``), not in a class folder, or in a hidden folder."""
    unused = []
    for key in keys:
        parts = key.split("/")
        if parts[0] not in SPLITS or len(parts) < 2:
            continue
        if not is_class_image(parts[1:]):
            unused.append(key)
    return sorted(unused)


def listing_layout(keys: Iterable[str]) -> Layout:
    """The layout of an S3 listing (paths relative to the data set): the same view as
    ``folder_layout`` of its download, without downloading."""
    keys = list(keys)
    splits: dict[str, dict[str, int]] = {}
    top: set[str] = set()
    unsplit: set[str] = set()
    nested: set[str] = set()
    grouped: set[str] = set()
    top_files = sorted(key for key in keys if "/" not in key and not key.startswith("."))
    for key in keys:
        parts = key.split("/")
        if len(parts) < 2 or any(part.startswith(".") for part in parts):
            continue
        top.add(parts[0])
        if parts[0] not in SPLITS and len(parts) == 2 and is_image_file(parts[1]):
            unsplit.add(parts[0])
        if len(parts) >= 3 and parts[1] in SPLITS:
            nested.add(parts[0])
        elif parts[0] not in SPLITS and len(parts) == 3 and is_image_file(parts[2]):
            grouped.add(parts[0])
        if parts[0] not in SPLITS or len(parts) < 3:
            continue
        classes = splits.setdefault(parts[0], {})
        classes.setdefault(parts[1], 0)
        if is_class_image(parts[1:]):
            classes[parts[1]] += 1
    for split in top & set(SPLITS):
        splits.setdefault(split, {})
    return Layout(
        splits={k: dict(sorted(v.items())) for k, v in splits.items()},
        top=sorted(top),
        unused=unused_files(keys),
        unsplit=sorted(unsplit),
        nested=sorted(nested),
        grouped=sorted(grouped - nested),
        top_files=top_files,
        outside=files_beside_splits(keys),
    )


def refused_note(refused: Iterable[str], data_uri: str) -> list[str]:
    """The keys a sync refuses to write (:func:`components.s3_sync.selection.path_problem`: a
    backslash, a '..' segment, a name too long for a file system...), named with why: no node
    can stage them, so the training skips them as it skips files that are not images."""
    prefix = parse_s3_uri(data_uri, name="data_uri").prefix if is_s3_uri(data_uri) else ""
    named = []
    for key in sorted(refused):
        rel = key[len(prefix) :] if key.startswith(prefix) else key
        why = path_problem(rel) or "it clashes with another key"
        named.append(f"{rel!r} ({why})")
    if not named:
        return []
    return [
        f"{len(named)} key(s) cannot be files on a training node and will be skipped: "
        f"{_first(named, UNUSED_SHOWN)}; rename them under {data_uri.rstrip('/')}/ to train on "
        "them"
    ]


def _first(names: list[str], shown: int) -> str:
    """'a, b, c' or, past ``shown`` names, 'a, b and 7 more'."""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


@dataclass(frozen=True)
class Layout:
    """What a data set holds: for each split present, its class folders and their images."""

    splits: dict[str, dict[str, int]]
    top: list[str]
    """The top-level folders (named in the error when a split is missing)."""
    unused: list[str] = field(default_factory=list)
    """Files under train/ and val/ that the training skips (``unused_files``)."""
    unsplit: list[str] = field(default_factory=list)
    """Top-level folders besides train/ and val/ that hold images themselves: class folders of
    a data set not yet split (named in the error when a split is missing)."""
    nested: list[str] = field(default_factory=list)
    """Top-level folders that hold a train/ or val/ folder: the data set one level down (named
    in the error when a split is missing)."""
    grouped: list[str] = field(default_factory=list)
    """Top-level folders besides train/ and val/ that hold class folders of images: the data set
    not yet split, one level down (Food-101's images/; named in the error when a split is
    missing)."""
    top_files: list[str] = field(default_factory=list)
    """The files at the top, beside the folders (named in the error when a split is missing:
    an archive of the data set, uploaded as it is)."""
    outside: dict[str, int] = field(default_factory=dict)
    """What lies beside train/ and val/ (``name/`` with its number of files, or a file's name
    with 1; hidden ones left out): the training does not read it, the staging downloads it
    (Kaggle's and ImageNet's unlabeled test/, a README, ``__MACOSX/`` from a Mac's zip)."""

    def notes(self) -> list[str]:
        """What the data step says besides the counts: the files it will skip, and the training
        classes that val/ has no images of, named."""
        return self._unused_note() + self._outside_note() + self._unscored_note()

    def _outside_note(self) -> list[str]:
        if not self.outside:
            return []
        shown = [
            f"{name} ({count} file{'s' if count > 1 else ''})" if name.endswith("/") else name
            for name, count in self.outside.items()
        ]
        return [
            f"{sum(self.outside.values())} file(s) beside train/ and val/ are not trained on, "
            f"but every staging of the data set downloads them: {_first(shown, UNUSED_SHOWN)}; "
            "keep only train/ and val/ under the data set's prefix to save that"
        ]

    def _unused_note(self) -> list[str]:
        if not self.unused:
            return []
        return [
            f"{len(self.unused)} file(s) are not images in a class folder and will be skipped: "
            f"{_first(self.unused, UNUSED_SHOWN)} (images are {', '.join(IMAGE_EXTENSIONS)} in "
            "<split>/<class>/ or its sub-folders)"
        ]

    def _contents(self) -> str:
        """What the top holds, for the refusal of a missing split: its folders, or its files."""
        if self.top or not self.top_files:
            return str(self.top or "nothing")
        return f"no folders, only the files {_first([repr(n) for n in self.top_files], 5)}"

    def _missing_split_hint(self, split: str, root: str) -> str:
        """What the user likely meant, when ``split`` is missing: an archive of the data set, the
        data set one folder down, the split under another name, or class folders not yet split
        (at the top, or one folder down)."""
        archives = [name for name in self.top_files if is_archive(name)]
        if archives and not self.top:
            return (
                f"; {archives[0]!r} is an archive, which the pipeline does not unpack: unpack "
                f"it and upload its train/ and val/ folders under {root}/"
            )
        if self.nested:
            below = self.nested[0]
            return f"; {below!r} holds the splits itself: set data_uri to {root}/{below}"
        renames = self._split_renames()
        if split in renames:  # every split under another name at once (Train/ and Val/)
            shown = " and ".join(
                f"{name!r} to {each}/"
                + (" (images kept out of the training)" if each == "val" else "")
                for each, name in renames.items()
            )
            return f"; rename {shown}: the pipeline reads these names"
        if self.grouped and not self.unsplit:
            below = self.grouped[0]
            return (
                f"; {below!r} holds class folders of images without a train/val split: move "
                f"each to {root}/train/<class>/ and some of each class's images (one in five, "
                f"say) to {root}/val/<class>/"
            )
        return self._split_hint(root)

    def _split_renames(self) -> dict[str, str]:
        """Each missing split and the folder at the top that likely is it (``SPLIT_NAMES``)."""
        renames = {}
        for split, aliases in SPLIT_NAMES.items():
            named = [name for alias in aliases for name in self.top if name.lower() == alias]
            if split not in self.top and named:
                renames[split] = named[0]
        return renames

    def _split_hint(self, root: str) -> str:
        """How to split class folders that sit at the top (a data set as often published)."""
        if not self.unsplit:
            return ""
        return (
            f"; {_first([repr(n) for n in self.unsplit], CLASSES_SHOWN)} hold images "
            "themselves: class folders without a train/val split. Move each to "
            f"{root}/train/<class>/ and some of each class's images (one in five, say) to "
            f"{root}/val/<class>/"
        )

    def _unscored_note(self) -> list[str]:
        """Training classes without a val/ folder: the validation and the evaluation gate score
        the model on the other classes (these have support 0), which the user should know
        before the training rather than read in the report after it."""
        train, val = self.splits.get("train", {}), self.splits.get("val", {})
        scored = {class_key(name) for name in val}
        unscored = [repr(name) for name in train if class_key(name) not in scored]
        if not unscored or not val:
            return []
        return [
            f"val/ has no images of {len(unscored)} of the {len(train)} training classes "
            f"({_first(unscored, CLASSES_SHOWN)}): the validation and the evaluation gate score "
            "the model on the others; add val/<class>/ images to score those too"
        ]

    def check(self, data_uri: str) -> int:
        """Raise DatasetLayoutError unless there are train/ and val/ class folders of images, the
        val/ classes among train/'s and at least two training classes; returns the number of
        training classes."""
        root = data_uri.rstrip("/")
        for split in SPLITS:
            if split not in self.splits:
                raise DatasetLayoutError(
                    data_uri,
                    f"has no {split}/ folder (it has {self._contents()}): the pipeline "
                    f"needs {root}/train/<class>/* and {root}/val/<class>/* (val/ is what the "
                    f"evaluation gate scores){self._missing_split_hint(split, root)}",
                )
        for split in SPLITS:
            classes = self.splits[split]
            empty = sorted(name for name, count in classes.items() if count == 0)
            if not classes or empty:
                what = f"class folders without images: {empty}" if empty else "no class folders"
                raise DatasetLayoutError(
                    data_uri,
                    f"{split}/ has {what} ({self.counts()}); each class needs a folder of "
                    f"images (.png, .jpg, ...) under {root}/{split}/<class>/",
                )
        for split in SPLITS:
            twins = twins_problem(self.splits[split])
            if twins:
                raise DatasetLayoutError(data_uri, f"{split}/: {twins} ({self.counts()})")
        trained = {class_key(name) for name in self.splits["train"]}
        unknown = sorted(name for name in self.splits["val"] if class_key(name) not in trained)
        if unknown:
            raise DatasetLayoutError(
                data_uri,
                f"val/ has classes that train/ lacks: {unknown} ({self.counts()}); the model "
                "can only predict the training classes",
            )
        if len(self.splits["train"]) < MIN_CLASSES:
            raise DatasetLayoutError(
                data_uri,
                f"train/ has {len(self.splits['train'])} class {sorted(self.splits['train'])} "
                f"({self.counts()}); a classifier needs at least {MIN_CLASSES}: add a folder "
                f"of images per class under {root}/train/ and {root}/val/",
            )
        return len(self.splits["train"])

    def images(self) -> dict[str, dict[str, int]]:
        """Images per class of each split present."""
        return {split: dict(classes) for split, classes in self.splits.items()}

    def counts(self) -> str:
        """Each split's classes and images, e.g. 'train/: 2 classes, 24 images; val/: none'."""
        parts = []
        for split in SPLITS:
            classes = self.splits.get(split)
            if classes is None:
                parts.append(f"{split}/: missing")
                continue
            images = sum(classes.values())
            parts.append(
                f"{split}/: {len(classes)} class{'es' if len(classes) != 1 else ''}, "
                f"{images} image{'s' if images != 1 else ''}"
            )
        return "; ".join(parts)


def per_class(images: dict[str, dict[str, int]]) -> str:
    """'images per class: train/ cat 12, dog 9; val/ cat 3, dog 3' (the first classes)."""
    parts = []
    for split, classes in images.items():
        first = list(classes.items())[:CLASSES_SHOWN]
        shown = ", ".join(f"{name} {count}" for name, count in first)
        more = f", and {len(classes) - CLASSES_SHOWN} more" if len(classes) > CLASSES_SHOWN else ""
        parts.append(f"{split}/ {shown}{more}")
    return "images per class: " + "; ".join(parts)
