"""Errors that name the pipeline parameter the user set: the rule that refuses a value raises
``ParameterError`` with the parameter's name, so nothing maps messages back to parameters.

``ParameterError(field, value, fix)`` reads ``field=value: fix``; ``ArgumentError`` gathers
every one of a check (the CLI prints one line each, the check step fails with all of them).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class ParameterError(ValueError):
    """One pipeline parameter's value is refused.

    Attributes:
        field: the parameter the user set (``-p field=...``, the UI's field), e.g. ``data_uri``.
        value: the value given.
        fix: what is wrong and what to write instead.
    """

    def __init__(self, field: str, value: Any, fix: str):
        super().__init__(field, value, fix)
        self.field = field
        self.value = value
        self.fix = fix

    def __str__(self) -> str:
        return f"{self.field}={self.value!r}: {self.fix}"


class ArgumentError(ValueError):
    """Every refused parameter of one check, in order; ``problems`` has one line each."""

    def __init__(self, errors: Iterable[ParameterError]):
        self.errors = list(errors)
        super().__init__("\n".join(self.problems))

    @property
    def problems(self) -> list[str]:
        return [str(error) for error in self.errors]

    @property
    def fields(self) -> list[str]:
        """The parameters named, each once, in order."""
        return list(dict.fromkeys(error.field for error in self.errors))
