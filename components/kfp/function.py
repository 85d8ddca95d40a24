"""A KFP function written from a declaration: its signature and its docstring's ``Args`` come
from a list of inputs, so a component or pipeline whose parameters are declared elsewhere (a
dataclass, a table) is not a second, hand-written copy of them.

KFP reads a function's parameters from its signature and their descriptions from its docstring,
and a lightweight component embeds the function's source: ``kfp_function`` writes that source,
compiles it and registers it with ``linecache``, so ``inspect.getsource`` (what KFP embeds)
reads exactly the text that was compiled.
"""

from __future__ import annotations

import itertools
import json
import linecache
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

REQUIRED = object()
"""The default of an input that has none (KFP: a required parameter)."""

_counter = itertools.count()


@dataclass(frozen=True, kw_only=True)
class FunctionInput:
    """One parameter of a generated KFP function."""

    name: str
    annotation: str
    """The type as source text, e.g. ``str``, ``list``, ``Output[Model]``."""
    default: Any = REQUIRED
    doc: str = ""
    """Its description (KFP shows it in the UI); line breaks are kept as written."""


def literal(value: Any) -> str:
    """``value`` as Python source (strings in double quotes, as ruff formats them)."""
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value)


def docstring(summary: str, inputs: Sequence[FunctionInput], *, returns: str = "") -> str:
    """A Google-style docstring: ``summary``, then ``Args:`` with every documented input."""
    parts = [summary.strip()]
    documented = [i for i in inputs if i.doc]
    if documented:
        lines = ["Args:"]
        for item in documented:
            first, *rest = item.doc.strip().splitlines()
            lines.append(f"    {item.name}: {first}")
            lines += [f"        {line.strip()}" for line in rest]
        parts.append("\n".join(lines))
    if returns:
        parts.append(returns.strip())
    return "\n\n".join(parts)


def signature_source(inputs: Sequence[FunctionInput]) -> str:
    """The parameter lines of a ``def`` (one per input, four spaces in)."""
    lines = []
    for item in inputs:
        default = "" if item.default is REQUIRED else f" = {literal(item.default)}"
        lines.append(f"    {item.name}: {item.annotation}{default},\n")
    return "".join(lines)


def kfp_function(
    name: str,
    inputs: Sequence[FunctionInput],
    *,
    doc: str,
    body: str,
    returns: str = "",
    namespace: Mapping[str, Any],
    module: str,
) -> Callable[..., Any]:
    """The function ``def name(inputs) -> returns`` with docstring ``doc`` and ``body``.

    Args:
        name: the function's name (KFP names the component after it).
        inputs: its parameters, in order.
        doc: its docstring (see ``docstring``).
        body: its statements, unindented; self-contained if it runs as a component.
        returns: the return annotation as source text ('' for none).
        namespace: the names the annotations need (``Output``, ``Model``...).
        module: the ``__module__`` the function reports (its declaring module).
    """
    arrow = f" -> {returns}" if returns else ""
    quoted = textwrap.indent(f'"""{doc}\n"""', "    ").replace("\n    \n", "\n\n")
    source = (
        f"def {name}(\n{signature_source(inputs)}){arrow}:\n"
        f"{quoted}\n{textwrap.indent(body.strip(), '    ')}\n"
    )
    filename = f"<kfp_function {module}.{name} {next(_counter)}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    scope = dict(namespace)
    code = compile(source, filename, "exec", dont_inherit=True)  # real annotations, for KFP
    exec(code, scope)  # noqa: S102 (our own generated source)
    function = scope[name]
    function.__module__ = module
    return function
