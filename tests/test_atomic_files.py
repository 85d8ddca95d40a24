"""The one atomic-write helper: readable by other users, nothing torn or left behind, no torch."""

import os
import stat
import subprocess
import sys

import pytest

from kfp_ddp.atomic_files import write_atomic, write_json_atomic, write_text_atomic


def test_files_get_the_permissions_of_a_plain_open(tmp_path):
    # mkstemp alone would make 0600 files that another step's user cannot read on a shared volume.
    old = os.umask(0o022)
    try:
        write_json_atomic(tmp_path / "a" / "summary.json", {"b": 1, "a": [1, 2]})
        write_text_atomic(tmp_path / "plain.txt", "héllo\n")
        (tmp_path / "reference.txt").write_text("x")
    finally:
        os.umask(old)
    mode = stat.S_IMODE((tmp_path / "a" / "summary.json").stat().st_mode)
    assert mode == stat.S_IMODE((tmp_path / "reference.txt").stat().st_mode) == 0o644
    assert (
        tmp_path / "a" / "summary.json"
    ).read_text() == '{\n  "a": [\n    1,\n    2\n  ],\n  "b": 1\n}\n'
    assert (tmp_path / "plain.txt").read_text(encoding="utf-8") == "héllo\n"


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp(tmp_path):
    target = tmp_path / "model.json"
    write_text_atomic(target, "old")

    def explode(handle):
        handle.write(b"half of the new cont")
        raise RuntimeError("killed mid-write")

    with pytest.raises(RuntimeError):
        write_atomic(target, explode)
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.json"]


def test_importing_it_does_not_import_torch():
    code = "import sys, kfp_ddp.atomic_files; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
