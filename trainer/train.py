"""``python -m trainer.train``: data-parallel image classification that resumes exactly.

Read top to bottom: :func:`main` parses flags into a :class:`~trainer.config.TrainConfig`,
:func:`run_training` picks the device, joins the process group (and always leaves it) and hands
over to :class:`~trainer.loop.Trainer`, which owns the loop (set-up → steps → validation →
checkpoints → export).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
import typing
from pathlib import Path
from typing import Any

from kfp_ddp.atomic_files import write_json_atomic
from trainer.config import (
    CHOICES,
    REQUIRED,
    TrainConfig,
    config_from,
    field_defaults,
    field_docs,
    flag,
    load_config_file,
)
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
from trainer.loop import Trainer


# ------------------------------------------------------------------------------------------ CLI
def build_arg_parser() -> argparse.ArgumentParser:
    """Flags for every :class:`TrainConfig` field (unset flags stay out of the namespace)."""
    parser = argparse.ArgumentParser(
        prog="python -m trainer.train",
        description="Data-parallel image classification with exact resume from step checkpoints.",
        argument_default=argparse.SUPPRESS,
    )
    parser.add_argument(
        "--config",
        type=Path,
        help="YAML or JSON file of settings; flags override its values (default: none)",
    )
    docs = field_docs()
    defaults = field_defaults()
    for name, annotation in typing.get_type_hints(TrainConfig).items():
        kind = next((a for a in typing.get_args(annotation) if a is not type(None)), annotation)
        options: dict[str, Any] = {"help": _help(docs.get(name, ""), defaults[name])}
        if kind is bool:
            options["action"] = argparse.BooleanOptionalAction
        else:
            options["type"] = kind
            options["metavar"] = name.upper()
            if name in CHOICES:
                options["choices"] = CHOICES[name]
                options.pop("metavar")
        parser.add_argument(flag(name), dest=name, **options)
    return parser


class _Refusing(argparse.ArgumentParser):
    """The trainer's parser, raising ConfigError instead of printing usage and exiting."""

    def error(self, message: str) -> typing.NoReturn:
        raise ConfigError(f"trainer flags: {message}")


def check_flags(argv: list[str]) -> TrainConfig:
    """Validate the trainer's flags without touching the filesystem; raise ConfigError.

    What a launcher checks before it submits a job: every value, choice and combination, but not
    the folders (``--data-dir`` and the outputs exist only where the job runs).
    """
    parser = build_arg_parser()
    parser.__class__ = _Refusing
    values = vars(parser.parse_args(argv))
    if "config" in values:
        raise ConfigError("trainer flags: --config needs the file where the job runs; pass flags")
    values.pop("data_dir", None)
    values |= {"synthetic": True, "output_dir": Path(".")}
    return config_from({}, values)


def _help(doc: str, default: Any) -> str:
    """The field's doc with its default, unless the doc already says what it is."""
    text = doc.replace("%", "%%")  # argparse formats help strings with %
    if "(default:" in doc or "default: " in doc:
        return text
    if default is REQUIRED:
        return f"{text} (required)"
    if isinstance(default, bool):
        default = "on" if default else "off"
    return f"{text} (default: {'none' if default is None else default})"


def main(argv: list[str] | None = None) -> int:
    """Parse flags (and ``--config``), then train; returns the process exit code."""
    args = vars(build_arg_parser().parse_args(argv))  # exits 2 on malformed flags
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
    try:
        env = dist_env_from(environ)
        device = select_device(config, env, environ)
        config = settle_for_device(config, device, env)
        configure_backends(config, device, env)
        control_group = init_process_group(env, device, config.init_timeout_s)
        return Trainer(config, env, device, control_group, stop, environ).run()
    except TrainerError as err:
        _error(err)
        if not err.on_another_rank:
            _report_to_torchrun(err, environ)
        return err.exit_code
    except RuntimeError as err:  # torch.distributed.DistError is one
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


def lost_peer(err: BaseException) -> bool:
    """Whether ``err`` says a collective failed because another rank is gone or stuck.

    torch raises ``torch.distributed.DistError`` subclasses for most of these; gloo's transport
    errors still arrive as plain RuntimeErrors naming the connection.
    """
    import torch.distributed as dist

    if isinstance(err, getattr(dist, "DistError", ())):
        return True
    text = str(err).lower()
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
    sys.exit(main())
