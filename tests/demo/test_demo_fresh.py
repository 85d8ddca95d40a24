"""``python -m pipelines.demo`` refuses before it writes, starts or deletes anything: a bad
argument, and a folder ``--fresh`` may not clear (it removes only what the demo made).

The demo marks the output folder it creates; ``--fresh`` clears the demo's entries from a marked
folder and refuses (exit 2, nothing deleted) a non-empty folder without the marker — a typo in
``--output`` must not cost a folder of someone's files.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kfp_ddp.local_s3 import LocalS3Server
from pipelines.demo import EXIT_REFUSED, DemoOutput, OutputRefused
from pipelines.demo import main as demo_main


def _tree(root: Path) -> dict[str, tuple[bytes | str, int]]:
    """Every entry under ``root``: a file's bytes (a link's target) and its mtime."""
    out: dict[str, tuple[bytes | str, int]] = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(dirpath) / name
            stat = path.lstat()
            if path.is_symlink():
                content: bytes | str = os.readlink(path)
            elif path.is_file():
                content = path.read_bytes()
            else:
                content = "<folder>"
            out[path.relative_to(root).as_posix()] = (content, stat.st_mtime_ns)
    return out


def _write(root: Path, files: dict[str, bytes]) -> None:
    for rel, body in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(body)


# Someone's folder, with names the demo also uses: none of it may go.
FOREIGN = {
    "notes.txt": b"my notes",
    "dataset/mine.csv": b"a,b\n1,2\n",
    "logs/2026-11.log": b"my log",
    "summary.json": b'{"mine": true}',
}


def test_fresh_refuses_a_folder_the_demo_did_not_make(tmp_path: Path) -> None:
    folder = tmp_path / "my-project"
    _write(folder, FOREIGN)
    before = _tree(folder)
    proc = subprocess.run(
        [sys.executable, "-m", "pipelines.demo", "--output", str(folder), "--fresh"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == EXIT_REFUSED == 2, proc.stderr[-3000:]
    error = proc.stderr.strip()
    assert error.startswith("demo: error: --fresh refuses to clear ") and str(folder) in error
    assert DemoOutput.MARKER in error and "nothing was deleted" in error
    assert "another --output" in error and "Traceback" not in proc.stderr
    assert "local S3 server" not in proc.stdout  # refused before anything started
    assert _tree(folder) == before  # not a file removed, changed or added (no marker either)


def test_fresh_clears_what_the_demo_made_and_nothing_else(tmp_path: Path) -> None:
    output = DemoOutput(tmp_path / "demo-output")
    output.prepare(fresh=False)  # a new folder: the demo's, marked
    assert output.is_marked()
    _write(
        output.root,
        {
            "dataset/train/0/a.png": b"png",
            "s3-data/volume.dat": b"blob",
            "kfp-runs/run-1/executor_output.json": b"{}",
            "logs/pipeline.log": b"log",
            "summary.json": b"{}",
            "report.html": b"<html>",
            "workspace/nodes/node-0/x": b"x",
        },
    )
    # A file of the user's beside the demo's, and a workspace that is a link to elsewhere.
    (output.root / "my-notes.txt").write_bytes(b"keep me")
    elsewhere = tmp_path / "elsewhere"
    _write(elsewhere, {"precious.bin": b"never followed"})
    os.rename(output.root / "workspace", tmp_path / "old-workspace")
    (output.root / "workspace").symlink_to(elsewhere, target_is_directory=True)

    output.prepare(fresh=True)
    assert sorted(p.name for p in output.root.iterdir()) == [DemoOutput.MARKER, "my-notes.txt"]
    assert (output.root / "my-notes.txt").read_bytes() == b"keep me"
    assert (elsewhere / "precious.bin").read_bytes() == b"never followed"
    assert output.is_marked()


def test_an_output_where_a_demo_runs_is_refused_and_left_alone(tmp_path: Path) -> None:
    """A second demo (--fresh or not) on the output of one that runs cleared or rewrote its data
    set and workspace under it; its own S3 server then failed to start."""
    output = DemoOutput(tmp_path / "demo-output")
    output.prepare(fresh=False)
    with LocalS3Server(data_dir=output / "s3-data") as running:
        _write(output.root, {"dataset/train/0/a.png": b"png", "logs/pipeline.log": b"log"})
        before = _tree(output.root)
        for fresh in (True, False):
            with pytest.raises(OutputRefused) as refused:
                output.prepare(fresh=fresh)
            assert f"another demo is running there (its S3 server, pid {os.getpid()})" in str(
                refused.value
            )
            after = _tree(output.root)  # the server's own files change as it runs: not ours
            assert {k: v for k, v in after.items() if not k.startswith("s3-data")} == {
                k: v for k, v in before.items() if not k.startswith("s3-data")
            }
        assert running.running
    output.prepare(fresh=True)  # once it has ended
    assert not (output.root / "dataset").exists()


def test_only_a_new_or_empty_folder_is_marked(tmp_path: Path) -> None:
    empty = DemoOutput(tmp_path / "empty")
    empty.root.mkdir()
    empty.prepare(fresh=True)  # nothing to lose: used, and marked
    assert empty.is_marked()
    # A plain run may write into someone's folder, but that does not make it the demo's.
    foreign = DemoOutput(tmp_path / "foreign")
    _write(foreign.root, FOREIGN)
    foreign.prepare(fresh=False)
    assert not foreign.is_marked()
    before = _tree(foreign.root)
    with pytest.raises(OutputRefused, match="nothing was deleted"):
        foreign.prepare(fresh=True)
    assert _tree(foreign.root) == before


def test_an_output_that_is_a_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "results.txt"
    path.write_bytes(b"mine")
    for fresh in (True, False):
        with pytest.raises(OutputRefused, match="not a folder"):
            DemoOutput(path).prepare(fresh=fresh)
    assert path.read_bytes() == b"mine"


def test_every_path_the_demo_writes_is_one_fresh_knows() -> None:
    with pytest.raises(KeyError, match="not one of the demo's entries"):
        DemoOutput(Path("/nowhere")) / "checkpoints"
    assert DemoOutput(Path("/out")) / "dataset" == Path("/out/dataset")


def test_a_bad_argument_is_refused_before_anything_is_written_or_started(tmp_path, capsys):
    output = tmp_path / "out"
    assert demo_main(["--output", str(output), "--model", "no_such_model"]) == EXIT_REFUSED
    said = capsys.readouterr()
    assert said.err.startswith("demo: error: bad argument(s):\nmodel='no_such_model': ")
    assert "resnet18" in said.err  # the models it takes
    assert "local S3 server" not in said.out and not output.exists()


def test_the_image_size_is_the_users_and_checked_with_the_other_arguments(tmp_path, capsys):
    """``--image-size`` (which the check step names as the fix for a model that cannot take 32
    px, such as a ViT) reaches the pipeline's arguments and their check."""
    output = tmp_path / "out"
    assert demo_main(["--output", str(output), "--image-size", "0"]) == EXIT_REFUSED
    said = capsys.readouterr()
    assert said.err.startswith("demo: error: bad argument(s):\nimage_size=0: "), said.err
    assert "local S3 server" not in said.out and not output.exists()
