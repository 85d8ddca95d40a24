"""What a person sees of a local run: a failed step's cause, all of it when it has several
lines (every unreadable image), and not the log records that follow it."""

from __future__ import annotations

import io

from pipelines.console import RunConsole


def _console(lines: list[str]) -> tuple[RunConsole, str]:
    shown = io.StringIO()
    console = RunConsole(log=io.StringIO(), console=shown)
    console.write("\n".join(lines) + "\n")
    return console, shown.getvalue()


def test_a_trainer_error_of_several_lines_is_the_whole_cause():
    console, shown = _console(
        [
            "Executing task 'training-job-component'",
            "    data: 25 files (2 classes) in s3://b/d, listed in 0.1 s",
            "    [node-0] [trainer] error: 2 of 23 images cannot be read (keys ...):",
            "    [node-0]   train/a/empty.jpg (class a): cannot identify image file",
            "    [node-0]   train/b/cut.png (class b): image file is truncated",
            "    [node-0] fix or delete these files in the data set",
            "    [node-0] E1127 01:36:25.334000 26591 api.py:1002] failed (exitcode: 3)",
            "    [node-0] [trainer] error (rank 0, exit 3): 2 of 23 images cannot be read",
            "Task 'training-job-component' finished with status FAILURE",
        ]
    )
    assert console.failure() == (
        "step 'train' failed: 2 of 23 images cannot be read (keys ...):\n"
        "  train/a/empty.jpg (class a): cannot identify image file\n"
        "  train/b/cut.png (class b): image file is truncated\n"
        "fix or delete these files in the data set"
    )
    assert "data: 25 files (2 classes)" in shown


def test_a_one_line_error_stays_one_line():
    console, _ = _console(
        [
            "Executing task 'training-job-component'",
            "    [node-0] [trainer] error: --batch-size 64 is larger than this rank's share",
            "    [node-1] [trainer] step 1/9",
            "Task 'training-job-component' finished with status FAILURE",
        ]
    )
    assert console.failure() == (
        "step 'train' failed: --batch-size 64 is larger than this rank's share"
    )


def test_an_exception_in_a_ranks_traceback_is_the_cause():
    """torchrun prefixes a process's traceback with its rank: an uncaught exception (no
    '[trainer] error') is still the cause shown, not a bare 'failed'."""
    console, _ = _console(
        [
            "Executing task 'training-job-component'",
            "    [node-0] [rank0]: Traceback (most recent call last):",
            '    [node-0] [rank0]:   File "/app/trainer/loop.py", line 1, in step',
            "    [node-0] [rank0]: ValueError: Expected more than 1 value per channel",
            "    [node-0] E1201 05:38:13.299000 8007 api.py:1002] failed (exitcode: 1)",
            "Task 'training-job-component' finished with status FAILURE",
        ]
    )
    assert console.failure() == (
        "step 'train' failed: ValueError: Expected more than 1 value per channel"
    )


def test_a_retried_step_says_which_attempt_runs():
    """The training step is retried (a retry re-attaches to its job and fails in seconds after a
    permanent failure): each attempt's ✗ is followed by the attempt that runs next."""
    attempt = [
        "Executing task 'training-job-component'",
        "    [node-0] [trainer] error: out of this node's memory with --batch-size 512",
        "Task 'training-job-component' finished with status FAILURE",
    ]
    retrying = "Task training-job-component failed (attempt {}/3). Retrying in 0.0s..."
    lines = [*attempt, retrying.format(1), *attempt, retrying.format(2), *attempt]
    console, shown = _console(lines)
    steps = [line.strip() for line in shown.splitlines() if line.strip()[:1] in ("✗", "↻")]
    assert [step.split("  ")[0] for step in steps] == [
        "✗ train",
        "↻ train: attempt 2 of 3",
        "✗ train",
        "↻ train: attempt 3 of 3",
        "✗ train",
    ]
    assert console.failure() == (
        "step 'train' failed: out of this node's memory with --batch-size 512"
    )
