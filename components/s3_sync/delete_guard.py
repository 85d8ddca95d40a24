"""Safety rails for ``delete``, checked before anything is changed (like rsync's and rclone's
``--max-delete``):

- an empty source selection with ``delete`` is refused when the destination holds files: a typo
  in the source URI lists nothing, and would otherwise empty the destination (an empty source
  onto an empty destination deletes nothing and is allowed);
- deleting more than ``max_delete`` of the destination's files is refused. The default allows
  deleting up to half of the destination's (selected) files, or up to 10 files whatever the
  share: enough for a data set that lost some files or a model folder whose files were renamed,
  while a wrong but non-empty source (which would replace everything) is stopped. An explicit
  ``max_delete`` is taken literally: ``N`` files, or ``P%`` of the destination's files.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from components.s3_sync.errors import S3SyncUsageError

DEFAULT_SHARE_PERCENT = 50.0
"""Without ``max_delete``: at most this share of the destination's files may be deleted..."""
DEFAULT_ALWAYS_ALLOWED = 10
"""...or at most this many, whichever is more."""
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
        within_share = deletions * 100 <= (self.percent or 0.0) * existing
        return within_share or (not self.explicit and deletions <= DEFAULT_ALWAYS_ALLOWED)

    def describe(self) -> str:
        if self.count is not None:
            return f"max_delete={self.count}"
        if self.explicit:
            return f"max_delete={self.percent:g}% of them"
        return (
            f"the default: {DEFAULT_SHARE_PERCENT:g}% of them or {DEFAULT_ALWAYS_ALLOWED} files, "
            "whichever is more"
        )


@dataclass(frozen=True, kw_only=True)
class PlannedDeletions:
    """What a sync with ``delete`` is about to do to its destination."""

    source: str
    destination: str
    source_files: int
    """Files/objects in the source selection."""
    existing: int
    """Files/objects in the destination that the selection covers (the ones it may delete)."""
    deletions: int
    unit: str = "files"
    """What the destination holds: "files" (a folder) or "objects" (a prefix)."""


def check_deletions(plan: PlannedDeletions, limit: DeleteLimit) -> None:
    """Raise S3SyncUsageError (before anything is changed) if ``plan`` needs more consent."""
    if (
        plan.source_files == 0
        and plan.existing
        and not (limit.explicit and limit.allows(plan.existing, plan.existing))
    ):
        raise S3SyncUsageError(
            f"refusing --delete with an empty source: {plan.source} lists no {plan.unit} (or "
            "none that the include/exclude filters select), and --delete would leave "
            f"{plan.destination} empty (deleting the {plan.existing} {plan.unit} it holds); "
            "nothing was changed. Check the source "
            "(a typo lists nothing). If emptying the destination is really meant, pass "
            "--max-delete 100% (max_delete='100%')."
        )
    if not limit.allows(plan.deletions, plan.existing):
        raise S3SyncUsageError(
            f"refusing to delete {plan.deletions} of the {plan.existing} {plan.unit} in "
            f"{plan.destination}: more than the limit ({limit.describe()}); nothing was "
            f"changed. Check that {plan.source} is the source you mean; to allow it, pass "
            f"--max-delete {plan.deletions} (max_delete={plan.deletions}) or a share such as "
            "--max-delete 100%."
        )
