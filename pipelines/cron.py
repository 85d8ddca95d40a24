"""The cron expression of ``kfp-ddp schedule --cron``, checked field by field against what the
Kubeflow Pipelines backend accepts.

KFP's API server and its ScheduledWorkflow controller parse a recurring run's cron with
robfig/cron v1.2 ``cron.Parse`` (kubeflow/pipelines ``backend/src/apiserver/server/
api_converter.go``, ``backend/src/crd/controller/scheduledworkflow/util/cron_schedule.go``):
six fields with the seconds first, ``second minute hour day-of-month month day-of-week``, or a
descriptor (``@yearly``, ``@annually``, ``@monthly``, ``@weekly``, ``@daily``, ``@midnight``,
``@hourly``, ``@every <Go duration>``). It would read a crontab line such as ``0 2 * * *`` as
"second 0 of minute 2 of every hour" (the weekday field is optional there), so ``kfp_cron``
prepends a ``0`` seconds field to five fields: ``0 2 * * *`` means 02:00 daily, as in crontab.

Each field is parsed by croniter (ranges, steps, lists, month and weekday names, bounds), and the
whole expression must have a next run (``0 0 30 2 *`` never has). On top of croniter, what
robfig/cron refuses though croniter takes it: ``L``, ``W``, ``#`` and ``H``, weekday ``7``, a
range that runs backwards (``5-1``) and a seventh (year) field.
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass

DESCRIPTORS = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")
"""robfig/cron v1's named schedules (lower case only)."""
GO_DURATION = re.compile(r"(?:(?:\d+(?:\.\d*)?|\.\d+)(?:ns|us|µs|ms|s|m|h))+")
"""Go's time.ParseDuration (unsigned: a schedule never repeats every minus one hour)."""
EXAMPLE = "'0 2 * * *' (02:00 daily) or '0 0 2 * * 1-5' (seconds first: 02:00 on weekdays)"


@dataclass(frozen=True)
class CronField:
    """One field of the six and what robfig/cron allows in it."""

    name: str
    low: int
    high: int
    names: tuple[str, ...] = ()
    """Names robfig/cron takes for the values ``low``.. in order (months, weekdays)."""

    def allowed(self) -> str:
        named = f" or {self.names[0].upper()}-{self.names[-1].upper()}" if self.names else ""
        sunday = " (Sunday is 0)" if self.name == "day of week" else ""
        return (
            f"{self.name} {self.low}-{self.high}{sunday}{named}, '*', lists (1,3), ranges (1-5) "
            "and steps (*/2, 1-5/2)"
        )

    def value(self, token: str) -> int | None:
        """A number or a name of this field (None: neither)."""
        if token.isdigit():
            return int(token)
        lowered = token.lower()
        return self.low + self.names.index(lowered) if lowered in self.names else None


FIELDS = (
    CronField("second", 0, 59),
    CronField("minute", 0, 59),
    CronField("hour", 0, 23),
    CronField("day of month", 1, 31),
    CronField(
        "month",
        1,
        12,
        ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"),
    ),
    CronField("day of week", 0, 6, ("sun", "mon", "tue", "wed", "thu", "fri", "sat")),
)
RANGE = re.compile(
    r"(?:\*|\?|(?P<low>[0-9A-Za-z]+)(?:-(?P<high>[0-9A-Za-z]+))?)(?:/(?P<step>\d+))?"
)
"""One element of a field's list, as robfig/cron reads it: * ? N N-M, each with /step."""


class CronError(ValueError):
    """A cron expression KFP's scheduler would refuse (or never run); the message says why and
    what to write."""


def kfp_cron(expression: str) -> str:
    """``expression`` as KFP's scheduler reads it: five crontab fields get a ``0`` seconds field
    first, six fields and descriptors pass through. Raises CronError naming the field at fault."""
    expression = " ".join(expression.split())
    if not expression:
        raise CronError(f"the expression is empty; write e.g. {EXAMPLE}")
    if expression.startswith("@"):
        _check_descriptor(expression)
        return expression
    fields = expression.split(" ")
    if len(fields) not in (5, 6):
        raise CronError(
            f"{expression!r} has {len(fields)} fields; use five (crontab: 'minute hour "
            "day-of-month month day-of-week', e.g. '0 2 * * *') or six with seconds first "
            "(e.g. '0 0 2 * * *')"
        )
    full = ["0", *fields] if len(fields) == 5 else fields
    for field, text in zip(FIELDS, full, strict=True):
        _check_field(expression, field, text)
    _check_runs(expression, " ".join(full))
    return " ".join(full)


def next_runs(expression: str, count: int, *, after: datetime.datetime) -> list[datetime.datetime]:
    """The next ``count`` times a checked six-field expression fires after ``after``."""
    from croniter import croniter

    schedule = croniter(expression, after, second_at_beginning=True)
    return [schedule.get_next(datetime.datetime) for _ in range(count)]


def _check_descriptor(expression: str) -> None:
    if expression in DESCRIPTORS:
        return
    every = expression.removeprefix("@every ")
    if every != expression:
        if GO_DURATION.fullmatch(every):
            return
        raise CronError(
            f"{expression!r}: {every!r} is not a duration; write e.g. '@every 6h' or "
            "'@every 1h30m' (units h, m, s)"
        )
    raise CronError(
        f"{expression!r} is not a schedule KFP knows; use one of {', '.join(DESCRIPTORS)}, "
        f"'@every <duration>' or a cron expression such as {EXAMPLE}"
    )


def _check_field(expression: str, field: CronField, text: str) -> None:
    """What robfig/cron refuses (L, W, #, weekday 7, backwards ranges...), then croniter's parse
    of this field alone."""
    from croniter import CroniterError, croniter

    def refuse(why: str) -> CronError:
        return CronError(
            f"{expression!r}: the {field.name} field {text!r} {why}; allowed: {field.allowed()}"
        )

    for element in text.split(","):
        found = RANGE.fullmatch(element)
        if found is None:
            raise refuse(f"has {element!r}, which KFP's scheduler (robfig/cron) does not read")
        values = []
        for token in (found["low"], found["high"]):
            if token is None:
                continue
            value = field.value(token)
            if value is None:
                raise refuse(f"has {token!r}, which KFP's scheduler (robfig/cron) does not read")
            if not field.low <= value <= field.high:
                raise refuse("is out of range" if token == text else f"has {token}, out of range")
            values.append(value)
        if len(values) == 2 and values[0] > values[1]:
            raise refuse(
                f"has the range {element!r}, which runs backwards; KFP's scheduler refuses it "
                "(write two ranges, e.g. 5-6,0-1)"
            )
        if found["step"] is not None and int(found["step"]) == 0:
            raise refuse(f"has the step 0 in {element!r}")
    alone = ["*"] * len(FIELDS)
    alone[FIELDS.index(field)] = text
    try:
        croniter(" ".join(alone), second_at_beginning=True)
    except CroniterError as exc:
        raise refuse(f"is not valid (croniter: {exc})") from None


def _check_runs(expression: str, full: str) -> None:
    """The expression must fire at some time (``0 0 30 2 *``, February 30th, never does)."""
    from croniter import CroniterBadDateError

    try:
        next_runs(full, 1, after=datetime.datetime(2000, 1, 1))
    except CroniterBadDateError:
        raise CronError(
            f"{expression!r} never runs (no date matches its day and month fields); e.g. {EXAMPLE}"
        ) from None
