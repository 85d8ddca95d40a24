"""The file list: listed with scandir, held in arrays, made by rank 0 alone and broadcast."""

from __future__ import annotations

import json
import os
import pickle
import random
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
import torch

from tests.image_data import write_image_folder
from tests.trainer.trainer_launch import REPO, TINY, base_env, free_port, logs, wait_all
from trainer.errors import DataError
from trainer.listing import (
    IMAGE_EXTENSIONS,
    ImageListing,
    decode_splits,
    encode_splits,
    load_splits,
    scan_split,
    shared_splits,
    split_train_val,
)
from trainer.randomness import derive_seed


def _old_listing(split_dir: Path) -> list[tuple[Path, int]]:
    """What the trainer listed before (Path objects, is_file() per file): the order to keep."""
    folders = sorted(p for p in split_dir.iterdir() if p.is_dir() and not p.name.startswith("."))
    items = []
    for label, folder in enumerate(folders):
        files = sorted(
            p
            for p in folder.iterdir()
            if p.is_file() and not p.name.startswith(".") and p.suffix.lower() in IMAGE_EXTENSIONS
        )
        items.extend((path, label) for path in files)
    return items


def _old_split(items, fraction, seed):
    by_class: dict[int, list] = {}
    for item in items:
        by_class.setdefault(item[1], []).append(item)
    rng = random.Random(derive_seed(seed, "val-split"))
    train, val = [], []
    for label in sorted(by_class):
        members = list(by_class[label])
        rng.shuffle(members)
        n_val = min(len(members) - 1, max(1, round(len(members) * fraction)))
        val.extend(members[:n_val])
        train.extend(members[n_val:])
    return sorted(train), sorted(val)


def test_scan_keeps_the_old_order_and_skips_what_is_not_an_image(tmp_path):
    root = write_image_folder(tmp_path / "data", per_class=5)
    train = root / "train"
    (train / ".cache").mkdir()  # hidden folder: not a class
    (train / ".cache" / "x.png").write_bytes(b"")
    (train / "circle" / ".hidden.png").write_bytes(b"")
    (train / "circle" / "notes.txt").write_text("not an image")
    (train / "circle" / "folder.jpg").mkdir()  # a directory with an image name
    (train / "square" / "UPPER.JPEG").write_bytes((train / "square" / "train-000.png").read_bytes())
    odd = os.fsdecode(b"caf\xe9-\xff.png")  # not UTF-8: must survive the byte buffer
    (train / "stripe" / odd).write_bytes((train / "stripe" / "train-000.png").read_bytes())

    listing = scan_split(train)
    assert listing.items() == _old_listing(train)
    assert listing.class_names == ("circle", "square", "stripe")
    assert Path(listing.path(len(listing) - 1)).name == "train-004.png"
    assert any(listing.name(i) == odd for i in range(len(listing)))
    assert listing.labels.dtype.name == "int32" and listing.names.dtype.name == "uint8"


def test_listing_errors_name_the_folder(tmp_path, image_folder):
    with pytest.raises(DataError, match="does not exist"):
        scan_split(tmp_path / "nope")
    with pytest.raises(DataError, match="not one of the training classes"):
        scan_split(image_folder / "val", ["circle"])
    (image_folder / "train" / "empty").mkdir()
    with pytest.raises(DataError, match=str(image_folder / "train" / "empty")):
        scan_split(image_folder / "train")


def test_split_and_select_match_the_old_split(tmp_path):
    root = write_image_folder(tmp_path / "d", val_per_class=None, per_class=11)
    listing = scan_split(root / "train")
    for seed in (0, 3):
        train, val = split_train_val(listing, 0.2, seed)
        assert (train.items(), val.items()) == _old_split(listing.items(), 0.2, seed)
    picked = listing.select([5, 0, 20])
    assert picked.items() == [listing.items()[i] for i in (5, 0, 20)]


def _unpickled_bytes(data: bytes) -> int:
    tracemalloc.start()
    try:
        kept = pickle.loads(data)
        return tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
        del kept


