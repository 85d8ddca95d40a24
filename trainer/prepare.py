"""``python -m trainer.prepare SRC DST``: re-encode an ImageFolder's JPEGs to a short side of 256.

For clusters that decode on the CPU (``--decode cpu``): decoding costs roughly in proportion to
the pixels, so ImageNet's ~500x375 originals re-encoded to 341x256 decode about twice as fast,
and the training crops (224 px, area share 0.35-1) lose nothing they would have kept.

* The folder layout is kept: ``SRC/a/b.jpg`` → ``DST/a/b.jpg``. JPEGs whose shorter side is
  above ``--short-side`` are resized (antialiased bicubic) and re-encoded at ``--quality``;
  smaller JPEGs and other image files are copied byte for byte; hidden and non-image files are
  skipped.
* Incremental: a written file carries its source's modification time, and a later run skips files
  whose copy has it. ``DST/.prepare.json`` records the settings; a run with other settings into
  the same DST is refused rather than mixing two encodings.
* Nothing is lost: every file is written atomically (temp name, fsync, rename), SRC is only read,
  and a DST inside SRC is refused (the copy would be listed as training data).

Exit codes: 0 done, 2 bad arguments, 3 unreadable images (listed; the others are still written).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from PIL import Image, ImageOps, UnidentifiedImageError

from kfp_ddp.atomic_files import write_atomic, write_json_atomic
from kfp_ddp.image_files import IMAGE_EXTENSIONS
from trainer.distributed import available_cpus
from trainer.errors import EXIT_CONFIG, EXIT_DATA, EXIT_OK, ConfigError
from trainer.image_modes import to_rgb

MANIFEST = ".prepare.json"
JPEG_EXTENSIONS = (".jpg", ".jpeg")


@dataclass(frozen=True, kw_only=True)
class PrepareOptions:
    """What ``python -m trainer.prepare`` does; validated on construction."""

    source: Path
    """The ImageFolder to read (e.g. DATA with train/<class>/* and val/<class>/*)."""
    destination: Path
    """Where the re-encoded copy goes (created; must not lie inside SOURCE)."""
    short_side: int = 256
    """Resize JPEGs whose shorter side is longer than this many pixels."""
    quality: int = 90
    """JPEG quality of the re-encoded files, 1-95."""
    workers: int | None = None
    """Processes encoding in parallel (default: the CPUs this container may use)."""

    def __post_init__(self) -> None:
        source, destination = Path(self.source).resolve(), Path(self.destination).resolve()
        if not source.is_dir():
            raise ConfigError(f"SRC {self.source} is not a folder; give the ImageFolder to copy")
        if destination == source or source in destination.parents:
            raise ConfigError(
                f"DST {self.destination} lies inside SRC {self.source}: the copy would become "
                "part of the data set; choose a DST outside SRC"
            )
        if self.short_side < 16:
            raise ConfigError(f"--short-side {self.short_side} is too small; use >= 16 pixels")
        if not 1 <= self.quality <= 95:
            raise ConfigError(f"--quality {self.quality} is out of range; use 1-95")
        if self.workers is not None and self.workers < 1:
            raise ConfigError(f"--workers {self.workers} is too small; use >= 1")

    def settings(self) -> dict:
        return {"short_side": self.short_side, "quality": self.quality}


@dataclass
class PrepareReport:
    """What one run did; ``failed`` lists ``path: reason`` of unreadable images."""

    reencoded: int = 0
    copied: int = 0
    up_to_date: int = 0
    failed: list[str] | None = None
    bytes_in: int = 0
    bytes_out: int = 0
    seconds: float = 0.0

    def add(self, outcome: Outcome) -> None:
        if outcome.error is not None:
            self.failed = [*(self.failed or []), outcome.error]
            return
        setattr(self, outcome.kind, getattr(self, outcome.kind) + 1)
        self.bytes_in += outcome.bytes_in
        self.bytes_out += outcome.bytes_out


@dataclass(frozen=True)
class Outcome:
    kind: str  # "reencoded", "copied" or "up_to_date"
    bytes_in: int = 0
    bytes_out: int = 0
    error: str | None = None


# ------------------------------------------------------------------------------------- listing
def image_files(root: Path) -> list[str]:
    """Relative paths of the image files under ``root`` (hidden entries skipped), sorted."""
    found: list[str] = []
    pending = [""]
    while pending:
        relative = pending.pop()
        with os.scandir(root / relative) as entries:
            for entry in entries:
                if entry.name.startswith("."):
                    continue
                path = os.path.join(relative, entry.name)
                if entry.is_dir():
                    pending.append(path)
                elif os.path.splitext(entry.name)[1].lower() in IMAGE_EXTENSIONS:
                    found.append(path)
    return sorted(found)


# ------------------------------------------------------------------------------------ one file
def prepare_file(source: Path, destination: Path, short_side: int, quality: int) -> Outcome:
    """Re-encode or copy one file unless its copy is up to date (runs in a pool process)."""
    try:
        stat = source.stat()
        try:
            if destination.stat().st_mtime_ns == stat.st_mtime_ns:
                return Outcome("up_to_date")
        except FileNotFoundError:
            pass
        data = _reencoded(source, short_side, quality)
        if data is None:
            with open(source, "rb") as handle:
                data = handle.read()
            kind = "copied"
        else:
            kind = "reencoded"
        _write(destination, data, stat.st_mtime_ns)
        return Outcome(kind, stat.st_size, len(data))
    except (OSError, UnidentifiedImageError, ValueError, Image.DecompressionBombError) as err:
        return Outcome("failed", error=f"{source}: {err}")


def _reencoded(source: Path, short_side: int, quality: int) -> bytes | None:
    """The resized JPEG's bytes, or None when the file is to be copied as it is."""
    if os.path.splitext(source.name)[1].lower() not in JPEG_EXTENSIONS:
        return None
    import io

    with Image.open(source) as image:
        width, height = image.size
        if min(width, height) <= short_side:
            return None
        scale = short_side / min(width, height)
        stored = (max(1, round(width * scale)), max(1, round(height * scale)))
        # Let libjpeg decode at 1/2, 1/4 or 1/8 scale where that still leaves >= size pixels.
        image.draft(image.mode if image.mode in ("RGB", "L") else "RGB", stored)
        image.load()
        # upright (the copy keeps no EXIF orientation); grey stays grey, a third of the bytes
        picture = ImageOps.exif_transpose(image) if image.mode == "L" else to_rgb(image)
        turned = (picture.width > picture.height) != (width > height)  # a quarter turn
        size = stored[::-1] if turned else stored
        resized = picture.resize(size, Image.Resampling.BICUBIC)
    buffer = io.BytesIO()
    resized.save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue()


def _write(destination: Path, data: bytes, mtime_ns: int) -> None:
    def write(handle) -> None:
        handle.write(data)
        handle.flush()
        # The source's mtime marks the copy as up to date; set before the rename makes it visible.
        os.utime(handle.fileno(), ns=(mtime_ns, mtime_ns))

    write_atomic(destination, write)


def _prepare_one(args: tuple[str, str, str, int, int]) -> Outcome:
    source_root, destination_root, relative, short_side, quality = args
    return prepare_file(
        Path(source_root, relative), Path(destination_root, relative), short_side, quality
    )


# ------------------------------------------------------------------------------------- the run
def _check_manifest(options: PrepareOptions) -> None:
    manifest = Path(options.destination) / MANIFEST
    if not manifest.exists():
        return
    try:
        recorded = json.loads(manifest.read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(
            f"{manifest} is unreadable ({err}); remove it or choose a new DST"
        ) from err
    if recorded != options.settings():
        raise ConfigError(
            f"DST {options.destination} was prepared with {recorded}, this run asks for "
            f"{options.settings()}; choose a new DST or run with the recorded settings"
        )


def prepare(options: PrepareOptions, progress=None) -> PrepareReport:
    """Copy ``options.source`` to ``options.destination`` re-encoded; see the module doc."""
    _check_manifest(options)
    began = time.perf_counter()
    source = Path(options.source)
    destination = Path(options.destination)
    files = image_files(source)
    write_json_atomic(destination / MANIFEST, options.settings())
    report = PrepareReport()
    tasks = [
        (str(source), str(destination), relative, options.short_side, options.quality)
        for relative in files
    ]
    workers = options.workers or _default_workers()
    if workers == 1:
        outcomes = map(_prepare_one, tasks)
        for outcome in outcomes:
            report.add(outcome)
    else:
        # Spawned, not forked: a caller may run threads (a fork can copy a held lock).
        spawn = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=workers, mp_context=spawn) as pool:
            for done, outcome in enumerate(pool.map(_prepare_one, tasks, chunksize=64), 1):
                report.add(outcome)
                if progress is not None and done % 1000 == 0:
                    progress(done, len(tasks))
    report.seconds = time.perf_counter() - began
    return report


def _default_workers() -> int:

    return available_cpus()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainer.prepare",
        description="Re-encode an ImageFolder's JPEGs to a smaller short side (faster CPU decode).",
    )
    parser.add_argument("source", type=Path, metavar="SRC", help="the ImageFolder to read")
    parser.add_argument("destination", type=Path, metavar="DST", help="where the copy goes")
    parser.add_argument("--short-side", type=int, default=256, help="default: 256 pixels")
    parser.add_argument("--quality", type=int, default=90, help="JPEG quality 1-95 (default 90)")
    parser.add_argument("--workers", type=int, help="processes (default: the usable CPUs)")
    args = parser.parse_args(argv)  # exits 2 on malformed flags
    try:
        options = PrepareOptions(
            source=args.source,
            destination=args.destination,
            short_side=args.short_side,
            quality=args.quality,
            workers=args.workers,
        )
        report = prepare(
            options, progress=lambda done, total: print(f"[prepare] {done}/{total}", flush=True)
        )
    except ConfigError as err:
        print(f"[prepare] error: {err}", file=sys.stderr)
        return EXIT_CONFIG
    summary = asdict(report) | {"failed": len(report.failed or [])}
    print(f"[prepare] {json.dumps(summary)}", flush=True)
    for failure in report.failed or []:
        print(f"[prepare] unreadable: {failure}", file=sys.stderr)
    if report.failed:
        print(
            f"[prepare] error: {len(report.failed)} unreadable image(s) were not written; fix or "
            "delete them in SRC and run again",
            file=sys.stderr,
        )
        return EXIT_DATA
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
