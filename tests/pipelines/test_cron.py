"""`kfp-ddp schedule --cron`: every field checked against what KFP's scheduler (robfig/cron v1
``cron.Parse``: seconds first) accepts, before anything is sent."""

from __future__ import annotations

import datetime

import pytest
from click.testing import CliRunner

from pipelines.cli import main
from pipelines.cron import CronError, kfp_cron, next_runs

REQUIRED = ["-p", "data_uri=s3://bucket/datasets/cats", "-p", "publish_uri=s3://bucket/models"]


@pytest.mark.parametrize(
    ("given", "sent"),
    [
        ("0 2 * * *", "0 0 2 * * *"),  # crontab: 02:00 daily (a seconds field prepended)
        ("30 0 2 * * 1-5", "30 0 2 * * 1-5"),  # seconds first already
        ("0 2 * JAN-MAR mon-fri", "0 0 2 * JAN-MAR mon-fri"),  # names, any case
        ("0 2 ? * *", "0 0 2 ? * *"),
        ("5/15 1,3 * * 0", "0 5/15 1,3 * * 0"),  # N/step, lists, Sunday as 0
        ("0 0 29 2 *", "0 0 0 29 2 *"),  # a leap day does come
        ("@weekly", "@weekly"),
        ("@every 1h30m", "@every 1h30m"),
    ],
)
def test_what_kfp_accepts_is_sent_as_kfp_reads_it(given: str, sent: str) -> None:
    assert kfp_cron(given) == sent


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ("0 25 * * *", "the hour field '25' is out of range; allowed: hour 0-23"),
        ("60 0 2 * * *", "the second field '60' is out of range; allowed: second 0-59"),
        ("0 2 32 * *", "the day of month field '32' is out of range"),
        ("0 2 * 13 *", "the month field '13' is out of range; allowed: month 1-12 or JAN-DEC"),
        ("0 2 * * 7", "the day of week field '7' is out of range; allowed: day of week 0-6 "),
        ("0 2 * * MON-FUN", "has 'FUN', which KFP's scheduler (robfig/cron) does not read"),
        ("0 2 L * *", "the day of month field 'L' has 'L', which KFP's scheduler"),
        ("0 2 * * 1#2", "has '1#2', which KFP's scheduler (robfig/cron) does not read"),
        ("0 2 * * 5-1", "the range '5-1', which runs backwards"),
        ("*/0 * * * *", "has the step 0 in '*/0'"),
        ("0 0 30 2 *", "never runs (no date matches its day and month fields)"),
        ("2 * *", "has 3 fields; use five (crontab"),
        ("0 0 2 * * * 2026", "has 7 fields"),
        ("@Daily", "is not a schedule KFP knows; use one of @yearly"),
        ("@every soon", "'soon' is not a duration; write e.g. '@every 6h'"),
        ("   ", "the expression is empty"),
    ],
)
def test_what_kfp_refuses_or_never_runs_is_named(given: str, says: str) -> None:
    with pytest.raises(CronError) as refused:
        kfp_cron(given)
    assert says in str(refused.value)
    if given.strip():
        assert str(refused.value).startswith(repr(" ".join(given.split())))


def test_the_next_runs_are_crontabs() -> None:
    after = datetime.datetime(2026, 3, 6, 12, 0)  # a Friday
    weekdays = next_runs(kfp_cron("0 2 * * 1-5"), 2, after=after)
    assert weekdays == [datetime.datetime(2026, 3, 9, 2, 0), datetime.datetime(2026, 3, 10, 2, 0)]


def test_schedule_refuses_a_bad_cron_before_anything_is_sent() -> None:
    # Nothing listens on port 9: the cron is refused before the CLI connects or compiles.
    result = CliRunner().invoke(
        main, ["schedule", "--host", "http://127.0.0.1:9", "--cron", "0 25 * * *", *REQUIRED]
    )
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--cron': '0 25 * * *': the hour field '25'" in result.output
    assert "allowed: hour 0-23" in result.output
    assert "Traceback" not in result.output
