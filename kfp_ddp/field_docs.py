"""The attribute docstrings of a dataclass: the string literal after each field, as ``--help``
text for the CLIs built from a dataclass (the trainer's config, the launcher's spec)."""

from __future__ import annotations

import ast
import inspect


def field_docs(cls: type) -> dict[str, str]:
    """``{field name: its docstring on one line}`` for the fields of ``cls`` that have one."""
    body = ast.parse(inspect.getsource(cls)).body[0].body  # type: ignore[attr-defined]
    docs = {}
    for node, following in zip(body, body[1:], strict=False):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[node.target.id] = " ".join(following.value.value.split())
    return docs
