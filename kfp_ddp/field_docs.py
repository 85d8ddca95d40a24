"""The attribute docstrings of a dataclass: the string literal after each field, as ``--help``
text for the CLIs built from a dataclass (the trainer's config, the launcher's spec) and as the
input descriptions of a KFP component built from one (the training step's inputs)."""

from __future__ import annotations

import ast
import inspect


def field_docs(cls: type, *, keep_lines: bool = False) -> dict[str, str]:
    """``{field name: its docstring}`` for the fields of ``cls`` (and of its bases) that have
    one: on one line, or with ``keep_lines`` its lines as written (common indent removed)."""
    docs = {}
    for klass in reversed(cls.__mro__[:-1]):  # a subclass's doc of a field wins
        if "__dataclass_fields__" not in vars(klass):
            continue
        body = ast.parse(inspect.getsource(klass)).body[0].body  # type: ignore[attr-defined]
        for node, following in zip(body, body[1:], strict=False):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)
            ):
                text = following.value.value
                docs[node.target.id] = (
                    inspect.cleandoc(text) if keep_lines else " ".join(text.split())
                )
    return docs
