"""S3 → local folder against a real SeaweedFS: incremental, verified, filters, delete, digest."""

from __future__ import annotations

import io
import multiprocessing
import os
from pathlib import Path

import pytest
from boto3.s3.transfer import TransferConfig

from components.s3_sync import S3SyncError, SyncReport, sync
from components.s3_sync.hash_cache import hash_cache_path
from tests.s3_sync.s3_helpers import CountingProxy, put_objects, read_tree


@pytest.fixture
def seeded(s3_env, bucket):
    client = s3_env.client()
    objects = {
        "data/train/cat/1.png": b"cat-one",
        "data/train/cat/2.png": b"cat-two-bytes",
        "data/train/dog/1.png": b"dog" * 100,
        "data/val/dog/9.png": b"v",
        "data/empty.bin": b"",
        "data/notes.tmp": b"scratch",
        "other/outside-prefix.txt": b"not under data/",
    }
    put_objects(client, bucket, objects)
    return client, bucket, objects


def test_download_copies_prefix_and_reports(seeded, tmp_path):
    client, bucket, objects = seeded
    report = sync(f"s3://{bucket}/data", tmp_path / "out")
    assert isinstance(report, SyncReport)
    want = {k[len("data/") :]: v for k, v in objects.items() if k.startswith("data/")}
    assert read_tree(tmp_path / "out") == want
    assert (report.transferred, report.skipped, report.deleted, report.refused) == (6, 0, 0, [])
    assert report.files == 6 and report.bytes_total == sum(len(v) for v in want.values())
    assert report.bytes_transferred == report.bytes_total
    assert len(report.digest) == 64 and report.to_dict()["digest"] == report.digest
    # no temp or state file is visible as data
    assert not [p for p in (tmp_path / "out").rglob(".*s3sync*") if p.name.endswith(".tmp")]


def test_noop_resync_lists_once_and_transfers_nothing(seeded, tmp_path, s3_env):
    _, bucket, _ = seeded
    first = sync(f"s3://{bucket}/data/", tmp_path)
    with CountingProxy(s3_env.endpoint_url) as proxy:
        again = sync(f"s3://{bucket}/data/", tmp_path, endpoint_url=proxy.endpoint_url)
    assert again.transferred == 0 and again.skipped == first.files == 6
    assert again.digest == first.digest
    assert proxy.counts["LIST"] == 1
    assert {k: v for k, v in proxy.counts.items() if k != "LIST"} == {}


def test_files_present_without_state_are_hashed_not_fetched(seeded, tmp_path, s3_env):
    _, bucket, _ = seeded
    sync(f"s3://{bucket}/data/", tmp_path)
    hash_cache_path(tmp_path).unlink()
    with CountingProxy(s3_env.endpoint_url) as proxy:
        again = sync(f"s3://{bucket}/data/", tmp_path, endpoint_url=proxy.endpoint_url)
    assert again.transferred == 0 and again.skipped == 6
    assert set(proxy.counts) == {"LIST"}


def test_changed_object_and_changed_local_file_are_refetched(seeded, tmp_path):
    client, bucket, _ = seeded
    first = sync(f"s3://{bucket}/data", tmp_path)
    # same size, new content: only the ETag tells
    client.put_object(Bucket=bucket, Key="data/train/cat/1.png", Body=b"CAT-ONE")
    second = sync(f"s3://{bucket}/data", tmp_path)
    assert second.transferred == 1 and second.skipped == 5
    assert (tmp_path / "train/cat/1.png").read_bytes() == b"CAT-ONE"
    assert second.digest != first.digest
    # a local edit (same size) is repaired from S3
    (tmp_path / "train/dog/1.png").write_bytes(b"DOG" * 100)
    third = sync(f"s3://{bucket}/data", tmp_path)
    assert third.transferred == 1
    assert (tmp_path / "train/dog/1.png").read_bytes() == b"dog" * 100
    assert third.digest == second.digest


def test_digest_is_stable_and_tracks_data(seeded, tmp_path):
    client, bucket, _ = seeded
    a = sync(f"s3://{bucket}/data", tmp_path / "a", dry_run=True)
    b = sync(f"s3://{bucket}/data", tmp_path / "b")
    assert a.digest == b.digest
    client.put_object(Bucket=bucket, Key="data/new.png", Body=b"n")
    c = sync(f"s3://{bucket}/data", tmp_path / "b")
    assert c.digest != b.digest and c.transferred == 1
    client.delete_object(Bucket=bucket, Key="data/new.png")
    d = sync(f"s3://{bucket}/data", tmp_path / "b")
    assert d.digest == b.digest


