"""What every launcher test gets."""

from __future__ import annotations

from pathlib import Path

import pytest

from components.launcher.backends.local import NODES_DIR_ENV


@pytest.fixture(autouse=True)
def local_nodes_in_the_tests_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The local backend's node disks (``NODES_DIR/<replica>``) under the test's own folder,
    where a test with ``workdir=tmp_path`` has them anyway (WORKDIR/nodes): a test that runs its
    job from the repository (its commands are relative to it) would otherwise leave ``nodes/``
    in the checkout. A test of the WORKDIR/nodes default removes the variable."""
    monkeypatch.setenv(NODES_DIR_ENV, str(tmp_path / "nodes"))
