"""The CLI's exit codes: 2 for bad arguments (before anything happens), 1 for a failed sync;
``-h`` and ``--version``; and every SyncOptions field reachable from a flag."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from components.s3_sync import SyncOptions
from components.s3_sync.__main__ import build_parser, main, options_from_args
from kfp_ddp import __version__
from tests.s3_sync.s3_helpers import read_tree
from tests.s3_sync.test_s3_sync_errors import _cli


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["s3://a-bucket/x", "s3://b-bucket/y"], "exactly one side"),
        (["LOCAL", "LOCAL/b"], "exactly one side"),
        (["s3:/a-bucket/x", "LOCAL"], "neither an s3://bucket/prefix URI nor a local folder"),
        (["S3://a-bucket/x", "LOCAL"], "lower-case s3"),
        (["gs://a-bucket/x", "LOCAL"], "source='gs://a-bucket/x'"),
        (["LOCAL", "s3://"], "is not a bucket name"),
        (["s3:///prefix", "LOCAL"], "is not a bucket name"),
        (["s3://my bucket/x", "LOCAL"], "'my bucket' is not a bucket name"),
        (["s3://a-bucket/x", "LOCAL", "--max-delete", "5"], "delete is off"),
        (["s3://a-bucket/x", "LOCAL", "--delete", "--max-delete", "lots"], "max_delete='lots'"),
        (["s3://a-bucket/x", "LOCAL", "--max-concurrency", "0"], "max_concurrency=0"),
    ],
)
def test_bad_arguments_exit_2_and_name_the_value(args, says, tmp_path, capsys):
    args = [a.replace("LOCAL", str(tmp_path / "here")) for a in args]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert says in err and err.startswith("s3-sync: error: ") and err.count("\n") == 1
    assert not (tmp_path / "here").exists()


def test_argparse_usage_errors_exit_2(capsys):
    for args in ([], ["s3://a-bucket/x"], ["a", "b", "--engine", "fast"], ["a", "b", "--nope"]):
        with pytest.raises(SystemExit) as exit_:
            main(args)
        assert exit_.value.code == 2
    assert "usage:" in capsys.readouterr().err


def test_help_and_version():
    proc = _cli("-h")
    assert proc.returncode == 0 and "--max-delete" in proc.stdout and "--dry-run" in proc.stdout
    proc = _cli("--version")
    assert proc.returncode == 0 and proc.stdout.strip().endswith(__version__)


def test_a_failed_sync_exits_1(s3_env, tmp_path, capsys):
    assert main(["-q", "s3://no-such-bucket-here/x", str(tmp_path / "out")]) == 1
    assert "does not exist" in capsys.readouterr().err


def test_every_option_has_a_flag(tmp_path):
    """The flags build the same SyncOptions the API does: none is left without a flag."""
    args = build_parser().parse_args(
        ["s3://a-bucket/x", str(tmp_path), "--delete", "--max-delete", "7", "--dry-run"]
    )
    options = options_from_args(args)
    set_by_flags = {
        "source",
        "destination",
        "endpoint_url",
        "filters",
        "delete",
        "max_delete",
        "dry_run",
        "region",
        "addressing_style",
        "max_concurrency",
        "progress",
        "engine",
    }
    # include/exclude are the API's allow/deny lists; the CLI's ordered flags are `filters`
    api_only = {"include", "exclude", "delete_limit"}
    assert {f.name for f in dataclasses.fields(SyncOptions)} == set_by_flags | api_only
    assert (options.max_delete, options.delete, options.dry_run) == ("7", True, True)


def test_cli_round_trip(s3_env, bucket, tmp_path):
    """Up and down through the CLI process (its own event loops, kept thread states, os._exit
    after flushing): every byte arrives, the JSON report is printed whole, exit 0."""
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    for i in range(300):
        (src / "sub" / f"f{i:03d}.bin").write_bytes(os.urandom(100 + i))
    (src / "big.bin").write_bytes(os.urandom(9 * 1024 * 1024))  # multipart, streamed back
    up = _cli(str(src), f"s3://{bucket}/rt/", "-q", "--json")
    assert up.returncode == 0, up.stderr
    assert json.loads(up.stdout)["transferred"] == 301
    down = _cli(f"s3://{bucket}/rt/", str(tmp_path / "dst"), "-q", "--json")
    assert down.returncode == 0, down.stderr
    assert json.loads(down.stdout)["transferred"] == 301
    assert read_tree(tmp_path / "dst") == read_tree(src)
