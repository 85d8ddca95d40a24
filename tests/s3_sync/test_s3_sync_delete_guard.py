"""``delete`` does not lose data by mistake: an empty source is refused, deletions beyond
``max_delete`` (by default: half of the destination, however small, never all of it) are
refused, both before anything changes, and a dry run lists what would go (against the real
server)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from components.s3_sync import S3SyncError, S3SyncUsageError, SyncOptions, sync
from components.s3_sync.delete_guard import DeleteLimit, DeletionsRefused
from tests.s3_sync.s3_helpers import list_keys, put_objects, read_tree
from tests.s3_sync.test_s3_sync_errors import _cli


def _fill(folder, count: int, prefix: str = "old") -> dict[str, bytes]:
    files = {f"{prefix}/{i:03d}.png": f"{prefix} {i}".encode() for i in range(count)}
    for rel, body in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(body)
    return files


def test_empty_source_with_delete_is_refused_and_nothing_deleted(s3_env, bucket, tmp_path):
    """The issue's typo: `s3://bucket/typo DEST --delete` used to delete all 60 files, exit 0."""
    s3_env.client().put_object(Bucket=bucket, Key="data/a.png", Body=b"a")
    dest = tmp_path / "data"
    before = _fill(dest, 60)
    with pytest.raises(S3SyncUsageError) as err:
        sync(f"s3://{bucket}/dta", dest, delete=True)
    message = str(err.value)
    assert f"s3://{bucket}/dta/" in message and "empty source" in message
    assert "nothing was changed" in message and "--max-delete 100%" in message
    assert read_tree(dest) == before
    # the CLI says the same and exits 2
    proc = _cli(f"s3://{bucket}/dta", str(dest), "--delete")
    assert proc.returncode == 2 and "empty source" in proc.stderr and proc.stdout == ""
    assert "Traceback" not in proc.stderr and read_tree(dest) == before
    # also when the filters select nothing of a source that has objects but some local files
    (dest / "extra.jpg").write_bytes(b"local only")
    with pytest.raises(S3SyncUsageError, match="empty source"):
        sync(f"s3://{bucket}/data", dest, delete=True, include=["*.jpg"])
    assert read_tree(dest) == before | {"extra.jpg": b"local only"}
    # filters that select nothing on either side delete nothing: nothing to refuse
    report = sync(f"s3://{bucket}/data", dest, delete=True, include=["*.gif"])
    assert report.deleted == 0
    (dest / "extra.jpg").unlink()
    # emptying on purpose: explicit consent
    report = sync(f"s3://{bucket}/dta", dest, delete=True, max_delete="100%")
    assert report.deleted == 60 and read_tree(dest) == {}


def test_empty_source_onto_an_empty_destination_deletes_nothing_and_passes(
    s3_env, bucket, tmp_path
):
    """Nothing to delete, nothing to refuse: a first mirror of an empty prefix just works."""
    dest = tmp_path / "markers"
    dest.mkdir()
    report = sync(f"s3://{bucket}/nothing-yet", dest, delete=True)
    assert (report.files, report.deleted) == (0, 0) and read_tree(dest) == {}
    empty = tmp_path / "empty"
    empty.mkdir()
    report = sync(empty, f"s3://{bucket}/also-empty", delete=True)
    assert report.deleted == 0 and list_keys(s3_env.client(), bucket) == {}
    # but one file in the destination is enough for the guard to stand again
    (dest / "a.bin").write_bytes(b"a")
    with pytest.raises(S3SyncUsageError, match="empty source"):
        sync(f"s3://{bucket}/nothing-yet", dest, delete=True)
    assert read_tree(dest) == {"a.bin": b"a"}


def test_empty_upload_source_with_delete_is_refused(s3_env, bucket, tmp_path):
    objects = {f"models/run/{i}.bin": b"weights" for i in range(3)}
    put_objects(s3_env.client(), bucket, objects)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(S3SyncUsageError) as err:
        sync(empty, f"s3://{bucket}/models/run", delete=True)
    assert str(empty) in str(err.value) and "3 objects" in str(err.value)
    assert list_keys(s3_env.client(), bucket) == objects
    # a missing source folder is an error too, and deletes nothing
    with pytest.raises(S3SyncError, match="does not exist"):
        sync(tmp_path / "missing", f"s3://{bucket}/models/run", delete=True)
    assert list_keys(s3_env.client(), bucket) == objects


