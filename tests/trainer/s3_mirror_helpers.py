"""Helpers for the checkpoint-mirror tests (its fixtures, s3_env and bucket, are in conftest.py)."""

from __future__ import annotations

import time
from pathlib import Path

from tests.trainer.trainer_launch import logs
from trainer import checkpoint as ckpt


def keys(client, bucket: str, prefix: str = "") -> list[str]:
    """Every key under ``prefix``, sorted."""
    found = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        found += [obj["Key"] for obj in page.get("Contents", ())]
    return sorted(found)


def remote_steps(client, bucket: str, prefix: str) -> dict[int, set[str]]:
    """``step: {file names}`` of every ``step-N/`` folder under ``prefix``."""
    steps: dict[int, set[str]] = {}
    for key in keys(client, bucket, prefix + "/"):
        folder, _, name = key.removeprefix(prefix + "/").partition("/")
        step = ckpt.step_of(Path(folder))
        assert step is not None and name, f"unexpected key {key}"
        steps.setdefault(step, set()).add(name)
    return steps


def complete_remote_steps(client, bucket: str, prefix: str) -> list[int]:
    """Steps whose folder holds its marker, newest first."""
    steps = remote_steps(client, bucket, prefix)
    return sorted((s for s, names in steps.items() if ckpt.MARKER_FILE in names), reverse=True)


def wait_for_line(log: Path, text: str, procs, timeout: float = 120.0) -> None:
    """Until ``text`` appears in the file ``log``. Fails at once when a trainer has failed (the
    others cannot get on without it) or all have exited, and then or on the timeout shows every
    trainer's exit status and log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and text in log.read_text(errors="replace"):
            return
        codes = [p.poll() for p in procs]
        if any(code not in (None, 0) for code in codes) or None not in codes:
            raise AssertionError(
                f"the trainers exited ({codes}) before logging {text!r}\n{logs(log.parent)}"
            )
        time.sleep(0.01)
    codes = [p.poll() for p in procs]
    raise AssertionError(f"timed out waiting for {text!r} ({codes})\n{logs(log.parent)}")
