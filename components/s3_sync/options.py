"""What a sync is asked to do (``SyncOptions``) and what it did (``SyncReport``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import cast

from components.s3_sync.delete_guard import DeleteLimit
from components.s3_sync.engine import ENGINES
from components.s3_sync.errors import S3SyncUsageError
from components.s3_sync.progress import format_bytes
from components.s3_sync.s3_uri import check_local_or_s3, is_s3_uri
from components.s3_sync.selection import selected, selected_by_filters

ADDRESSING_STYLES = ("auto", "path", "virtual")
FILTER_KINDS = ("include", "exclude")


@dataclass(kw_only=True)
class SyncOptions:
    """Everything one sync needs; the CLI, the KFP component and the tests build this object."""

    source: str
    """``s3://bucket/prefix`` or a local folder."""
    destination: str
    """``s3://bucket/prefix`` or a local folder (exactly one side is S3)."""
    endpoint_url: str | None = None
    """S3 endpoint; None: as botocore finds it (AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, the AWS
    config's endpoint_url / services section, else AWS itself)."""
    include: Sequence[str] = ()
    """Globs on the key relative to the prefix; if any are given only matching keys sync."""
    exclude: Sequence[str] = ()
    """Globs on the relative key; matching keys are neither transferred nor deleted."""
    filters: Sequence[tuple[str, str]] = ()
    """Ordered ``("include" | "exclude", glob)`` pairs with ``aws s3 sync`` semantics: every key
    is selected to begin with, each filter that matches a key includes or excludes it, and the
    last match wins (``exclude *`` then ``include *.png`` selects only PNGs). The CLI's
    ``--include``/``--exclude`` flags become these, in command-line order. Not together with
    ``include``/``exclude``."""
    delete: bool = False
    """Remove destination files/objects that are not in the source (only under the destination).
    Refused for an empty source, and beyond ``max_delete``."""
    max_delete: int | str | None = None
    """With ``delete``: at most N deletions (``500``) or a share of the destination's files
    (``"20%"``, ``"100%"`` for all); None: at most half of them, however few, and never all of a
    non-empty destination. See delete_guard.py."""
    dry_run: bool = False
    """Plan and report (``would_transfer``, ``would_delete``); change nothing, write nothing."""
    region: str | None = None
    """Region for signing; None: AWS_DEFAULT_REGION / the AWS config (else us-east-1)."""
    addressing_style: str | None = None
    """``path``, ``virtual`` or ``auto``; None: the AWS config's, else botocore's default (path
    for a custom endpoint)."""
    max_concurrency: int = 32
    """Transfers in flight at once."""
    progress: bool | None = None
    """True: tqdm bar; False: periodic log lines; None: a bar on a TTY, log lines otherwise."""
    engine: str = "auto"
    """``crt`` (AWS CRT), ``classic`` (botocore threads) or ``auto`` (CRT when installed)."""
    delete_limit: DeleteLimit = field(init=False, repr=False)
    """``max_delete``, parsed."""

    def __post_init__(self) -> None:
        self.source, self.destination = str(self.source), str(self.destination)
        self._check_sides()
        self._check_choices()
        self._check_filters()
        self.delete_limit = DeleteLimit.parse(self.max_delete)
        if self.delete_limit.explicit and not self.delete:
            raise S3SyncUsageError(
                f"max_delete={self.max_delete!r} limits deletions, but delete is off; pass "
                "--delete (delete=True) too, or drop --max-delete"
            )

    def _check_sides(self) -> None:
        check_local_or_s3("source", self.source)
        check_local_or_s3("destination", self.destination)
        if is_s3_uri(self.source) == is_s3_uri(self.destination):
            raise S3SyncUsageError(
                f"source={self.source!r}, destination={self.destination!r}: exactly one side "
                "must be an s3://bucket/prefix URI and the other a local folder"
            )

    def _check_choices(self) -> None:
        if self.max_concurrency < 1:
            raise S3SyncUsageError(f"max_concurrency={self.max_concurrency} must be >= 1")
        if self.engine not in ENGINES:
            raise S3SyncUsageError(f"engine={self.engine!r} is not one of {', '.join(ENGINES)}")
        if self.addressing_style is not None and self.addressing_style not in ADDRESSING_STYLES:
            raise S3SyncUsageError(
                f"addressing_style={self.addressing_style!r} is not one of "
                f"{', '.join(ADDRESSING_STYLES)}"
            )

    def _check_filters(self) -> None:
        # a lone string is one pattern, not a sequence of one-character patterns
        self.include = (self.include,) if isinstance(self.include, str) else tuple(self.include)
        self.exclude = (self.exclude,) if isinstance(self.exclude, str) else tuple(self.exclude)
        self.filters = tuple(cast(tuple[str, str], tuple(f)) for f in self.filters)
        if self.filters and (self.include or self.exclude):
            raise S3SyncUsageError(
                "filters= (ordered, aws-style) cannot be combined with include=/exclude=; "
                "express the includes and excludes as filters"
            )
        for kind, _ in self.filters:
            if kind not in FILTER_KINDS:
                raise S3SyncUsageError(f"filter kind {kind!r} must be 'include' or 'exclude'")
        for pattern in (*self.include, *self.exclude, *(g for _, g in self.filters)):
            if not isinstance(pattern, str) or not pattern:
                raise S3SyncUsageError(
                    f"include/exclude pattern {pattern!r} must be a non-empty glob"
                )

    def selects(self, rel: str) -> bool:
        """Whether the key/path ``rel`` (relative to the prefix/folder) takes part in the sync."""
        if self.filters:
            return selected_by_filters(rel, self.filters)
        return selected(rel, self.include, self.exclude)

    @property
    def download(self) -> bool:
        return is_s3_uri(self.source)


@dataclass
class SyncReport:
    """What a sync did (or, with dry_run, would do)."""

    transferred: int = 0
    """Objects/files copied (or that would be, with dry_run)."""
    skipped: int = 0
    """Unchanged, not copied."""
    deleted: int = 0
    """Removed from the destination (``delete=True``; or that would be, with dry_run)."""
    refused: list[str] = field(default_factory=list)
    """Source keys/paths refused for safety (outside the destination, symlinks out, clashes)."""
    files: int = 0
    """Objects/files in the source selection."""
    bytes_transferred: int = 0
    bytes_total: int = 0
    """Bytes in the source selection."""
    seconds: float = 0.0
    digest: str = ""
    """sha256 of the source listing (relative key, size, ETag): changes exactly with the data."""
    dry_run: bool = False
    would_transfer: list[str] = field(default_factory=list)
    """With dry_run: the relative paths that would be copied (empty otherwise)."""
    would_delete: list[str] = field(default_factory=list)
    """With dry_run: the relative paths that would be deleted (empty otherwise)."""
    source: str = ""
    destination: str = ""
    engine: str = ""

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        transfer, delete = (
            ("would transfer", "would delete") if self.dry_run else ("transferred", "deleted")
        )
        rate = self.bytes_transferred / self.seconds if self.seconds > 0 else 0.0
        return (
            f"{transfer} {self.transferred} of {self.files} files "
            f"({format_bytes(self.bytes_transferred)} of {format_bytes(self.bytes_total)}, "
            f"{format_bytes(rate)}/s), "
            f"skipped {self.skipped} unchanged, {delete} {self.deleted}, refused "
            f"{len(self.refused)} in {self.seconds:.2f}s; digest {self.digest[:16]}"
        )