def test_deleting_most_of_the_destination_needs_max_delete(s3_env, bucket, tmp_path):
    """A wrong but non-empty source would replace everything: refused, nothing transferred."""
    put_objects(s3_env.client(), bucket, {f"other/{i}.txt": b"x" for i in range(5)})
    dest = tmp_path / "data"
    before = _fill(dest, 30)
    with pytest.raises(S3SyncUsageError) as err:
        sync(f"s3://{bucket}/other", dest, delete=True)
    message = str(err.value)
    assert "refusing --delete" in message and "30 of the 30 files" in message
    assert str(dest) in message and "--max-delete 30" in message and "--dry-run" in message
    assert "nothing was changed" in message
    assert read_tree(dest) == before  # no deletion and no download either
    proc = _cli(f"s3://{bucket}/other", str(dest), "--delete")
    assert proc.returncode == 2 and "--max-delete" in proc.stderr
    # a count just below what is needed is refused; the count itself is enough
    with pytest.raises(S3SyncUsageError, match="max_delete=29"):
        sync(f"s3://{bucket}/other", dest, delete=True, max_delete=29)
    assert read_tree(dest) == before
    report = sync(f"s3://{bucket}/other", dest, delete=True, max_delete="30")
    assert report.deleted == 30 and report.transferred == 5
    assert sorted(read_tree(dest)) == [f"{i}.txt" for i in range(5)]


def test_default_limit_and_percentages(s3_env, bucket, tmp_path):
    """Default: up to half of the destination's files; explicit percentages are literal."""
    source = {f"keep/{i:03d}.png": f"keep {i}".encode() for i in range(12)}
    put_objects(s3_env.client(), bucket, source)
    dest = tmp_path / "d"
    _fill(dest, 24, prefix="keep")  # 12 of them are in the source, 12 are not
    for path in list(dest.rglob("*.png")):
        path.rename(dest / path.name)  # keep/000.png -> 000.png, as the source has them
    assert sync(f"s3://{bucket}/keep", dest, delete=True, dry_run=True).deleted == 12  # 50%
    _fill(dest, 1, prefix="more")  # 13 of 25 would go: more than half
    with pytest.raises(S3SyncUsageError, match="13 of the 25 files"):
        sync(f"s3://{bucket}/keep", dest, delete=True)
    with pytest.raises(S3SyncUsageError, match="max_delete=50% of them"):
        sync(f"s3://{bucket}/keep", dest, delete=True, max_delete="50%")
    report = sync(f"s3://{bucket}/keep", dest, delete=True, max_delete="52%")
    assert report.deleted == 13 and report.transferred == 0 and len(read_tree(dest)) == 12
    small = tmp_path / "small"
    _fill(small, 3, prefix="x")  # 3 of 3: all of them, which no default allows
    with pytest.raises(S3SyncUsageError, match="3 of the 3 files"):
        sync(f"s3://{bucket}/keep", small, delete=True)
    assert len(read_tree(small)) == 3
    report = sync(f"s3://{bucket}/keep", small, delete=True, max_delete="100%")
    assert report.deleted == 3 and report.transferred == 12


def test_upload_deletions_are_limited_too(s3_env, bucket, tmp_path):
    put_objects(s3_env.client(), bucket, {f"m/old-{i}.bin": b"o" for i in range(40)})
    src = tmp_path / "src"
    _fill(src, 2, prefix="new")
    with pytest.raises(S3SyncUsageError, match="40 of the 40 objects"):
        sync(src, f"s3://{bucket}/m", delete=True)
    assert len(list_keys(s3_env.client(), bucket)) == 40  # nothing uploaded, nothing deleted
    report = sync(src, f"s3://{bucket}/m", delete=True, max_delete="100%")
    assert report.deleted == 40 and sorted(list_keys(s3_env.client(), bucket)) == [
        "m/new/000.png",
        "m/new/001.png",
    ]


SOURCE_FILES = {"weights.pt": b"new weights", "model.json": b'{"arch": "new"}'}
"""The issue's source: a folder of 2 files that shares nothing with the destination."""


def _notes(count: int) -> dict[str, bytes]:
    """A destination's other data: ``count`` notes."""
    return {f"notes/{i:02d}.md": f"note {i}".encode() for i in range(count)}


@dataclass
class Sides:
    """A sync's two sides, either direction, and how to read the destination back."""

    source: str
    destination: str
    unit: str
    read: Callable[[], dict[str, bytes]]
    """The destination's files/objects: relative path -> bytes."""


def _sides(direction: str, destination: dict[str, bytes], s3_env, bucket, tmp_path) -> Sides:
    client = s3_env.client()
    local = tmp_path / "folder"
    for rel, body in (destination if direction == "download" else SOURCE_FILES).items():
        (local / rel).parent.mkdir(parents=True, exist_ok=True)
        (local / rel).write_bytes(body)
    remote = SOURCE_FILES if direction == "download" else destination
    put_objects(client, bucket, {f"prefix/{rel}": body for rel, body in remote.items()})
    if direction == "download":
        return Sides(f"s3://{bucket}/prefix", str(local), "files", lambda: read_tree(local))

    def objects() -> dict[str, bytes]:
        keys = list_keys(client, bucket, "prefix/")
        return {key.removeprefix("prefix/"): body for key, body in keys.items()}

    return Sides(str(local), f"s3://{bucket}/prefix", "objects", objects)


def _listed(stderr: str) -> list[str]:
    """The paths a dry run printed as ``would delete``."""
    marker = "s3-sync: would delete "
    return sorted(line[len(marker) :] for line in stderr.splitlines() if line.startswith(marker))