def test_include_exclude(seeded, tmp_path):
    _, bucket, _ = seeded
    report = sync(f"s3://{bucket}/data", tmp_path, include=["*.png"], exclude=["val/*"])
    assert sorted(read_tree(tmp_path)) == ["train/cat/1.png", "train/cat/2.png", "train/dog/1.png"]
    assert report.files == 3
    only_tmp_excluded = sync(f"s3://{bucket}/data", tmp_path / "x", exclude=["*.tmp"])
    assert "notes.tmp" not in read_tree(tmp_path / "x") and only_tmp_excluded.files == 5


def test_delete_removes_only_extra_files_inside_destination(seeded, tmp_path):
    _, bucket, _ = seeded
    dest = tmp_path / "dest"
    sync(f"s3://{bucket}/data", dest)
    (dest / "stale.txt").write_text("old")
    (dest / "train/cat/stale.png").write_text("old")
    (dest / "keep.tmp").write_text("excluded, so kept")
    outside = tmp_path / "outside.txt"
    outside.write_text("never touched")
    dry = sync(f"s3://{bucket}/data", dest, delete=True, exclude=["keep.tmp"], dry_run=True)
    assert dry.deleted == 2 and (dest / "stale.txt").exists()
    report = sync(f"s3://{bucket}/data", dest, delete=True, exclude=["keep.tmp"])
    assert report.deleted == 2
    assert not (dest / "stale.txt").exists() and not (dest / "train/cat/stale.png").exists()
    assert (dest / "keep.tmp").exists() and outside.read_text() == "never touched"
    # folders emptied by --delete go; folders the source has, or with kept files, stay
    (dest / "gone/deeper").mkdir(parents=True)
    (dest / "gone/deeper/x.txt").write_text("x")
    (dest / "gone/y.txt").write_text("y")
    (dest / "half/sub").mkdir(parents=True)
    (dest / "half/sub/z.txt").write_text("z")
    (dest / "half/keep.tmp").write_text("excluded, so kept")
    (dest / "train/dog/extra.png").write_text("x")
    report = sync(f"s3://{bucket}/data", dest, delete=True, exclude=["*keep.tmp"])
    assert report.deleted == 4
    assert not (dest / "gone").exists() and not (dest / "half/sub").exists()
    assert (dest / "half/keep.tmp").exists() and (dest / "train/dog/1.png").exists()
    # without --delete nothing is removed
    (dest / "again.txt").write_text("x")
    assert sync(f"s3://{bucket}/data", dest).deleted == 0 and (dest / "again.txt").exists()


def test_dry_run_changes_nothing(seeded, tmp_path):
    _, bucket, _ = seeded
    report = sync(f"s3://{bucket}/data", tmp_path / "d", dry_run=True)
    assert report.dry_run and report.transferred == 6 and report.bytes_transferred > 0
    assert not (tmp_path / "d").exists()


def test_folder_markers_empty_unicode_space_keys_and_paging(s3_env, bucket, tmp_path):
    client = s3_env.client()
    objects = {f"many/{i:04d}.txt": str(i).encode() for i in range(1105)}
    objects.update(
        {
            "many/folder/": b"",
            "many/empty-dir/": b"",
            "many/zero.bin": b"",
            "many/ünïcödé/日本語 file.txt": "unicode ✓".encode(),
            "many/with space/a b+c%20d.txt": b"spaces",
            "many/" + "é" * 120 + ".txt": b"a 244-byte file name",  # temp name must still fit
        }
    )
    put_objects(client, bucket, objects)
    report = sync(f"s3://{bucket}/many", tmp_path)
    assert report.files == len(objects) and report.refused == []
    tree = read_tree(tmp_path)
    assert len(tree) == 1105 + 4
    assert tree["é" * 120 + ".txt"] == b"a 244-byte file name"
    assert tree["ünïcödé/日本語 file.txt"] == "unicode ✓".encode()
    assert tree["with space/a b+c%20d.txt"] == b"spaces" and tree["zero.bin"] == b""
    assert (tmp_path / "folder").is_dir() and (tmp_path / "empty-dir").is_dir()
    assert sync(f"s3://{bucket}/many", tmp_path).transferred == 0


def test_multipart_object_is_verified_and_stale_temps_cleaned(s3_env, bucket, tmp_path):
    client = s3_env.client()
    data = os.urandom(21 * 1024 * 1024 + 123)
    config = TransferConfig(multipart_threshold=5 * 2**20, multipart_chunksize=5 * 2**20)
    client.upload_fileobj(io.BytesIO(data), bucket, "big/blob.bin", Config=config)
    assert client.head_object(Bucket=bucket, Key="big/blob.bin")["ETag"].endswith('-5"')
    stale = tmp_path / ".blob.bin.s3sync-0123abcd.tmp"
    tmp_path.mkdir(exist_ok=True)
    stale.write_bytes(b"partial")
    assert sync(f"s3://{bucket}/big", tmp_path, dry_run=True).transferred == 1
    assert stale.exists()  # a dry run changes nothing, not even leftovers
    report = sync(f"s3://{bucket}/big", tmp_path)
    assert report.transferred == 1
    assert (tmp_path / "blob.bin").read_bytes() == data
    assert not stale.exists()
    assert sync(f"s3://{bucket}/big", tmp_path).transferred == 0


