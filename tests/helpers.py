"""Small helpers for tests: compile a snippet, render its diagnostics."""

from __future__ import annotations

from deepdsl import api
from deepdsl.errors import DslError, render

HEADER = "network T\nconst N = 4\ninput x : [N, 3, 8, 8]\nlabel y : [N] classes 10\n"


def compile_text(text: str, sets: dict | None = None, file: str = "t.ddsl") -> api.Compilation:
    return api.compile_source(text, file, sets)


def error_text(text: str, file: str = "t.ddsl", sets: dict | None = None) -> str:
    """The rendered diagnostics for `text`; fails if it compiles."""
    c = api.Compilation()
    try:
        api.compile_source(text, file, sets, c=c)
    except DslError as err:
        return render(err, c.sources)
    raise AssertionError("expected a compile error")
