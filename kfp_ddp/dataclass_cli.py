"""Click options derived from a dataclass's fields: the dataclass is the one list of parameters.

The one CLI-from-dataclass of the package: the trainer's flags (``TrainConfig``,
``trainer/flags.py``) and the launcher's (``TrainSpec`` and the API options,
``components/launcher/__main__.py``) are both built here.

Each field becomes ``--field-name`` (or the ``flag`` in its metadata; an ``old_flag`` there still
works, with a warning) with its attribute docstring as help and its default shown: ``bool`` →
``--x/--no-x``; ``int``/``float``/``str``/``Path`` (optional or not) → a typed option, with the
allowed values when the field has ``choices``; ``list[...]`` → a repeatable option;
``dict[str, str]`` → a repeatable ``KEY=VALUE`` option, added to the field's default;
``list[str] | None`` named ``command`` or ``mpi_worker_command`` → a JSON list. A field with no
default says "(required)" in its help; a doc that states its own default keeps it.

``values_to_fields`` turns click's parameters back into keyword arguments for the dataclass;
``given_values`` keeps only those set on the command line (a config file fills the rest).
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from kfp_ddp.field_docs import field_docs

JSON_LIST_FIELDS = ("command", "mpi_worker_command")
OLD = "__old_flag"
"""Suffix of the parameter name of a renamed field's old flag."""


def flag_of(f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def _kind(annotation: Any) -> tuple[Any, bool]:
    """(the non-None type, whether None is allowed)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0], True
    return annotation, False


def _required(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def _help(f: dataclasses.Field, doc: str) -> str:
    return f"{doc} (required)" if _required(f) else doc


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def option_for(f: dataclasses.Field, hint: Any, doc: str, choices: tuple[str, ...] | None):
    """The click option of one field."""
    kind, _ = _kind(hint)
    origin = typing.get_origin(kind) or kind
    default = _default(f)
    name = flag_of(f)
    shows_own = "default:" in doc or "(default" in doc  # the doc says it (e.g. "(default: none)")
    doc = _help(f, doc)
    if kind is bool:
        negative = "--no-" + name[2:]
        return click.option(
            f"{name}/{negative}", f.name, default=default, show_default=not shows_own, help=doc
        )
    if f.name in JSON_LIST_FIELDS:
        return click.option(name, f.name, default=None, metavar="JSON", help=doc)
    if origin is dict:
        return click.option(name, f.name, multiple=True, metavar="KEY=VALUE", help=doc)
    if origin is list:
        return click.option(name, f.name, multiple=True, help=doc)
    option_type = _click_type(kind, choices)
    show: bool | str = not shows_own
    if show and default in (None, ""):
        show = "none" if default is None else "''"
    return click.option(
        name, f.name, type=option_type, default=default, show_default=show, help=doc
    )


def _click_type(kind: Any, choices: tuple[str, ...] | None) -> Any:
    """The click type of a scalar field's values."""
    if choices:
        return click.Choice(choices)
    return {int: int, float: float, Path: click.Path(path_type=Path)}.get(kind, str)


def dataclass_options(
    cls: type, *, exclude: Iterable[str] = (), choices: dict[str, tuple[str, ...]] | None = None
) -> Callable[[Callable], Callable]:
    """A decorator adding one click option per field of ``cls`` (but ``exclude``)."""
    docs = field_docs(cls)
    hints = typing.get_type_hints(cls)
    skip = set(exclude)
    options = []
    for f in dataclasses.fields(cls):
        if f.name in skip or not f.init:
            continue
        options.append(
            option_for(f, hints[f.name], docs.get(f.name, ""), (choices or {}).get(f.name))
        )
        if "old_flag" in f.metadata:  # renamed: the old flag works, with a warning, for a release
            kind, _ = _kind(hints[f.name])
            old_type = _click_type(kind, (choices or {}).get(f.name))
            options.append(
                click.option(f.metadata["old_flag"], f.name + OLD, hidden=True, type=old_type)
            )

    def decorate(func: Callable) -> Callable:
        for option in reversed(options):
            func = option(func)
        return func

    return decorate


def given_values(ctx: click.Context) -> dict[str, Any]:
    """The parameters of ``ctx`` that the command line set (not their defaults)."""
    return {
        name: value
        for name, value in ctx.params.items()
        if ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE
    }


def pairs(flag: str, values: Iterable[str]) -> dict[str, str]:
    out = {}
    for value in values:
        key, sep, rest = value.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{value!r} is not KEY=VALUE", param_hint=flag)
        out[key] = rest
    return out


def values_to_fields(cls: type, params: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments for ``cls`` from click's values of its options (pops them)."""
    hints = typing.get_type_hints(cls)
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name not in params:
            continue
        value = params.pop(f.name)
        old_value = params.pop(f.name + OLD, None)
        if old_value is not None:
            value = _from_old_flag(f, value, old_value)
        kind, _ = _kind(hints[f.name])
        origin = typing.get_origin(kind) or kind
        if f.name in JSON_LIST_FIELDS:
            if value is None:
                continue
            try:
                value = json.loads(value)
            except ValueError as exc:
                raise click.BadParameter(f"not JSON: {exc}", param_hint=flag_of(f)) from exc
        elif origin is dict:
            value = dict(_default(f) or {}) | pairs(flag_of(f), value)
        elif origin is list:
            value = list(value)
        out[f.name] = value
    return out


def _from_old_flag(f: dataclasses.Field, value: Any, old_value: str) -> Any:
    """The value of a renamed flag given by its old name (warned); both names at once: refused."""
    old, new = f.metadata["old_flag"], flag_of(f)
    if value not in (None, "", _default(f)):
        raise click.BadParameter(f"give {new} alone ({old} is its old name)", param_hint=old)
    click.secho(
        f"WARNING: {old} is now {new} (kfp-ddp 0.2.0, see CHANGELOG.md); the old name stops "
        "working in 0.3.0",
        err=True,
        fg="yellow",
    )
    return old_value
