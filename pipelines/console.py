"""What a person sees of a local pipeline run: one line per step, the trainer's progress, the
cause of a failure — and everything else in a log file.

kfp.local prints every task's executor input and output JSON, its warnings and the nodes' logs
(hundreds of lines for the demo). ``RunConsole`` stands in for ``sys.stdout`` during the run:
every line goes to the log file; the console gets

* ``✓ stage data from S3  3.1 s`` / ``✗ train  41.0 s`` when a step finishes, and
  ``↻ train: attempt 2 of 3`` when kfp.local runs a failed step again (its retry policy),
* the data step's report (``data: 36 files (3 classes) ...``, the images per class, the files
  the training will skip), the check step's ``start:`` lines (``init_from=latest: ...``) and
  the publish step's ``latest:`` line,
* the trainer's own lines (``[node-0] [trainer] step 40/180 | ... | 512 img/s``, ``weights
  from s3://... ; new head for 5 classes (was 10)``, ``augment auto: crop (...)``),
* for a failed step, its one-line cause (the argument check's ``bad argument: epochs=0: ...``,
  the trainer's ``[trainer] error: ...``, or the last exception line).

``verbose=True`` shows every line as well.
"""

from __future__ import annotations

import io
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

ANSI = re.compile(r"\x1b\[[0-9;]*m")
STEP_NAMES = {
    "check-arguments-step": "check the arguments",
    "stage-dataset-step": "stage data from S3",
    "list-dataset-step": "list the data in S3",
    "training-job-component": "train",
    "evaluate-component": "evaluate",
    "publish-model-step": "publish the model to S3",
    "cleanup-component": "delete leftover training jobs",
}
STARTED = re.compile(r"Executing task '([^']+)'")
FINISHED = re.compile(r"Task '([^']+)' finished with status (\w+)")
CACHE_HIT = re.compile(r"Task (\S+) cache hit")
RETRYING = re.compile(r"Task '?([\w-]+)'? failed \(attempt (\d+)/(\d+)\)\. Retrying")
"""kfp.local about to run a failed step again (its retry policy: the training step's)."""
CAUSES = (
    re.compile(r"bad argument: (.+)"),
    re.compile(r"\[trainer\] error: (.+)"),
    # torchrun prefixes each line of a process's traceback with its rank ("[rank0]: ")
    re.compile(
        r"^\s*(?:\[[\w-]+\] )?(?:\[rank\d+\]: )?((?:[\w.]+\.)?\w+(?:Error|Exception|Exit)\w*: .+)$"
    ),
)
PROGRESS = re.compile(
    r"\[trainer\] (step \d+/\d+|done:|resuming|already complete|stopped|weights from|augment auto)"
)
"""The trainer's progress, and what it decided before step 1: where its weights came from (a
new head), whether it mirrors the images."""
DATA_REPORT = re.compile(r"^\s*(data|start|latest): ")
"""The data step's report (its counts, the images per class, the files the training skips), what
the check step settled the run starts from, and where the publish step left latest.json."""
NODE_PREFIX = re.compile(r"^\s*(\[[\w-]+\] )")
CONTINUATION = re.compile(r"^\s*\[[\w-]+\] (?!\[)(?![EWIF]\d{4} )(.+)$")
"""A further line of a node's multi-line error: the node's prefix, then neither a tag nor a
log record (``E1127 01:36:25 ...``)."""
MAX_CAUSE_LINES = 30


@dataclass
class StepRecord:
    name: str
    started: float
    cause: str = ""
    specific: bool = False
    """The cause is a named one (an argument, the trainer's error), not a generic exception."""
    done: bool = False


@dataclass
class RunConsole(io.TextIOBase):
    """A ``sys.stdout`` stand-in: the log file gets everything, the console a summary."""

    log: TextIO
    console: TextIO = field(default_factory=lambda: sys.__stdout__ or sys.stdout)
    verbose: bool = False
    steps: dict[str, StepRecord] = field(default_factory=dict)
    failed: list[StepRecord] = field(default_factory=list)
    _partial: str = ""
    _continued: tuple[StepRecord, str] | None = None
    """The step whose trainer error may go on over the next lines, and its node's prefix."""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.log.write(text)
        self._partial += text
        *lines, self._partial = self._partial.split("\n")
        for line in lines:
            self._line(ANSI.sub("", line))
        return len(text)

    def flush(self) -> None:
        self.log.flush()
        self.console.flush()

    def _say(self, text: str) -> None:
        self.console.write(text + "\n")
        self.console.flush()

    def _line(self, line: str) -> None:
        if self.verbose:
            self._say(line)
        if self._continues(line):
            return
        if found := STARTED.search(line):
            name = found.group(1)
            self.steps[name] = StepRecord(name, time.monotonic())
        elif found := FINISHED.search(line):
            self._finished(found.group(1), found.group(2))
        elif found := CACHE_HIT.search(line):
            task = found.group(1).strip("'")
            self._say(f"  ↺ {STEP_NAMES.get(task, task)}  (from cache: same data and settings)")
        elif found := RETRYING.search(line):
            task, attempt, attempts = found.group(1), int(found.group(2)), found.group(3)
            self._say(f"  ↻ {STEP_NAMES.get(task, task)}: attempt {attempt + 1} of {attempts}")
        elif (PROGRESS.search(line) or DATA_REPORT.search(line)) and not self.verbose:
            self._say("    " + line.strip())
        else:
            self._cause(line)

    def _cause(self, line: str) -> None:
        """Remember the first named cause (or else the last exception line) of the running step."""
        running = [s for s in self.steps.values() if not s.done]
        if not running:
            return
        step = max(running, key=lambda s: s.started)
        for pattern in CAUSES:
            if found := pattern.search(line):
                specific = pattern is not CAUSES[-1]
                if (specific and not step.specific) or (not specific and not step.specific):
                    step.cause, step.specific = found.group(1).strip(), specific
                    prefix = NODE_PREFIX.match(line)
                    if specific and prefix:
                        self._continued = (step, prefix.group(1))
                return

    def _continues(self, line: str) -> bool:
        """Add ``line`` to the cause it continues (a trainer error of several lines, e.g. every
        unreadable image); False when it is no such line."""
        if self._continued is None:
            return False
        step, prefix = self._continued
        found = CONTINUATION.match(line)
        if not found or not line.lstrip().startswith(prefix) or step.done:
            self._continued = None
            return False
        if step.cause.count("\n") < MAX_CAUSE_LINES:
            step.cause += "\n" + found.group(1).rstrip()
        return True

    def _finished(self, name: str, status: str) -> None:
        step = self.steps.get(name) or StepRecord(name, time.monotonic())
        step.done = True
        seconds = time.monotonic() - step.started
        ok = status == "SUCCESS"
        self._say(f"  {'✓' if ok else '✗'} {STEP_NAMES.get(name, name)}  {seconds:.1f} s")
        if not ok:
            self.failed.append(step)
            if step.cause and not self.verbose:
                self._say(f"      {step.cause}")

    def failure(self) -> str:
        """The first failed step and its cause, in one line ('' when none failed)."""
        if not self.failed:
            return ""
        step = self.failed[0]
        return f"step '{STEP_NAMES.get(step.name, step.name)}' failed" + (
            f": {step.cause}" if step.cause else ""
        )


def open_log(folder: Path) -> Path:
    """A new log file for one run under ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"run-{time.strftime('%Y%m%d-%H%M%S')}.log"
