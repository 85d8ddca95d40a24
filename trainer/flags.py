"""The trainer's flags: one per ``TrainConfig`` field, written from the dataclass (its types,
choices, defaults and attribute docstrings), and their check without running anything."""

from __future__ import annotations

import argparse
import typing
from pathlib import Path
from typing import Any

from trainer.config import (
    CHOICES,
    REQUIRED,
    TrainConfig,
    config_from,
    field_defaults,
    field_docs,
    flag,
)
from trainer.errors import ConfigError


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
