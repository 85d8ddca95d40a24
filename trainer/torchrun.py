"""``python -m trainer.torchrun``: torchrun, with exit codes the Training Operator can act on.

Plain torchrun turns a SIGTERM (eviction, preemption) into a Python traceback and exit status 1,
which the operator's ExitCode restart policy reads as a *permanent* failure — even though every
worker saved a checkpoint and exited 143. This wrapper runs torchrun unchanged and maps:

* torchrun itself got a signal → ``128 + signal`` (retryable);
* torchrun lost its rendezvous or its store (the node that hosts c10d's store, worker 0 of a
  Workers-only PyTorchJob, was killed or rescheduled; a peer never came) → 200, like a trainer
  that lost contact with another rank (retryable: seen on a real node, where a SIGKILL of worker
  0 made worker 1's torchrun exit 1 and the operator failed the whole job for good);
* workers failed → the first permanent worker code (1-127) if there is one, otherwise a
  retryable code (143 when workers stopped on SIGTERM, ``128 + signal`` when killed by one).

A node that is a client of the rendezvous store first waits until the store answers
(:mod:`trainer.rendezvous_wait`), so a restarted pod does not lose torchrun's 60 s ``read_timeout``
on the old address of a peer that is being replaced.

When a worker ended with a permanent error, its one-line message (left in torchrun's
``TORCHELASTIC_ERROR_FILE`` by the trainer) is printed last, so the pod's log ends with the cause
and the fix, not with torchrun's stack trace.

Usage is torchrun's: ``python -m trainer.torchrun --nproc-per-node 8 -m trainer.train ...``.
"""

from __future__ import annotations

import signal
import sys

from kfp_ddp.console import whole_lines
from trainer.errors import ERROR_SOURCE, EXIT_PEER_LOST, EXIT_SIGTERM
from trainer.rendezvous_wait import store_to_wait_for, wait_for_store


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
    from torch.distributed import DistNetworkError, DistStoreError
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError
    from torch.distributed.run import main as torchrun_main

    store = store_to_wait_for(sys.argv[1:] if argv is None else argv)
    if store is not None:  # a replaced peer's old address would cost torchrun its read_timeout
        wait_for_store(store, say=lambda line: print(line, file=sys.stderr, flush=True))
    try:
        torchrun_main(argv)
    except SignalException as err:
        return 128 + int(getattr(err, "sigval", signal.SIGTERM))
    except (RendezvousError, DistNetworkError, DistStoreError) as err:
        print(
            f"[torchrun] lost the rendezvous with the other nodes ({type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else ''}); exiting {EXIT_PEER_LOST} so the "
            "job is restarted and resumes from its last checkpoint",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_PEER_LOST
    except ChildFailedError as err:
        codes = [failure.exitcode for failure in err.failures.values()]
        code = worker_exit_code(codes) or EXIT_SIGTERM
        cause = root_cause(err.failures, code)
        if cause:
            print(cause, file=sys.stderr, flush=True)
        return code
    return 0


def root_cause(failures: dict, exit_code: int) -> str | None:
    """The earliest message a worker left in a trainer error file, as the pod's last line.

    Only the rank where a permanent error arose writes one (ranks that stop because of it do
    not), and that rank may then be stopped by torchrun before its own exit code is seen.
    """
    ours = [
        (failure.timestamp, rank, failure)
        for rank, failure in failures.items()
        if isinstance(failure.error_file_data, dict)
        and failure.error_file_data.get("source") == ERROR_SOURCE
    ]
    if not ours:
        return None
    _, rank, failure = min(ours, key=lambda item: (item[0], item[1]))
    return f"[trainer] error (rank {rank}, exit {exit_code}): {failure.message}"


if __name__ == "__main__":
    whole_lines()  # a line of this process is never torn by another's in the one log
    sys.exit(main())
