"""``python -m trainer.torchrun``: torchrun, with exit codes the Training Operator can act on.

Plain torchrun turns a SIGTERM (eviction, preemption) into a Python traceback and exit status 1,
which the operator's ExitCode restart policy reads as a *permanent* failure — even though every
worker saved a checkpoint and exited 143. This wrapper runs torchrun unchanged and maps:

* torchrun itself got a signal → ``128 + signal`` (retryable);
* workers failed → the first permanent worker code (1-127) if there is one, otherwise a
  retryable code (143 when workers stopped on SIGTERM, ``128 + signal`` when killed by one).

Usage is torchrun's: ``python -m trainer.torchrun --nproc-per-node 8 -m trainer.train ...``.
"""

from __future__ import annotations

import signal
import sys

from trainer.errors import EXIT_SIGTERM


def worker_exit_code(exit_codes: list[int]) -> int:
    """One exit status for the pod from its workers' statuses (negative: killed by a signal)."""
    permanent = [code for code in exit_codes if 0 < code < 128]
    if permanent:
        return permanent[0]
    for code in exit_codes:
        if code < 0:
            return 128 + (-code)
        if code >= 128:
            return code
    return 0


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    try:
        torchrun_main(argv)
    except SignalException as err:
        return 128 + int(getattr(err, "sigval", signal.SIGTERM))
    except ChildFailedError as err:
        codes = [failure.exitcode for failure in err.failures.values()]
        return worker_exit_code(codes) or EXIT_SIGTERM
    return 0


if __name__ == "__main__":
    sys.exit(main())