@pytest.mark.parametrize("engine", ["classic", "crt"])
def test_both_engines_download_and_verify(seeded, tmp_path, engine):
    _, bucket, objects = seeded
    report = sync(f"s3://{bucket}/data", tmp_path, engine=engine, max_concurrency=4)
    assert report.engine == engine and report.transferred == 6
    assert read_tree(tmp_path)["train/dog/1.png"] == objects["data/train/dog/1.png"]


def test_destination_that_is_a_file_is_an_error(seeded, tmp_path):
    _, bucket, _ = seeded
    target = tmp_path / "file"
    target.write_text("x")
    with pytest.raises(S3SyncError, match="not a folder"):
        sync(f"s3://{bucket}/data", target)


@pytest.mark.parametrize("engine", ["crt", "classic"])
def test_a_disk_too_small_is_named_with_both_sizes_before_any_byte(
    s3_env, bucket, small_disk, engine
):
    """A data set bigger than the volume it is staged onto failed part-way, "No space left on
    device" on some files, the others written."""
    put_objects(
        s3_env.client(), bucket, {f"big/train/a/{i}.png": os.urandom(100_000) for i in range(10)}
    )
    disk = small_disk(300 * 1024)
    with pytest.raises(S3SyncError) as refused:
        sync(f"s3://{bucket}/big", disk / "data", engine=engine)
    assert str(refused.value) == (
        f"not enough room under {disk / 'data'}: the download needs 1,000.0 KiB for 10 file(s) "
        "and the disk has 300.0 KiB free; free space there, or sync onto a bigger volume"
    )
    assert not any(disk.iterdir())  # nothing written, not even the folder


def test_custom_endpoint_by_hostname_uses_path_style(seeded, tmp_path, s3_env, monkeypatch):
    _, bucket, _ = seeded
    # virtual-hosted style would need DNS for <bucket>.localhost; custom endpoints get path style
    url = s3_env.endpoint_url.replace("127.0.0.1", "localhost")
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3")
    monkeypatch.setenv("AWS_ENDPOINT_URL", url)
    assert sync(f"s3://{bucket}/data", tmp_path).transferred == 6
    report = sync(
        f"s3://{bucket}/data", tmp_path / "v", addressing_style="path", region="eu-west-1"
    )
    assert report.transferred == 6


def test_long_names_sharing_a_long_prefix_do_not_share_a_temp_file(s3_env, bucket, tmp_path):
    # Temp names are cut to fit the 255-byte limit; two names alike for the first 200 bytes must
    # still download into separate temp files (and so into the right final files).
    stem = "x" * 200
    bodies = {f"{stem}-{i}.bin": f"body {i}".encode() * 100 for i in range(4)}
    for name, body in bodies.items():
        s3_env.client().put_object(Bucket=bucket, Key=f"long/{name}", Body=body)
    report = sync(f"s3://{bucket}/long", tmp_path / "out")
    assert report.transferred == 4
    assert {n: (tmp_path / "out" / n).read_bytes() for n in bodies} == bodies
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize(
    ("size", "part_size"),
    [(40, None), (300 * 1024, None), (9 * 2**20, None), (11 * 2**20, 5 * 2**20)],
    ids=["in-memory", "streamed", "big-single-part", "big-multipart"],
)
def test_corrupted_download_is_refused_and_nothing_is_written(
    s3_env, bucket, tmp_path, size, part_size
):
    marker = b"FLIP-ME-IN-TRANSIT"
    body = marker + os.urandom(size - len(marker))
    if part_size:
        config = TransferConfig(multipart_threshold=part_size, multipart_chunksize=part_size)
        s3_env.client().upload_fileobj(io.BytesIO(body), bucket, "c/x.bin", Config=config)
    else:
        s3_env.client().put_object(Bucket=bucket, Key="c/x.bin", Body=body)
    s3_env.client().put_object(Bucket=bucket, Key="c/ok.bin", Body=b"fine")
    out = tmp_path / "out"
    with (
        CountingProxy(s3_env.endpoint_url, corrupt=marker) as proxy,
        pytest.raises(S3SyncError) as err,
    ):
        sync(f"s3://{bucket}/c", out, endpoint_url=proxy.endpoint_url)
    assert "x.bin" in str(err.value) and "re-run" in str(err.value)
    assert "ETag" in str(err.value) or "checksum" in str(err.value).lower()
    assert not (out / "x.bin").exists()
    assert (out / "ok.bin").read_bytes() == b"fine"  # the verified file is kept
    assert [p.name for p in out.iterdir()] == ["ok.bin"]  # no temp file left behind
    # without the corruption the next run completes the sync
    assert sync(f"s3://{bucket}/c", out).transferred == 1
    assert (out / "x.bin").read_bytes() == body


