"""Ordered include/exclude filters (the CLI follows `aws s3 sync`) vs. the API allow/deny lists."""

import pytest

from components.s3_sync import S3SyncError, SyncOptions, sync
from tests.s3_sync.test_s3_sync_errors import _cli

KEYS = ["a.png", "b.jpg", "val/c.png", "notes.txt"]


def _selected(**kwargs) -> list[str]:
    options = SyncOptions(source="s3://bucket/p", destination="/tmp/x", **kwargs)
    return [k for k in KEYS if options.selects(k)]


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        ((), KEYS),
        ([("include", "*.png")], KEYS),  # aws: everything is included to begin with
        ([("exclude", "*"), ("include", "*.png")], ["a.png", "val/c.png"]),
        ([("include", "*.png"), ("exclude", "*")], []),  # the last match wins
        ([("exclude", "*"), ("include", "*.png"), ("exclude", "val/*")], ["a.png"]),
        ([("exclude", "*.txt")], ["a.png", "b.jpg", "val/c.png"]),
    ],
)
def test_ordered_filters_last_match_wins(filters, expected):
    assert _selected(filters=filters) == expected


def test_api_lists_are_allow_and_deny_lists():
    assert _selected(include=["*.png"]) == ["a.png", "val/c.png"]
    assert _selected(include=["*.png"], exclude=["val/*"]) == ["a.png"]


def test_filters_and_lists_do_not_mix_and_kinds_are_checked():
    with pytest.raises(S3SyncError, match="cannot be combined"):
        _selected(filters=[("exclude", "*")], include=["*.png"])
    with pytest.raises(S3SyncError, match="'only'"):
        _selected(filters=[("only", "*.png")])


def test_cli_applies_flags_in_order_like_aws(s3_env, bucket, tmp_path):
    for key in KEYS:
        s3_env.client().put_object(Bucket=bucket, Key=f"d/{key}", Body=key.encode())
    proc = _cli(f"s3://{bucket}/d", str(tmp_path / "png"), "--exclude", "*", "--include", "*.png")
    assert proc.returncode == 0, proc.stderr
    got = sorted(str(p.relative_to(tmp_path / "png")) for p in (tmp_path / "png").rglob("*.*"))
    assert got == ["a.png", "val/c.png"]
    # Reversed, the trailing --exclude '*' wins for every key: nothing is selected.
    proc = _cli(f"s3://{bucket}/d", str(tmp_path / "none"), "--include", "*.png", "--exclude", "*")
    assert proc.returncode == 0, proc.stderr
    assert not list((tmp_path / "none").rglob("*.*"))
    # The same selection through the API's lists.
    report = sync(f"s3://{bucket}/d", tmp_path / "api", include=["*.png"])
    assert report.transferred == 2
