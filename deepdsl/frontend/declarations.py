"""Declarations: the names a network's files declare, found before any item is elaborated.

Every top-level name of the network's file is declared once (a second definition, or a built-in's name, is an
error), and its defs and tensor functions, with those of the files it includes, are hoisted so that they are
visible everywhere. Includes are followed here (cycles, nesting deeper than MAX_INCLUDE_DEPTH, files that cannot
be read or hold other items are errors); `include_path` is how the driver finds the same files to parse them.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from deepdsl.errors import DslError, DslNameError, DslProgramError, Note, Span
from deepdsl.frontend import ast
from deepdsl.frontend.builtins import BUILTINS, QUERIES, SPECS
from deepdsl.frontend.values import DefFn, TensorFn

if TYPE_CHECKING:
    from deepdsl.frontend.elaborate import Elaborator

MAX_INCLUDE_DEPTH = 64  # files in one chain of includes below the network's own


def hoist(el: Elaborator, m: ast.Module, stack: list[str]) -> None:
    """Defs and tensor functions (of this file and its includes) are visible everywhere."""
    for item in m.items:
        if isinstance(item, ast.Include):
            _include(el, item, m, stack)
        elif isinstance(item, (ast.Def, ast.TensorDef)):
            _check_parameters(el, item)
            if _declare(el, item.name, item.span):
                el.globals.values[item.name] = DefFn(item) if isinstance(item, ast.Def) else TensorFn(item)
        elif m is el.module:
            for name in bound_names(item):
                _declare(el, name, item.span, define=False)


def _check_parameters(el: Elaborator, item: ast.Def | ast.TensorDef) -> None:
    seen: dict[str, Span] = {}
    params = [(p.name, p.span) for p in item.params] if isinstance(item, ast.Def) else []
    if isinstance(item, ast.TensorDef):
        params = [(t.name, t.span) for t in item.inputs] + [(d.name, d.span) for d in item.params]
    for name, span in params:
        if name in seen:
            el.diags.add(
                DslNameError(
                    f"'{name}' names two parameters of '{item.name}'", span, notes=[Note("the first", seen[name])]
                )  # fmt: skip
            )
        seen[name] = span


def _include(el: Elaborator, item: ast.Include, m: ast.Module, stack: list[str]) -> None:
    key = include_path(m.file, item.path)
    if key in stack or key == el.module.file:
        el.diags.add(DslProgramError(f"include cycle: {' -> '.join([*stack, key])}", item.span))
        return
    if len(stack) >= MAX_INCLUDE_DEPTH:
        chain = " -> ".join(os.path.basename(f) for f in [el.module.file, *stack[:3]])
        el.diags.add(DslProgramError(
            f"includes nest more than {MAX_INCLUDE_DEPTH} files deep ({chain} -> ... -> "
            f"{os.path.basename(m.file)} -> {item.path})", item.span,
        ))  # fmt: skip
        return
    sub = el.modules.get(key)
    if isinstance(sub, DslError):
        el.diags.add(sub)
        return
    if sub is None:
        el.diags.add(DslProgramError(f"cannot read included file '{item.path}'", item.span))
        return
    for inner in sub.items:
        if not isinstance(inner, (ast.Def, ast.TensorDef, ast.Include)):
            el.diags.add(DslProgramError("an included file may hold only def, tensor and include items", inner.span))
    hoist(el, sub, [*stack, key])


def _declare(el: Elaborator, name: str, span: Span, define: bool = True) -> bool:
    if name in el.declared and el.declared[name] != span:
        first = el.declared[name]
        el.diags.add(DslNameError(f"'{name}' is defined twice", span, notes=[Note("first defined here", first)]))
        return False
    if name in BUILTINS or name in SPECS or name in QUERIES:
        el.diags.add(DslNameError(f"'{name}' is a built-in and cannot be redefined", span))
        return False
    el.declared[name] = span
    return True


def bound_names(item: ast.Item) -> tuple[str, ...]:
    if isinstance(item, (ast.Const, ast.Input, ast.TokenInput, ast.Label, ast.Layer, ast.Bind)):
        return (item.name,)
    return ()


def include_path(base: str, rel: str) -> str:
    """The absolute path of an include, symlinks followed (a symlink loop is left for reading to report)."""
    from pathlib import Path

    return os.path.realpath(Path(base).parent / rel)