@pytest.mark.parametrize("direction", ["download", "upload"])
@pytest.mark.parametrize("count", [1, 2, 8, 12])
def test_delete_onto_a_small_destination_of_other_data_is_refused(
    direction, count, s3_env, bucket, tmp_path
):
    """However few files the destination holds, --delete never replaces all of them by
    default; the dry run lists what would go; an explicit --max-delete lets it through."""
    sides = _sides(direction, _notes(count), s3_env, bucket, tmp_path)
    before = sides.read()
    assert len(before) == count
    with pytest.raises(DeletionsRefused) as refused:
        sync(sides.source, sides.destination, delete=True)
    message = str(refused.value)
    assert message.startswith("refusing --delete") and sides.destination in message
    assert f"{count} of the {count} {sides.unit}" in message and "nothing was changed" in message
    assert f"--max-delete {count}" in message and "--dry-run" in message
    assert sorted(refused.value.would_delete) == sorted(before)
    assert sides.read() == before  # nothing deleted, nothing transferred
    # the dry run lists what would go, says the real run would be refused, deletes nothing
    proc = _cli(sides.source, sides.destination, "--delete", "--dry-run", "-q")
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert _listed(proc.stderr) == sorted(before)
    error = proc.stderr.splitlines()[-1]
    assert error.startswith("s3-sync: error: refusing --delete")
    assert "the real run would be refused" in error and "Traceback" not in proc.stderr
    assert sides.read() == before
    # explicit consent
    report = sync(sides.source, sides.destination, delete=True, max_delete=str(count))
    assert (report.deleted, report.transferred) == (count, 2)
    assert sides.read() == SOURCE_FILES


def test_the_issues_model_prefix_survives_a_two_file_folder(s3_env, bucket, tmp_path):
    """A --delete sync of a 2-file folder onto a published model's prefix of 8 objects deleted 6
    of them with exit 0; now the CLI refuses (exit 2), names the counts and the fix, and changes
    nothing; a data set that lost up to half its files still syncs by default."""
    published = {f"part-{i}.bin": f"published {i}".encode() for i in range(6)}
    published |= {"weights.pt": b"old weights", "model.json": b'{"arch": "old"}'}
    sides = _sides("upload", published, s3_env, bucket, tmp_path)
    proc = _cli(sides.source, sides.destination, "--delete", "-q")
    assert proc.returncode == 2 and proc.stdout == ""
    assert "refusing --delete: it would remove 6 of the 8 objects in " in proc.stderr
    assert sides.destination in proc.stderr and "--max-delete 6" in proc.stderr
    assert "look first with --dry-run" in proc.stderr
    assert sides.read() == published  # not even the 2 changed files were uploaded
    proc = _cli(sides.source, sides.destination, "--delete", "--max-delete", "6", "-q")
    assert proc.returncode == 0, proc.stderr
    assert sides.read() == SOURCE_FILES
    # half of a destination may still go without --max-delete
    lost = tmp_path / "lost"
    _fill(lost, 4, prefix="data")
    kept = {f"data/{i:03d}.png": f"data {i}".encode() for i in range(2)}
    put_objects(s3_env.client(), bucket, {f"set/{rel}": body for rel, body in kept.items()})
    report = sync(f"s3://{bucket}/set", lost, delete=True)
    assert report.deleted == 2 and read_tree(lost) == kept


@pytest.mark.parametrize("value", ["lots", "-1", "101%", "%", "1.5", -3, True, "5 %x"])
def test_bad_max_delete_values_name_the_knob(value, tmp_path):
    with pytest.raises(S3SyncUsageError, match="max_delete="):
        SyncOptions(source="s3://bkt/p", destination=str(tmp_path), delete=True, max_delete=value)


def test_max_delete_without_delete_is_a_mistake(tmp_path):
    with pytest.raises(S3SyncUsageError, match="--delete"):
        SyncOptions(source="s3://bkt/p", destination=str(tmp_path), max_delete=5)


@pytest.mark.parametrize(
    ("value", "deletions", "existing", "allowed"),
    [
        (None, 0, 0, True),
        (None, 0, 1, True),
        (None, 1, 1, False),  # never all of it, however small
        (None, 1, 2, True),  # half
        (None, 2, 2, False),
        (None, 4, 8, True),
        (None, 5, 8, False),
        (None, 6, 8, False),  # the issue: a 2-file folder onto a model prefix of 8 objects
        (None, 10, 11, False),  # no floor of 10 files any more
        (None, 11, 22, True),
        (0, 0, 5, True),
        (0, 1, 5, False),
        ("7", 7, 7, True),
        ("25%", 25, 100, True),
        ("25%", 3, 10, False),
        ("100%", 60, 60, True),
        ("100%", 1, 1, True),
    ],
)
def test_delete_limit_arithmetic(value, deletions, existing, allowed):
    assert DeleteLimit.parse(value).allows(deletions, existing) is allowed
