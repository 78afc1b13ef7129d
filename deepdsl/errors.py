"""Source spans, the diagnostics users see, and the one function that renders them.

Every failure a user can cause is a `DslError` (or a subclass) carrying a `Span`; the CLI renders it
as `file:line:col: error: message`, the source line, a caret under the span and an optional hint.
A `DslWarning` is a `Diagnostic` too, rendered the same way, but it is not an exception: nothing
that catches `DslError` can take a warning for an error.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True, order=True)
class Span:
    """A region of a source file; lines and columns count from 1, `end_col` is exclusive."""

    file: str
    line: int
    col: int
    end_line: int
    end_col: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"

    @staticmethod
    def point(file: str, line: int, col: int, width: int = 1) -> Span:
        return Span(file, line, col, line, col + width)


@dataclass(frozen=True)
class Note:
    message: str
    span: Span | None = None


class Diagnostic:
    """A message about the user's input, with where it is (`span`), an optional hint and notes."""

    kind = "diagnostic"

    def __init__(self, message: str, span: Span | None = None, hint: str | None = None, notes: Iterable[Note] = ()):
        self.message = message
        self.span = span
        self.hint = hint
        self.notes = tuple(notes)

    def __str__(self) -> str:
        where = f"{self.span}: " if self.span else ""
        return f"{where}{self.message}"


class DslError(Diagnostic, Exception):
    """A problem in the user's input (exit code 1)."""

    kind = "error"

    def __init__(self, message: str, span: Span | None = None, hint: str | None = None, notes: Iterable[Note] = ()):
        Exception.__init__(self, message)
        Diagnostic.__init__(self, message, span, hint, notes)


class DslSyntaxError(DslError):
    """The text does not follow the grammar."""


class DslNameError(DslError):
    """A name that is not defined, defined twice, or reserved."""


class DslArgumentError(DslError):
    """A call with a wrong, missing or unknown argument."""


class DslTypeError(DslError):
    """A value of the wrong kind where another was expected (a tensor where an int must be, ...)."""


class DslShapeError(DslError):
    """Shapes that do not fit together."""


class DslRecursionError(DslError):
    """A def that calls itself, directly or through others."""


class DslProgramError(DslError):
    """Whole-program problems: a missing or non-scalar loss, an invalid train block, a budget missed."""


class DslWarning(Diagnostic):
    """Reported, but does not stop compilation; never raised."""

    kind = "warning"


class DiagnosticsError(DslError):
    """Several errors found in one run, reported together in source order."""

    def __init__(self, errors: Iterable[DslError]):
        self.errors = tuple(sorted(errors, key=_order))
        first = self.errors[0]
        super().__init__(first.message, first.span, first.hint, first.notes)


@dataclass
class Diagnostics:
    """Collects errors and warnings while a stage keeps going after the first problem."""

    errors: list[DslError] = field(default_factory=list)
    warnings: list[DslWarning] = field(default_factory=list)

    def add(self, diagnostic: Diagnostic) -> None:
        if isinstance(diagnostic, DslWarning):
            self.warnings.append(diagnostic)
        elif isinstance(diagnostic, DslError):
            self.errors.append(diagnostic)
        else:
            raise TypeError(f"not a DslError or a DslWarning: {diagnostic!r}")

    def raise_if_errors(self) -> None:
        if len(self.errors) == 1:
            raise self.errors[0]
        if self.errors:
            raise DiagnosticsError(self.errors)


def _order(err: Diagnostic) -> tuple[str, int, int]:
    s = err.span
    return (s.file, s.line, s.col) if s else ("", 0, 0)


def flatten(err: Diagnostic) -> tuple[Diagnostic, ...]:
    return err.errors if isinstance(err, DiagnosticsError) else (err,)


def nearest(name: str, known: Iterable[str]) -> str | None:
    """The known name closest to `name`, for "did you mean" hints."""
    candidates = sorted(set(known))
    same_but_case = [k for k in candidates if k.lower() == name.lower() and k != name]
    if same_but_case:
        return same_but_case[0]
    matches = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    return matches[0] if matches else None


def did_you_mean(name: str, known: Iterable[str]) -> str | None:
    best = nearest(name, known)
    return f"did you mean '{best}'?" if best else None


def render(err: Diagnostic, sources: dict[str, str]) -> str:
    """Format one diagnostic (or each of several) the way a compiler does, with the line and a caret."""
    return "\n".join(_render_one(e, sources) for e in flatten(err))


def _render_one(err: Diagnostic, sources: dict[str, str]) -> str:
    out = []
    if err.span is None:
        out.append(f"{err.kind}: {err.message}")
    else:
        out.append(f"{err.span}: {err.kind}: {err.message}")
        out.extend(_excerpt(err.span, sources))
    for note in err.notes:
        out.append(f"{note.span}: note: {note.message}" if note.span else f"note: {note.message}")
        if note.span:
            out.extend(_excerpt(note.span, sources))
    if err.hint:
        out.append(f"  hint: {err.hint}")
    return "\n".join(out)


def _excerpt(span: Span, sources: dict[str, str]) -> list[str]:
    text = sources.get(span.file)
    if text is None:
        try:
            with open(span.file, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError):
            return []
    lines = text.splitlines()
    if not 1 <= span.line <= len(lines):
        return []
    line = lines[span.line - 1].expandtabs(1)
    width = (span.end_col - span.col) if span.end_line == span.line else len(line) - span.col + 1
    width = max(1, min(width, len(line) - span.col + 1 if span.col <= len(line) else 1))
    gutter = f"{span.line:>5} | "
    return [gutter + line, " " * (len(gutter) - 2) + "| " + " " * (span.col - 1) + "^" + "~" * (width - 1)]
