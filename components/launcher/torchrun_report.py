"""What plain ``torchrun`` says when a worker fails, read back from a node's log.

A node that runs the user's program under plain ``torchrun`` exits 1 whatever its worker's exit
code was, and its log ends with ~35 lines of torchrun's own: its log records, its Python
traceback (``ChildFailedError``) and its failure report, which holds what matters::

    Root Cause (first observed failure):
    [0]:
      rank      : 1 (local_rank: 1)
      exitcode  : 3 (pid: 9298)

``read_failure`` finds the root cause (the failing rank, its exit code or signal, the program),
and ``program_lines`` drops torchrun's lines so the program's own last lines are what a failed
step shows. (``python -m trainer.torchrun`` keeps the worker's exit code itself; this is for the
user's own image and command.)
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

ROOT_CAUSE = "Root Cause (first observed failure):"
REPORT_RULE = re.compile(r"^={20,}\s*$")
FAILED_PROGRAM = re.compile(r"^(?P<program>\S.*) FAILED\s*$")
REPORT_FIELD = re.compile(r"^\s+(?P<name>rank|exitcode)\s*:\s*(?P<value>.*)$")
RANK = re.compile(r"^(?P<rank>\d+)")
EXIT_CODE = re.compile(r"^(?P<code>-?\d+)(?:.*\((?P<signal>SIG\w+)\))?")
TORCH_LOG_RECORD = re.compile(r"^[IWEF]\d{4} [\d:.]+ \d+ \S*torch/\S+:\d+\] ")
"""A log record of torch.distributed's own (``W1127 02:49:39.245000 9282 torch/...] ...``)."""
CHILD_FAILED = "ChildFailedError:"
TRACEBACK = "Traceback (most recent call last):"


@dataclass(frozen=True)
class TorchrunFailure:
    """The first failure torchrun observed: which rank, and how it ended."""

    rank: int
    exit_code: int
    """The worker's exit code; negative: it was killed by signal ``-exit_code``."""
    program: str
    signal: str = ""

    def describe(self) -> str:
        """'rank 1 of /app/train.py exited with code 3' (or '... was killed by SIGKILL')."""
        if self.exit_code < 0:
            how = f"was killed by {self.signal or f'signal {-self.exit_code}'}"
        else:
            how = f"exited with code {self.exit_code}"
        return f"rank {self.rank} of {self.program} {how}"


LINES_READ = 200
"""A node's last lines kept for this: torchrun's traceback and report take ~35 and the
program's own may be far above them (the user's traceback, its last records)."""


def failure_lines(lines: Sequence[str], shown: int) -> tuple[str, list[str]]:
    """(what torchrun says failed, or ''; the program's own last ``shown`` lines) of a node's
    last lines: what a failed step shows of the node."""
    failure = read_failure(lines)
    return (failure.describe() if failure else ""), program_lines(lines)[-shown:]


def read_failure(lines: Sequence[str]) -> TorchrunFailure | None:
    """The root cause of torchrun's last failure report in ``lines``; None without one."""
    start = _last_index(lines, lambda line: line.strip() == ROOT_CAUSE)
    if start is None:
        return None
    fields: dict[str, str] = {}
    for line in lines[start + 1 :]:
        if REPORT_RULE.match(line):
            break
        found = REPORT_FIELD.match(line)
        if found:
            fields.setdefault(found["name"], found["value"].strip())
    rank, code = RANK.match(fields.get("rank", "")), EXIT_CODE.match(fields.get("exitcode", ""))
    if rank is None or code is None:
        return None
    program = ""
    for line in reversed(lines[:start]):
        named = FAILED_PROGRAM.match(line)
        if named:
            program = named["program"]
            break
    return TorchrunFailure(
        rank=int(rank["rank"]),
        exit_code=int(code["code"]),
        program=program or "the program",
        signal=code["signal"] or "",
    )


def program_lines(lines: Sequence[str]) -> list[str]:
    """``lines`` without torchrun's own: its log records, and its traceback and failure report
    (from the ``Traceback`` that ends in ``ChildFailedError`` to the report's closing rule).
    The program's own lines, tracebacks included, stay."""
    kept: list[str] = []
    skipping = False
    rules_seen = 0
    for index, line in enumerate(lines):
        if skipping:
            if REPORT_RULE.match(line):
                rules_seen += 1
                skipping = rules_seen < 2
            continue
        if line.strip() == TRACEBACK and _ends_in_child_failure(lines, index):
            skipping, rules_seen = True, 0
            continue
        if TORCH_LOG_RECORD.match(line):
            continue
        kept.append(line)
    return kept


def _ends_in_child_failure(lines: Sequence[str], start: int) -> bool:
    """The traceback starting at ``start`` is torchrun's: it ends in ``ChildFailedError``."""
    for line in lines[start + 1 :]:
        if line.startswith((" ", "\t")):
            continue
        return CHILD_FAILED in line
    return False


def _last_index(lines: Sequence[str], test) -> int | None:
    for index in range(len(lines) - 1, -1, -1):
        if test(lines[index]):
            return index
    return None
