"""S3 ⇄ local folder sync: incremental, concurrent, verified, atomic, and safe against keys that
try to escape the destination. ``from components.s3_sync import sync, SyncReport, S3SyncError``.
"""

from components.s3_sync.core import SyncOptions, SyncReport, run_sync, sync
from components.s3_sync.transport import S3SyncError

__all__ = ["S3SyncError", "SyncOptions", "SyncReport", "run_sync", "sync"]
