"""One local run at a time in a workspace (pipelines/workspace_lock.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipelines.local_run import LocalRunError, run_local
from pipelines.workspace_lock import held_workspace


def test_a_second_run_in_a_workspace_in_use_is_refused_before_it_writes(tmp_path: Path):
    """Two runs in one workspace shared their nodes' folders: a node's TMPDIR emptied when it
    stopped, under the other run's node."""
    workspace = tmp_path / "kfp-ddp-workspace"
    workspace.mkdir()
    with held_workspace(workspace):  # the first run, as the kernel sees it
        with pytest.raises(LocalRunError) as refused:
            run_local({}, workspace=workspace)
        assert str(refused.value) == (
            f"the workspace {workspace} is in use by another local run (pid {os.getpid()}); "
            "wait for it to end, or give this run a workspace of its own (--workspace, or the "
            "demo's --output)"
        )
        assert sorted(p.name for p in workspace.iterdir()) == [".kfp-ddp-run.lock"]
    with held_workspace(workspace):  # the first one's end freed it
        pass
