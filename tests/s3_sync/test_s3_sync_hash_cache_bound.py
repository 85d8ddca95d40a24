"""The hash caches' folder keeps the most recently used ``CACHE_LIMIT`` caches: every run syncs
temporary folders whose caches no run reads again (they piled up in ~/.cache, ~8 a demo)."""

from __future__ import annotations

import time

from components.s3_sync import hash_cache, sync
from components.s3_sync.hash_cache import hash_cache_path


def test_the_least_recently_used_caches_go_and_nothing_else(s3_env, bucket, tmp_path, monkeypatch):
    monkeypatch.setattr(hash_cache, "CACHE_LIMIT", 3, raising=False)
    caches = hash_cache_path(tmp_path).parent
    caches.mkdir(parents=True, exist_ok=True)
    (caches / "notes.txt").write_text("the user's own file")
    (caches / "0123.json").write_text("{}")  # not a cache's name: never removed
    folders = {}
    for name in ("a", "b", "c", "d"):
        folders[name] = tmp_path / name
        folders[name].mkdir()
        (folders[name] / "file.bin").write_bytes(name.encode() * 1000)
    uri = f"s3://{bucket}/data"

    def upload(name: str) -> None:
        sync(folders[name], f"{uri}/{name}")
        time.sleep(0.05)  # file times are as coarse as the kernel's clock tick

    for name in ("a", "b", "c"):
        upload(name)
    assert all(hash_cache_path(folders[name]).exists() for name in "abc")
    report = sync(folders["a"], f"{uri}/a")  # unchanged: read from its cache, nothing written
    assert report.transferred == 0
    time.sleep(0.05)
    upload("d")  # a fourth: the least recently used (b, not a) goes

    kept = {name for name in "abcd" if hash_cache_path(folders[name]).exists()}
    assert kept == {"a", "c", "d"}
    assert (caches / "notes.txt").exists() and (caches / "0123.json").exists()
    # b only lost its cache: a sync hashes it again and finds it unchanged
    assert sync(folders["b"], f"{uri}/b").transferred == 0