def test_sizes_around_the_in_memory_limit_roundtrip(s3_env, bucket, tmp_path):
    from components.s3_sync.engine import IN_MEMORY_MAX

    bodies = {
        f"m/{n}.bin": os.urandom(n)
        for n in (0, 1, IN_MEMORY_MAX - 1, IN_MEMORY_MAX, IN_MEMORY_MAX + 1, 3 * IN_MEMORY_MAX)
    }
    put_objects(s3_env.client(), bucket, bodies)
    report = sync(f"s3://{bucket}/m", tmp_path)
    assert report.transferred == len(bodies)
    assert read_tree(tmp_path) == {k[2:]: v for k, v in bodies.items()}


def test_multipart_object_with_an_unusual_part_size_is_verified(s3_env, bucket, tmp_path):
    # 13 MiB in 6 MiB parts: the likeliest part size for 3 parts is 5 MiB, so the hash taken
    # on the way does not match; S3 is asked for the real part size and the file re-hashed.
    data = os.urandom(13 * 2**20)
    config = TransferConfig(multipart_threshold=6 * 2**20, multipart_chunksize=6 * 2**20)
    s3_env.client().upload_fileobj(io.BytesIO(data), bucket, "odd/blob.bin", Config=config)
    assert s3_env.client().head_object(Bucket=bucket, Key="odd/blob.bin")["ETag"].endswith('-3"')
    assert sync(f"s3://{bucket}/odd", tmp_path).transferred == 1
    assert (tmp_path / "blob.bin").read_bytes() == data


def _crt_threads() -> list[str]:
    """The names of this process's threads that the AWS CRT started (it names them Aws...)."""
    names = []
    for task in Path("/proc/self/task").iterdir():
        try:
            names.append((task / "comm").read_text().strip())
        except FileNotFoundError:  # a thread that ended since the folder was listed
            continue
    return [name for name in names if name.startswith("Aws")]


def test_no_crt_thread_outlives_a_sync(seeded, tmp_path):
    """A sync's CRT event loops and DNS resolver have ended when it returns, so the process may
    fork (with them ending, 6 of 100 forked children crashed on a loaded machine)."""
    _, bucket, _ = seeded
    assert sync(f"s3://{bucket}/data", tmp_path, engine="crt").transferred == 6
    assert _crt_threads() == []


def test_no_crt_thread_outlives_a_failed_sync(s3_env, bucket, tmp_path):
    """Nor after a request failed: its error, once raised, must not keep the request, and with
    it the client and its threads, alive for good (they were, through a traceback)."""
    marker = b"FLIP-ME-IN-TRANSIT"
    s3_env.client().put_object(Bucket=bucket, Key="c/x.bin", Body=marker + os.urandom(300_000))
    with CountingProxy(s3_env.endpoint_url, corrupt=marker) as proxy, pytest.raises(S3SyncError):
        sync(f"s3://{bucket}/c", tmp_path, endpoint_url=proxy.endpoint_url, engine="crt")
    assert _crt_threads() == []
    with pytest.raises(S3SyncError, match="does not exist"):
        sync("s3://no-such-bucket-here/x", tmp_path / "missing", engine="crt")
    assert _crt_threads() == []


def _sync_in_child(source: str, destination: str) -> None:
    sync(source, destination, progress=False)


def test_a_forked_child_syncs_with_event_loops_of_its_own(seeded, tmp_path):
    """A process's syncs share the CRT's event-loop threads; a forked child (multiprocessing's
    fork start method, as DataLoader workers use) has none of them and makes its own."""
    _, bucket, _ = seeded
    source = f"s3://{bucket}/data"
    sync(source, tmp_path / "parent")
    child = multiprocessing.get_context("fork").Process(
        target=_sync_in_child, args=(source, str(tmp_path / "child"))
    )
    child.start()
    child.join(60)
    if child.is_alive():
        child.kill()
    assert child.exitcode == 0
    assert read_tree(tmp_path / "child") == read_tree(tmp_path / "parent")
    assert sync(source, tmp_path / "again").transferred == 6  # the parent's loops still work
