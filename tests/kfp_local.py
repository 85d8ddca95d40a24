"""kfp.local's workspace for a test, in its tmp_path.

``kfp.local.init`` without ``workspace_root`` makes ``/tmp/kfp-workspace-XXXX`` and never removes
it (every test's run left one behind); tests pass ``workspace_root=workspace_root(tmp_path)``.
``tests/test_kfp_local_workspace.py`` checks that every ``local.init`` in the tests does.
"""

from __future__ import annotations

from pathlib import Path


def workspace_root(tmp_path: Path) -> str:
    """A folder for KFP's workspace (mounted at /kfp-workspace), made now: podman, unlike Docker,
    refuses to bind-mount a folder that does not exist."""
    folder = tmp_path / "kfp-workspace"
    folder.mkdir(mode=0o700, exist_ok=True)
    return str(folder)
