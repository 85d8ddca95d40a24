"""Start a Python module the way a terminal would, with Ctrl-C (SIGINT) raising KeyboardInterrupt.

A test run started in the background by a non-interactive shell (``make test &``, a CI agent)
inherits SIGINT *ignored* (POSIX job control), and so does every child it starts: a test that
presses Ctrl-C would then see the program carry on. The tests that send SIGINT start their
program through ``module_command``, which restores Python's default handler first.
"""

from __future__ import annotations

import sys

_AS_IN_A_TERMINAL = (
    "import runpy, signal, sys; "
    "signal.signal(signal.SIGINT, signal.default_int_handler); "
    "sys.argv = sys.argv[1:]; "
    "runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)"
)


def module_command(module: str, *args: str) -> list[str]:
    """``python -m module args...`` with SIGINT handled as in a terminal."""
    return [sys.executable, "-c", _AS_IN_A_TERMINAL, module, *args]
