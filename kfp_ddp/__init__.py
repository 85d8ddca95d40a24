"""Pieces every part of kfp-ddp shares (stdlib only): the package version, atomic file writes,
and a throw-away local S3 server for the tests and the demo.

Nothing here imports torch, kfp or boto3, so the trainer can use it with torch alone.
"""

from __future__ import annotations

from importlib import metadata


def _version() -> str:
    try:
        return metadata.version("kfp-ddp")
    except metadata.PackageNotFoundError:  # a source tree that was never installed
        return "0+unknown"


__version__ = _version()
"""The package version: the image tag and the component files carry the same one."""
