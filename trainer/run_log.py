"""What a run tells its user: progress lines on the console and records in ``metrics.jsonl``.

Rank 0 only: every other rank's :class:`RunLog` prints and writes nothing.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Any

from kfp_ddp.atomic_files import write_atomic


class RunLog:
    """Console lines (through the progress bar when one is shown) and ``metrics.jsonl`` records."""

    def __init__(self, output_dir: Path, *, is_main: bool):
        self.output_dir = Path(output_dir)
        self.is_main = is_main
        self.bar = None

    @property
    def metrics_path(self) -> Path:
        return self.output_dir / "metrics.jsonl"

    def line(self, message: str) -> None:
        """Print ``[trainer] message`` (rank 0)."""
        if not self.is_main:
            return
        text = f"[trainer] {message}"
        if self.bar is not None:
            self.bar.write(text)
        else:
            print(text, flush=True)

    def record(self, record: dict[str, Any]) -> None:
        """Append one metrics.jsonl record (rank 0)."""
        if self.is_main:
            with open(self.metrics_path, "a") as handle:
                handle.write(json.dumps(record) + "\n")

    def reset_metrics(self, resumed_step: int | None) -> None:
        """Start metrics.jsonl afresh, or drop records past the step we resume from (rank 0)."""
        if not self.is_main:
            return
        self.output_dir.mkdir(parents=True, exist_ok=True)
        kept = []
        if resumed_step is not None and self.metrics_path.exists():
            for line in self.metrics_path.read_text().splitlines():
                with contextlib.suppress(json.JSONDecodeError):
                    if json.loads(line).get("step", 0) <= resumed_step:
                        kept.append(line)
        text = "".join(line + "\n" for line in kept)
        write_atomic(self.metrics_path, lambda handle: handle.write(text.encode()))

    # ----------------------------------------------------------------------- progress bar
    def open_bar(self, *, total: int, initial: int) -> None:
        """A tqdm bar on an interactive terminal (rank 0; nothing in pod logs)."""
        if self.is_main and sys.stderr.isatty() and initial < total:
            with contextlib.suppress(ImportError):
                from tqdm import tqdm

                self.bar = tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True)

    def advance_bar(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def close_bar(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
