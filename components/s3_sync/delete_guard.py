"""Safety rails for ``delete``, checked before anything is changed (like rsync's and rclone's
``--max-delete``):

- an empty source selection with ``delete`` is refused when the destination holds files: a typo
  in the source URI lists nothing, and would otherwise empty the destination (an empty source
  onto an empty destination deletes nothing and is allowed);
- deleting more than ``max_delete`` of the destination's files is refused. The default allows
  deleting at most half of the destination's (selected) files, however few it holds, and so
  never all of them: a data set that lost some files syncs as before, while a wrong but
  non-empty source (which would replace everything) is stopped — also on a model prefix of 8
  objects or a folder of 2 notes, which a floor of "10 files whatever the share" let through.
  An explicit ``max_delete`` is taken literally: ``N`` files, or ``P%`` of the destination's
  files (``100%``: everything).

A refusal is a ``DeletionsRefused`` that names ``--delete``, the destination, how many of how
many files would go and the fix; it carries the paths. A dry run is refused the same way (it
predicts the real run), and the CLI prints those paths first: ``--dry-run`` shows what would go.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from components.s3_sync.errors import S3SyncUsageError

DEFAULT_SHARE_PERCENT = 50.0
"""Without ``max_delete``: at most this share of the destination's files may be deleted (below
100%, so never all of a non-empty destination)."""
_PERCENT_RE = re.compile(r"(\d+(?:\.\d+)?)%")


@dataclass(frozen=True, kw_only=True)
class DeleteLimit:
    """How many destination files a sync may delete: ``count``, or ``percent`` of them."""

    count: int | None = None
    percent: float | None = None
    explicit: bool = False
    """Given by the user (``max_delete``), not the default."""

    @classmethod
    def parse(cls, value: int | str | None) -> DeleteLimit:
        """``max_delete``: None or "" (the default), N (files) or "P%" (of the destination's)."""
        if value is None or value == "":
            return cls(percent=DEFAULT_SHARE_PERCENT)
        text = str(value).strip()
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return cls(count=value, explicit=True)
        if isinstance(value, str) and text.isdigit():
            return cls(count=int(text), explicit=True)
        match = _PERCENT_RE.fullmatch(text) if isinstance(value, str) else None
        if match and float(match.group(1)) <= 100:
            return cls(percent=float(match.group(1)), explicit=True)
        raise S3SyncUsageError(
            f"max_delete={value!r} is not a limit; pass a number of files (--max-delete 500) or "
            "a share of the destination's files (--max-delete 20%, at most 100%)"
        )

    def allows(self, deletions: int, existing: int) -> bool:
        """Whether deleting ``deletions`` of the destination's ``existing`` files is allowed."""
        if self.count is not None:
            return deletions <= self.count
        return deletions * 100 <= (self.percent or 0.0) * existing

    def describe(self) -> str:
        if self.count is not None:
            return f"max_delete={self.count}"
        if self.explicit:
            return f"max_delete={self.percent:g}% of them"
        return "the default: at most half of them, never all"


@dataclass(frozen=True, kw_only=True)
class PlannedDeletions:
    """What a sync with ``delete`` is about to do to its destination."""

    source: str
    destination: str
    source_files: int
    """Files/objects in the source selection."""
    existing: int
    """Files/objects in the destination that the selection covers (the ones it may delete)."""
    paths: tuple[str, ...]
    """The destination's files/objects (relative paths) that the source lacks: what would go."""
    unit: str = "files"
    """What the destination holds: "files" (a folder) or "objects" (a prefix)."""
    dry_run: bool = False
    """Planned by a dry run (the message then does not suggest one)."""

    @property
    def deletions(self) -> int:
        return len(self.paths)


class DeletionsRefused(S3SyncUsageError):
    """``delete`` would remove more than it may; nothing was changed.

    ``would_delete``: the relative paths it would have removed (the CLI lists them on a dry run).
    """

    def __init__(self, message: str, would_delete: tuple[str, ...]) -> None:
        super().__init__(message)
        self.would_delete = list(would_delete)


def check_deletions(plan: PlannedDeletions, limit: DeleteLimit) -> None:
    """Raise DeletionsRefused (before anything is changed) if ``plan`` needs more consent."""
    n, existing, unit = plan.deletions, plan.existing, plan.unit
    look = (
        "this dry run changed nothing, and the real run would be refused the same way"
        if plan.dry_run
        else "look first with --dry-run, which lists every path that would go"
    )
    if plan.source_files == 0 and existing and not (limit.explicit and limit.allows(n, existing)):
        raise DeletionsRefused(
            f"refusing --delete with an empty source: {plan.source} lists no {unit} (or none "
            "that the include/exclude filters select), and --delete would remove all "
            f"{n} of the {existing} {unit} in {plan.destination}, leaving it empty; nothing was "
            f"changed. Check the source (a typo lists nothing); {look}. If emptying the "
            "destination is really meant, pass --max-delete 100% (max_delete='100%').",
            plan.paths,
        )
    if not limit.allows(n, existing):
        raise DeletionsRefused(
            f"refusing --delete: it would remove {n} of the {existing} {unit} in "
            f"{plan.destination} (the ones {plan.source} lacks): more than the limit allows "
            f"({limit.describe()}); "
            f"nothing was changed. Check that {plan.source} is the source you mean for this "
            f"destination; {look}. To allow it, pass --max-delete {n} (max_delete={n}) or "
            "--max-delete 100%.",
            plan.paths,
        )
