"""``kfp-ddp schedule --start-time/--end-time``: checked before anything is sent.

KFP's API server parses a recurring run's start and end as RFC 3339 timestamps. Unchecked, a
typo (``2026-13-01``), a date without a time (``2026-12-05``), or an end before the start came
back from the server as an API error after the experiment was made; an end already past, or a
window no run of the cron falls in, made a schedule that never runs, without a word. Here each
is refused naming the option, its value and what to write, and both are sent in one form,
``2026-12-05T02:00:00Z`` (UTC).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from pipelines.cron import next_runs

EXAMPLE = "2026-12-05T02:00:00Z (UTC) or 2026-12-05T03:00:00+01:00"


@dataclass(frozen=True)
class WindowError(ValueError):
    """A start or end time the schedule cannot use: the option at fault and why."""

    option: str
    message: str

    def __str__(self) -> str:
        return self.message


def parse_time(value: str, option: str) -> datetime.datetime:
    """``value`` as an aware UTC datetime; WindowError unless it is an RFC 3339 date and time
    with its UTC offset (``Z`` or ``+01:00``)."""
    text = value.strip()
    try:
        parsed = datetime.datetime.fromisoformat(text.replace("z", "Z"))
    except ValueError:
        raise WindowError(
            option, f"{value!r} is not an RFC 3339 date and time; write e.g. {EXAMPLE}"
        ) from None
    if len(text) <= len("2026-12-05"):
        raise WindowError(
            option, f"{value!r} is a date without a time of day; write e.g. {EXAMPLE}"
        )
    if parsed.tzinfo is None:
        raise WindowError(
            option,
            f"{value!r} has no UTC offset (Z, +01:00): which hour it means depends on where it "
            f"is read; write e.g. {EXAMPLE}",
        )
    return parsed.astimezone(datetime.UTC)


def rfc3339(moment: datetime.datetime) -> str:
    """``moment`` (aware) as KFP's API takes it: ``2026-12-05T02:00:00Z``."""
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def schedule_window(
    start: str | None, end: str | None, cron: str, *, now: datetime.datetime
) -> tuple[str | None, str | None]:
    """The start and end to send (RFC 3339, UTC; None where not given) for a schedule of
    ``cron`` (as ``pipelines.cron.kfp_cron`` returns it) created at ``now``; WindowError for a
    window no run falls in."""
    begins = parse_time(start, "--start-time") if start else None
    ends = parse_time(end, "--end-time") if end else None
    if ends is not None:
        if begins is not None and ends <= begins:
            raise WindowError(
                "--end-time",
                f"{end!r} is not after --start-time {start!r}: the schedule would never run",
            )
        if ends <= now:
            raise WindowError(
                "--end-time",
                f"{end!r} is past ({rfc3339(now)} now): the schedule would never run; give a "
                "later end, or none",
            )
        first = _first_run(cron, after=max(begins or now, now))
        if first is not None and first > ends:
            raise WindowError(
                "--end-time",
                f"{end!r} comes before the schedule's first run ({rfc3339(first)}, by --cron "
                f"{cron!r}): it would never run; give a later end",
            )
    return (rfc3339(begins) if begins else None, rfc3339(ends) if ends else None)


def _first_run(cron: str, *, after: datetime.datetime) -> datetime.datetime | None:
    """When a six-field ``cron`` first fires after ``after`` (UTC); None for a descriptor."""
    if cron.startswith("@"):
        return None
    return next_runs(cron, 1, after=after)[0]
