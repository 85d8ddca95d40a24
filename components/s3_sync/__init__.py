"""S3 ⇄ local folder sync: incremental, concurrent, verified, atomic, and safe against keys that
try to escape the destination and against deleting by mistake.
``from components.s3_sync import sync, SyncOptions, SyncReport, S3SyncError``.
"""

from components.s3_sync.api import run_sync, sync
from components.s3_sync.errors import S3SyncError, S3SyncUsageError
from components.s3_sync.options import SyncOptions, SyncReport

__all__ = ["S3SyncError", "S3SyncUsageError", "SyncOptions", "SyncReport", "run_sync", "sync"]
