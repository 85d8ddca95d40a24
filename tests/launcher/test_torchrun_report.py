"""Plain torchrun ends a failed node's log with its own ~35 lines and exits 1, whatever the
worker's code: the step reads torchrun's report back (the failing rank, its exit code or signal)
and shows the program's own last lines, not torchrun's traceback."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from components.launcher import JobFailed, TrainSpec, run_job
from components.launcher.options import LocalOptions
from components.launcher.torchrun_report import failure_lines, program_lines, read_failure

NOISE = 60
"""Lines the program prints before its last words: they push them far above torchrun's."""
PROGRAM = textwrap.dedent(
    f"""
    import os, pathlib, signal, sys, time
    rank = int(os.environ["RANK"])
    done = pathlib.Path(__file__).with_name("rank-0-printed")
    for n in range({NOISE}):
        # One write per line: under PYTHONUNBUFFERED print() writes the newline apart, and
        # the other rank's line lands between (kfp_ddp.console.whole_lines does it for ours).
        sys.stdout.write(f"rank {{rank}} working {{n}}\\n")
        sys.stdout.flush()
    if rank == 0:
        done.touch()
    if rank == 1:
        # rank 0's lines first, all of them (a busy machine may start it late): rank 1's last
        # words are the log's last, and torchrun stops rank 0 only after it printed its own
        deadline = time.monotonic() + 60
        while not done.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)
        how = sys.argv[1]
        if how == "raise":
            raise FileNotFoundError("labels.txt is missing: put it beside the data")
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        print("my own error: the labels file is missing", file=sys.stderr, flush=True)
        sys.exit(3)
    time.sleep(30)
    """
)


def _torchrun(tmp_path: Path, how: str) -> list[str]:
    """Real torchrun, two workers, rank 1 failing ``how``: its whole output, as a pod logs it."""
    script = tmp_path / "my_train.py"
    script.write_text(PROGRAM)
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(script), how],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1  # plain torchrun: 1, whatever the worker's code
    return done.stdout.splitlines()


def test_the_root_cause_names_the_rank_and_its_exit_code(tmp_path: Path):
    lines = _torchrun(tmp_path, "exit")
    failure = read_failure(lines)
    assert failure is not None
    assert failure.describe() == f"rank 1 of {tmp_path / 'my_train.py'} exited with code 3"
    own = program_lines(lines)
    assert own[-1] == "my own error: the labels file is missing"
    assert not [line for line in own if "torch" in line or "ChildFailedError" in line]
    assert sum("working" in line for line in own) == 2 * NOISE  # nothing of the program lost


def test_the_programs_own_traceback_stays(tmp_path: Path):
    lines = _torchrun(tmp_path, "raise")
    failure = read_failure(lines)
    assert failure is not None and failure.exit_code == 1 and failure.rank == 1
    said, shown = failure_lines(lines, 5)
    assert said.endswith("exited with code 1")
    assert shown[-1] == "FileNotFoundError: labels.txt is missing: put it beside the data"
    assert any("Traceback (most recent call last):" in line for line in program_lines(lines))


def test_a_worker_killed_by_a_signal_is_said_so(tmp_path: Path):
    failure = read_failure(_torchrun(tmp_path, "kill"))
    assert failure is not None
    assert failure.describe() == f"rank 1 of {tmp_path / 'my_train.py'} was killed by SIGKILL"


def test_lines_without_a_report_are_left_as_they_are():
    lines = ["step 1", "Traceback (most recent call last):", '  File "x.py"', "ValueError: no"]
    assert read_failure(lines) is None
    assert program_lines(lines) == lines


@pytest.mark.parametrize("api", ["pytorchjob", "trainjob"])
def test_the_local_job_error_shows_the_rank_its_code_and_the_programs_last_lines(
    tmp_path: Path, api: str
):
    script = tmp_path / "my_train.py"
    script.write_text(PROGRAM)
    spec = TrainSpec(
        api=api,
        name="mine",
        workers=1,
        nproc_per_node=2,
        command=["torchrun", str(script)],
        args=["exit"],
    )
    with pytest.raises(JobFailed) as failed:
        run_job(spec, backend="local", options=LocalOptions(log=lambda line: None, timeout_s=120))
    message = str(failed.value)
    assert "exited with code 1 (" in message  # the node's own code, as the operator sees it
    assert f"its torchrun says rank 1 of {script} exited with code 3" in message
    last = message.splitlines()[-1]
    assert last.endswith("] my own error: the labels file is missing"), message
    assert "ChildFailedError" not in message and "torch/distributed" not in message
