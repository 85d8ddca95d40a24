"""Keys that try to escape the destination, and symlinks on both sides."""

from __future__ import annotations

import os

import pytest

from components.s3_sync import sync
from components.s3_sync.selection import safe_relative_path
from tests.s3_sync.s3_helpers import list_keys, put_objects, read_tree

EVIL_KEYS = [
    "../x",
    "a/../../x",
    "/../x",
    "..",
    "/etc/passwd-copy",
    "a/..",
    "a\\..\\..\\x",
    "..\\x",
    "C:/Windows/x",
    "./x",
    "a//b",
    "a/./b",
    "a/" + "x" * 256,  # no file system takes a name of more than 255 bytes
    "猫" * 86 + "/b",  # 258 bytes of UTF-8
]


@pytest.mark.parametrize("rel", EVIL_KEYS)
def test_safe_relative_path_refuses_escapes(rel):
    assert safe_relative_path(rel) is None


@pytest.mark.parametrize(
    "rel", ["a", "a/b.txt", "dir/", "ü n/ï.png", "a..b/c..", "...", ".hidden", "x" * 255, "猫" * 85]
)
def test_safe_relative_path_allows_normal_keys(rel):
    assert safe_relative_path(rel) == rel.rstrip("/")


@pytest.mark.parametrize("engine", ["crt", "classic"])
def test_adversarial_keys_are_refused_reported_and_never_written(moto_env, tmp_path, engine):
    client = moto_env
    bucket = f"evil-{engine}"
    client.create_bucket(Bucket=bucket)
    good = {"p/ok.txt": b"fine", "p/sub/ok2.txt": b"fine too", "p/dir/": b""}
    evil = {"p/" + k: b"PWNED" for k in EVIL_KEYS}
    evil["p//abs"] = b"PWNED"
    put_objects(client, bucket, {**good, **evil})
    assert set(list_keys(client, bucket)) >= set(evil)  # moto stores them verbatim
    root = tmp_path / "sandbox"
    dest = root / "deep" / "dest"
    report = sync(f"s3://{bucket}/p", dest, engine=engine)
    assert sorted(report.refused) == sorted(evil)
    assert report.transferred == 2
    assert read_tree(dest) == {"ok.txt": b"fine", "sub/ok2.txt": b"fine too"}
    # nothing anywhere else: not beside the destination, not in the sandbox, not at /
    assert read_tree(root) == {"deep/dest/ok.txt": b"fine", "deep/dest/sub/ok2.txt": b"fine too"}
    assert not os.path.exists("/etc/passwd-copy") and not os.path.exists("/x")
    # the CLI-visible report lists them; a re-run refuses again and transfers nothing
    again = sync(f"s3://{bucket}/p", dest, engine=engine, delete=True)
    assert sorted(again.refused) == sorted(evil) and again.transferred == 0 and again.deleted == 0


def test_bare_dotdot_prefix_key_and_symlinked_destination_folder(moto_env, tmp_path):
    client = moto_env
    client.create_bucket(Bucket="links")
    put_objects(client, "links", {"escape/x.txt": b"via link", "ok.txt": b"ok", "..": b"dots"})
    outside = tmp_path / "outside"
    outside.mkdir()
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "escape").symlink_to(outside, target_is_directory=True)
    report = sync("s3://links", dest)
    assert sorted(report.refused) == ["..", "escape/x.txt"]
    assert list(outside.iterdir()) == []
    assert (dest / "ok.txt").read_bytes() == b"ok"


def test_upload_never_follows_symlinks_out_of_source(s3_env, bucket, tmp_path):
    secret_dir = tmp_path / "secret"
    secret_dir.mkdir()
    (secret_dir / "id_rsa").write_text("private")
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "model.pt").write_bytes(b"weights")
    (src / "sub" / "a.txt").write_text("a")
    (src / "leak.txt").symlink_to(secret_dir / "id_rsa")
    (src / "leakdir").symlink_to(secret_dir, target_is_directory=True)
    (src / "alias.pt").symlink_to(src / "model.pt")  # inside the source: fine
    report = sync(src, f"s3://{bucket}/m")
    keys = list_keys(s3_env.client(), bucket)
    assert keys == {"m/model.pt": b"weights", "m/sub/a.txt": b"a", "m/alias.pt": b"weights"}
    assert sorted(report.refused) == ["leak.txt", "leakdir"]
    assert all(b"private" not in body for body in keys.values())
