"""The attribute docstrings of a dataclass: the string literal after each field, as ``--help``
text for the CLIs built from a dataclass (the trainer's config, the launcher's spec) and as the
input descriptions of a KFP component built from one (the training step's inputs). Read by
``docstring_parser`` (the parser KFP itself uses for components' docstrings)."""

from __future__ import annotations

import functools
import inspect

import docstring_parser


def field_docs(cls: type, *, keep_lines: bool = False) -> dict[str, str]:
    """``{field name: its docstring}`` for the fields of ``cls`` (and of its bases) that have
    one: on one line, or with ``keep_lines`` its lines as written (common indent removed).

    Read once per class (parsing the source takes ~10 ms of CPU, and the trainer's flags are
    built from it at every check of a step's ``trainer_args``); each call gets its own dict."""
    return dict(_field_docs(cls, keep_lines))


@functools.cache
def _field_docs(cls: type, keep_lines: bool) -> dict[str, str]:
    docs = {}
    for klass in reversed(cls.__mro__[:-1]):  # a subclass's doc of a field wins
        if "__dataclass_fields__" not in vars(klass):
            continue
        for param in docstring_parser.parse_from_object(klass).params:
            if param.args[0] != "attribute" or param.arg_name not in vars(klass).get(
                "__annotations__", {}
            ):
                continue
            text = inspect.cleandoc(param.description or "")
            docs[param.arg_name] = text if keep_lines else " ".join(text.split())
    return docs
