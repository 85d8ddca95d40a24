"""Fixtures shared by every test area. Area-specific fixtures live in tests/<area>/conftest.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.image_data import write_image_folder

SHARED_DIR = Path(__file__).resolve().parents[1].parent / "shared"


@pytest.fixture
def image_folder(tmp_path: Path) -> Path:
    """A tiny 3-class ImageFolder with train/ and val/ splits of 16x16 PNGs."""
    return write_image_folder(tmp_path / "data")


@pytest.fixture(scope="session")
def s3_server():
    """A running LocalS3Server (SeaweedFS on 127.0.0.1, free ports, enforced key pair)."""
    from kfp_ddp.local_s3 import LocalS3Server

    with LocalS3Server() as server:
        yield server
