"""A sync killed mid-transfer leaves no partial file under a final name; the next run completes."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import time

import pytest

from components.s3_sync import sync
from tests.s3_sync.s3_helpers import read_tree
from tests.terminal import module_command

BIG = 160 * 1024 * 1024


@pytest.fixture(scope="module")
def big_object(s3_server, tmp_path_factory):
    """One 160 MB object (plus a small one) in bucket "interrupt", uploaded once."""
    src = tmp_path_factory.mktemp("interrupt-src")
    block = os.urandom(1024 * 1024)
    digest = hashlib.md5()
    with open(src / "big.bin", "wb") as fh:
        for i in range(BIG // len(block)):
            chunk = block[:-4] + i.to_bytes(4, "big")
            fh.write(chunk)
            digest.update(chunk)
    (src / "small.txt").write_text("small")
    bucket = s3_server.create_bucket("interrupt")
    client = s3_server.client()
    client.upload_file(str(src / "big.bin"), bucket, "ds/big.bin")
    client.put_object(Bucket=bucket, Key="ds/small.txt", Body=b"small")
    (src / "big.bin").unlink()
    return bucket, digest.hexdigest()


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_killed_download_leaves_no_partial_file_and_rerun_completes(
    big_object, s3_env, tmp_path, sig
):
    bucket, big_md5 = big_object
    dest = tmp_path / "dest"
    proc = subprocess.Popen(
        module_command("components.s3_sync", f"s3://{bucket}/ds", str(dest), "-q"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    try:
        # wait until the big object is on its way (a temp file appears), then kill the sync
        while time.monotonic() < deadline and proc.poll() is None:
            if dest.is_dir() and any(p.name.startswith(".big.bin.s3sync-") for p in dest.iterdir()):
                break
            time.sleep(0.005)
        assert proc.poll() is None, "the sync finished before it could be interrupted"
        proc.send_signal(sig)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0
    if sig == signal.SIGINT:
        assert b"Traceback" not in proc.stderr.read()
    # no partial file under the final name
    big = dest / "big.bin"
    if big.exists():  # only possible if it completed and was verified before the kill
        assert hashlib.md5(big.read_bytes()).hexdigest() == big_md5
    report = sync(f"s3://{bucket}/ds", dest)
    assert report.transferred >= 1
    assert hashlib.md5(big.read_bytes()).hexdigest() == big_md5
    assert sorted(os.listdir(dest)) == ["big.bin", "small.txt"]  # stale temps cleaned
    assert read_tree(dest)["small.txt"] == b"small"
    assert sync(f"s3://{bucket}/ds", dest).transferred == 0