@pytest.mark.slow
def test_a_big_listing_costs_workers_a_small_fraction_of_path_objects():
    names = [f"n{c:08d}_{i}.JPEG" for c in range(100) for i in range(1000)]
    labels = [c for c in range(100) for _ in range(1000)]
    classes = [f"n{c:08d}" for c in range(100)]
    listing = ImageListing.from_names(Path("/data/train"), classes, names, labels)
    compact = pickle.dumps(listing)
    assert len(compact) < 30 * len(names)  # 17 bytes of name + 8 of offset + 4 of label each
    # What a spawned DataLoader worker holds once it has unpickled its dataset.
    as_paths = pickle.dumps([(Path(listing.path(i)), listing.label(i)) for i in range(len(names))])
    assert _unpickled_bytes(compact) * 5 < _unpickled_bytes(as_paths)
    assert listing.path(23_456) == str(Path("/data/train", classes[23], names[23_456]))


def test_the_broadcast_blob_round_trips_and_carries_errors(tmp_path, image_folder):
    splits = load_splits(image_folder, val_fraction=0.1, seed=0)
    other_root = tmp_path / "elsewhere"
    copy = decode_splits(encode_splits(splits), other_root)
    assert copy.class_names == splits.class_names
    assert [p.relative_to(other_root) for p, _ in copy.train.items()] == [
        p.relative_to(image_folder) for p, _ in splits.train.items()
    ]
    assert copy.val.root == other_root / "val"
    with pytest.raises(DataError, match="no class folders in /x"):
        decode_splits(encode_splits(None, error="no class folders in /x"), other_root)


CAFE_NFC, CAFE_NFD = "caf\u00e9", "cafe\u0301"  # 'café' composed (Linux) and decomposed (macOS)


def test_a_val_folder_spelt_in_nfd_is_its_nfc_training_class(tmp_path):
    """val/ uploaded from a Mac (NFD) of a class trained from Linux (NFC): the same class, read
    from its own folder, on every rank (the broadcast carries the folder's spelling)."""
    root = write_image_folder(tmp_path / "d", classes=(CAFE_NFC, "tea"), val_per_class=2)
    (root / "val" / CAFE_NFC).rename(root / "val" / CAFE_NFD)

    splits = load_splits(root, val_fraction=0.1, seed=0)
    assert splits.class_names == [CAFE_NFC, "tea"]
    for copy in (splits, decode_splits(encode_splits(splits), root)):
        paths = [path for path, label in copy.val.items() if label == 0]
        assert len(paths) == 2 and all(p.parent.name == CAFE_NFD and p.is_file() for p in paths)
    assert splits.train.folders == ()  # each folder named as its class


def test_one_class_spelt_two_ways_is_refused_naming_both(tmp_path):
    root = write_image_folder(tmp_path / "d", classes=(CAFE_NFC, CAFE_NFD, "tea"), per_class=2)
    with pytest.raises(DataError) as refused:
        load_splits(root, val_fraction=0.1, seed=0)
    said = str(refused.value)
    assert f"{root / 'train'}: class folders {CAFE_NFD!r} (NFD) and {CAFE_NFC!r} (NFC) are " in said
    assert "they would train as two classes" in said and "move the images of one into" in said


# ----------------------------------------------------------------------------- two real ranks
def _rank_main(rank: int, port: int, data_dirs: list[str], out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2)
    try:
        if rank == 1:  # rank 1 must not list anything: make every attempt fail loudly
            os.scandir = os.listdir = _refuse  # type: ignore[assignment]
        try:
            splits = shared_splits(
                Path(data_dirs[rank]),
                val_fraction=0.25,
                seed=1,
                group=torch.distributed.group.WORLD,
                is_main=rank == 0,
            )
            result = {
                "train": [[str(p), label] for p, label in splits.train.items()],
                "val": [[str(p), label] for p, label in splits.val.items()],
            }
        except DataError as err:
            result = {"error": str(err)}
        Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        torch.distributed.destroy_process_group()


