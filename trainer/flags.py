"""The trainer's flags: one per ``TrainConfig`` field, written from the dataclass (its types,
choices, defaults and attribute docstrings) by the package's one CLI-from-dataclass
(``kfp_ddp.dataclass_cli``, on click, as the launcher's), and their check without running
anything."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from kfp_ddp.dataclass_cli import dataclass_options, given_values, values_to_fields
from trainer.config import CHOICES, TrainConfig, config_from
from trainer.errors import ConfigError

PROG = "python -m trainer.train"


def trainer_command() -> click.Command:
    """The trainer's command: ``--config`` and a flag per :class:`TrainConfig` field; it returns
    the values the command line set (a ``--config`` file fills the others)."""

    @click.command(
        name=PROG,
        context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    )
    @click.option(
        "--config",
        type=click.Path(path_type=Path),
        help="YAML or JSON file of settings; flags override its values (default: none)",
    )
    @dataclass_options(TrainConfig, choices=CHOICES)
    @click.pass_context
    def command(ctx: click.Context, **_params: Any) -> dict[str, Any]:
        """Data-parallel image classification with exact resume from step checkpoints."""
        given = given_values(ctx)
        return values_to_fields(TrainConfig, given) | (
            {"config": given["config"]} if "config" in given else {}
        )

    return command


def _flag_values(argv: list[str]) -> dict[str, Any]:
    """What the trainer's command returns for ``argv``; click's exceptions as they come."""
    command = trainer_command()
    with command.make_context(PROG, list(argv)) as ctx:
        return command.invoke(ctx)


def parse_flags(argv: list[str] | None) -> dict[str, Any]:
    """The settings ``argv`` gives (``config``: the file's path), as keyword arguments of
    :class:`TrainConfig` (``argv``: the process's arguments when None). Malformed flags print the
    usage and why, and exit 2; ``--help`` prints the help and exits 0."""
    try:
        return _flag_values(sys.argv[1:] if argv is None else argv)
    except click.exceptions.Exit as done:  # --help
        raise SystemExit(done.exit_code) from None
    except click.ClickException as error:
        error.show()
        raise SystemExit(error.exit_code) from None


def check_flags(argv: list[str]) -> TrainConfig:
    """Validate the trainer's flags without touching the filesystem; raise ConfigError.

    What a launcher checks before it submits a job: every value, choice and combination, but not
    the folders (``--data-dir`` and the outputs exist only where the job runs).
    """
    try:
        values = _flag_values(argv)
    except click.exceptions.Exit:
        raise ConfigError("trainer flags: --help prints help and trains nothing") from None
    except click.ClickException as error:
        raise ConfigError(f"trainer flags: {error.format_message()}") from None
    if "config" in values:
        raise ConfigError("trainer flags: --config needs the file where the job runs; pass flags")
    values.pop("data_dir", None)
    values |= {"synthetic": True, "output_dir": Path(".")}
    return config_from({}, values)
