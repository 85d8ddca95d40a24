"""Where the local backend puts its nodes' disks in the tests.

The local backend puts each replica's disk under ``$KFP_DDP_LOCAL_NODES_DIR``, else
WORKDIR/nodes. A test that runs its job from the repository (its commands are relative to it),
or a kfp.local step (which runs in the test process's folder), would leave ``nodes/`` in the
checkout, so the conftests of such tests use :func:`local_nodes_in_the_tests_folder`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from components.launcher.backends.local import NODES_DIR_ENV


@pytest.fixture(autouse=True)
def local_nodes_in_the_tests_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The local backend's node disks (``NODES_DIR/<replica>``) under the test's own folder,
    where a test with ``workdir=tmp_path`` has them anyway (WORKDIR/nodes). A test of the
    WORKDIR/nodes default removes the variable."""
    monkeypatch.setenv(NODES_DIR_ENV, str(tmp_path / "nodes"))
