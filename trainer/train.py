"""``python -m trainer.train``: data-parallel image classification that resumes exactly.

Read top to bottom: :func:`main` parses flags into a :class:`~trainer.config.TrainConfig`,
:func:`run_training` picks the device, joins the process group (and always leaves it) and hands
over to :class:`~trainer.loop.Trainer`, which owns the loop (set-up → steps → validation →
checkpoints → export).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import typing
from pathlib import Path

from kfp_ddp.atomic_files import write_json_atomic
from kfp_ddp.console import whole_lines
from trainer.config import TrainConfig, config_from, load_config_file
from trainer.data_worker_loss import memory_limit_hits, verdict, worker_death
from trainer.device import configure_backends, select_device, settle_for_device
from trainer.distributed import (
    StopRequest,
    destroy_process_group,
    dist_env_from,
    init_process_group,
)
from trainer.errors import (
    ERROR_SOURCE,
    EXIT_CONFIG,
    EXIT_PEER_LOST,
    ConfigError,
    TrainerError,
)
from trainer.flags import parse_flags
from trainer.loop import Trainer
from trainer.model_shapes import check_model_input
from trainer.out_of_memory import is_out_of_memory, out_of_memory


def main(argv: list[str] | None = None) -> int:
    """Parse flags (and ``--config``), then train; returns the process exit code."""
    args = parse_flags(argv)  # exits 2 on malformed flags
    try:
        file_values = load_config_file(args.pop("config")) if "config" in args else {}
        config = config_from(file_values, args)
    except ConfigError as err:
        _error(err)
        return EXIT_CONFIG
    return run_training(config)


def run_training(config: TrainConfig, environ: typing.Mapping[str, str] = os.environ) -> int:
    """Train with ``config`` in this process's role of the job; never leaves a process group."""
    stop = StopRequest()
    stop.install()
    device = None  # until select_device picks it
    limit_hits = memory_limit_hits()  # before any data-loading worker starts
    try:
        env = dist_env_from(environ)
        device = select_device(config, env, environ)
        config = settle_for_device(config, device, env)
        # before it meets the others
        check_model_input(config.model, config.image_size, config.batch_size)
        configure_backends(config, device, env)
        control_group = init_process_group(env, device, config.init_timeout_s)
        return Trainer(config, env, device, control_group, stop, environ).run()
    except TrainerError as err:
        _error(err)
        if not err.on_another_rank:
            _report_to_torchrun(err, environ)
        return err.exit_code
    except RuntimeError as err:  # torch.distributed.DistError is one
        died = worker_death(err)
        if died is not None:
            outcome = verdict(died, config, limit_hits)
            _error(outcome)
            if isinstance(outcome, TrainerError):
                _report_to_torchrun(outcome, environ)
            return outcome.exit_code
        if is_out_of_memory(err):
            oom = out_of_memory(err, config, device)
            _error(oom)
            _report_to_torchrun(oom, environ)
            return oom.exit_code
        if not lost_peer(err):
            raise
        _error(
            f"lost contact with another rank ({type(err).__name__}: {str(err).splitlines()[0]}); "
            f"exiting {EXIT_PEER_LOST} so the job is restarted and resumes from its last checkpoint"
        )
        return EXIT_PEER_LOST
    finally:
        destroy_process_group()
        stop.restore()


PEER_LOSS_SIGNS = (
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "timed out",
    "timeout",
    "nccl",
    "socket",
)
# gloo's own wording for a peer that is gone or stuck. torch does not always prefix it with the
# source file (gloo/transport/tcp/pair.cc): a collective that finds its pair already closed by
# another one's timeout raises just "Application timeout caused pair closure".
GLOO_PEER_LOSS_MESSAGES = (
    "application timeout caused pair closure",
    "ms for recv operation to complete",
    "ms for send operation to complete",
    "remote peer closed the connection",
)


def lost_peer(err: BaseException) -> bool:
    """Whether ``err`` says a collective failed because another rank is gone or stuck.

    torch raises ``torch.distributed.DistError`` subclasses for most of these; gloo's transport
    errors still arrive as plain RuntimeErrors naming the connection.
    """
    import torch.distributed as dist

    if isinstance(err, getattr(dist, "DistError", ())):
        return True
    text = str(err).lower()
    if any(message in text for message in GLOO_PEER_LOSS_MESSAGES):
        return True
    transport = "gloo" in text or "nccl" in text
    return transport and any(sign in text for sign in PEER_LOSS_SIGNS)


def _error(err: Exception | str) -> None:
    print(f"[trainer] error: {err}", file=sys.stderr, flush=True)


def _report_to_torchrun(err: TrainerError, environ: typing.Mapping[str, str]) -> None:
    """Leave the message where torchrun's agent looks for a worker's error.

    torchrun collects ``TORCHELASTIC_ERROR_FILE`` of failed workers; ``python -m
    trainer.torchrun`` prints the root cause's message as the pod's last log line.
    """
    path = environ.get("TORCHELASTIC_ERROR_FILE")
    if path:
        record = {"message": str(err), "timestamp": int(time.time()), "source": ERROR_SOURCE}
        with contextlib.suppress(OSError):
            write_json_atomic(Path(path), record)


if __name__ == "__main__":
    whole_lines()  # a line of this process is never torn by another's in the one log
    sys.exit(main())