def _refuse(*args, **kwargs):
    raise PermissionError(13, "this rank must not list folders", args[0] if args else ".")


def _share(tmp_path, data_dirs) -> list[dict]:
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    torch.multiprocessing.spawn(
        _rank_main, args=(free_port(), [str(d) for d in data_dirs], str(out)), nprocs=2
    )
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def test_rank1_gets_rank0s_listing_without_listing_anything(tmp_path):
    data = write_image_folder(tmp_path / "data", val_per_class=None, per_class=8)
    rank1_dir = tmp_path / "rank1-data"  # does not even exist: rank 1 only joins names to it
    rank0, rank1 = _share(tmp_path, [data, rank1_dir])
    assert "error" not in rank0 and "error" not in rank1
    assert len(rank0["train"]) == 18 and len(rank0["val"]) == 6
    for part in ("train", "val"):
        assert [[str(Path(p).relative_to(data)), label] for p, label in rank0[part]] == [
            [str(Path(p).relative_to(rank1_dir)), label] for p, label in rank1[part]
        ]


def test_a_listing_error_on_rank0_reaches_every_rank(tmp_path):
    empty = tmp_path / "empty"
    (empty / "train").mkdir(parents=True)
    rank0, rank1 = _share(tmp_path, [empty, tmp_path / "unused"])
    assert rank0["error"] == rank1["error"]
    assert rank0["error"].startswith(f"no class folders in {empty / 'train'}")


_GUARD = """
import os, runpy, sys
blocked = os.path.realpath(sys.argv.pop(1))
def guard(real):
    def listing(path=".", *args, **kwargs):
        full = os.path.realpath(os.fsdecode(path)) if not isinstance(path, int) else ""
        if full == blocked or full.startswith(blocked + os.sep):
            raise PermissionError(13, "this rank must not list the data folder", full)
        return real(path, *args, **kwargs)
    return listing
os.scandir, os.listdir = guard(os.scandir), guard(os.listdir)
sys.argv[0] = "trainer.train"
runpy.run_module("trainer.train", run_name="__main__", alter_sys=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "data_path",
    [
        (),
        ("--cache-images", "never", "--num-workers", "1"),
    ],
    ids=["cached-in-memory", "streamed-by-a-worker"],
)
def test_two_rank_training_where_rank1_cannot_list_the_data(tmp_path, data_path):
    data = write_image_folder(tmp_path / "data")
    guard = tmp_path / "guard.py"
    guard.write_text(_GUARD)
    port = free_port()
    procs = []
    (tmp_path / "logs").mkdir()
    for rank in range(2):
        out = tmp_path / f"out{rank}"
        args = ["--data-dir", data, "--output-dir", out, *TINY, "--batch-size", "4"]
        args += ["--max-steps", "3", "--deterministic", "--device", "cpu", *data_path]
        env = base_env() | {
            "RANK": str(rank),
            "WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
        command = [sys.executable, "-m", "trainer.train"]
        if rank == 1:
            command = [sys.executable, str(guard), str(data)]
        log = open(tmp_path / "logs" / f"rank{rank}.log", "wb")  # noqa: SIM115
        procs.append(
            subprocess.Popen([*command, *map(str, args)], cwd=REPO, env=env, stdout=log, stderr=log)
        )
    assert wait_all(procs) == [0, 0], logs(tmp_path / "logs")
    summary = json.loads((tmp_path / "out0" / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["replicas_in_sync"] is True


def test_the_guard_does_stop_a_rank_that_lists(tmp_path):
    """Control for the test above: the same guard on a one-process run fails (exit 3)."""
    data = write_image_folder(tmp_path / "data")
    guard = tmp_path / "guard.py"
    guard.write_text(_GUARD)
    args = ["--data-dir", data, "--output-dir", tmp_path / "out", *TINY, "--max-steps", "1"]
    result = subprocess.run(
        [sys.executable, str(guard), str(data), *map(str, args)],
        cwd=REPO,
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 3, result.stderr
    assert "this rank must not list the data folder" in result.stderr
