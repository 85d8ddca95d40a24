"""Trainer processes forked from a server that imported torch once, not one interpreter each.

On 2 cores the suite is CPU-bound, and a ``python -m trainer.train`` spends ~3.5 CPU-s importing
torch, torch._dynamo (the optimizer's constructor imports it), torchvision and TensorBoard before
it reads a flag: with a few dozen tiny two-rank runs that is minutes of the suite. Python's own
``forkserver`` start method keeps one single-threaded server per pytest worker that imported them
(:mod:`tests.trainer.trainer_preload`) and forks each rank from it.

Each rank is still its own process, with the environment, working directory, log file and exit
code of ``python -m trainer.train``: the child sets them and runs the module as ``__main__``
(:func:`runpy.run_module`, what ``-m`` does), so SIGKILL, SIGTERM, the exit codes and the
DataLoader workers it spawns behave as in a pod. What it does not cover, the interpreter start
itself, every other test that runs the trainer covers: torchrun's ranks, the local backend's
"pods", kfp.local's steps, the image's containers and the real node's pods all start
``python -m trainer.train``.
"""

from __future__ import annotations

import atexit
import io
import multiprocessing
import os
import runpy
import subprocess
import sys
from pathlib import Path

PRELOAD = "tests.trainer.trainer_preload"
_context = multiprocessing.get_context("forkserver")
_context.set_forkserver_preload([PRELOAD])
_started: list[multiprocessing.process.BaseProcess] = []


@atexit.register
def _kill_leftovers() -> None:
    """At the pytest worker's exit, kill the ranks a failed test left running: multiprocessing
    would otherwise wait for them (they are not daemons: a rank starts DataLoader workers)."""
    for process in _started:
        if process.exitcode is None:
            process.kill()
            process.join(10)


def _follow_omp_num_threads(env: dict[str, str]) -> None:
    """Give torch the compute threads this rank's ``OMP_NUM_THREADS`` asks for.

    A fresh interpreter's OpenMP runtime reads it when torch loads; here torch loaded in the
    server, under the environment of whichever test first started it. Without this a rank ran
    with the server's count: two ranks of 2 threads on 2 cores train ~4x slower than 1-thread
    ones, and a deterministic run's weights differ between thread counts (CPU reductions split
    by thread), so a resumed run no longer matched a reference made by another server.
    (Unset, the trainer sets the count itself: ``trainer.distributed.configure_cpu_threads``.)
    """
    value = env.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    if value:
        import torch  # the server's: already imported

        torch.set_num_threads(int(value))


def _run_trainer(
    args: list[str], env: dict[str, str], cwd: str, log_path: str, new_session: bool
) -> None:
    """In the forked child: become ``python -u -m trainer.train ARGS`` with ``env`` in ``cwd``."""
    if new_session:
        os.setsid()  # as Popen(start_new_session=True): a process group the test can signal
    os.environ.clear()
    os.environ.update(env)
    _follow_omp_num_threads(env)
    os.chdir(cwd)
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    # Unbuffered, as `python -u`: a test reads the log while the rank runs.
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True)
    sys.argv = ["-m", *args]
    try:
        runpy.run_module("trainer.train", run_name="__main__", alter_sys=True)
    finally:
        atexit._run_exitfuncs()  # what the interpreter's exit would run; the server skips it
        sys.stdout.flush()
        sys.stderr.flush()


class ForkedTrainer:
    """The parts of :class:`subprocess.Popen` the tests use, for a rank forked by the server."""

    def __init__(
        self,
        args: list[str],
        *,
        env: dict[str, str],
        cwd: Path,
        log_path: Path,
        new_session: bool = False,
    ):
        self._process = _context.Process(
            target=_run_trainer,
            args=(args, env, str(cwd), str(log_path), new_session),
            daemon=False,
        )
        self._process.start()
        _started[:] = [p for p in _started if p.exitcode is None] + [self._process]
        self.pid = self._process.pid
        self.args = args

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(["trainer.train", *self.args], timeout or 0)
        return self._process.exitcode

    def send_signal(self, signum: int) -> None:
        if self._process.exitcode is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self._process.kill()

    def terminate(self) -> None:
        self._process.terminate()
