"""Console lines that reach a shared log whole.

Every process of a node (torchrun's ranks, mpirun's) writes to the one pipe the pod's log is
read from. With ``PYTHONUNBUFFERED=1`` (the image sets it, so that logs are live) Python writes a
``print``'s text and its newline in two system calls, and two ranks printing at once leave
``rank 0 step 5rank 1 step 5`` and an empty line: measured, 4,198 of 10,000 lines of two
processes printing together. The launcher reads the log back (the failing rank's last lines,
the trainer's errors), so it would misread them. :func:`whole_lines` makes stdout and stderr
line buffered instead: each line leaves in one write, still at its newline.
"""

from __future__ import annotations

import sys


def whole_lines() -> None:
    """Write every line of stdout and stderr in one system call, as soon as it ends."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:  # a TextIOWrapper (not a replacement a host installed)
            reconfigure(line_buffering=True, write_through=False)
