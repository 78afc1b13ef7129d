"""Loads grammar/ddsl.lark once (LALR, positions kept) and turns parse failures into diagnostics."""

from __future__ import annotations

import functools
import hashlib
import io
import os
import sys
from pathlib import Path

import lark
from lark import Lark, Token, Tree, UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken
from lark.exceptions import VisitError

from deepdsl import config, files
from deepdsl.errors import DslError, DslSyntaxError, Span
from deepdsl.frontend import ast
from deepdsl.frontend.syntax_hints import EXAMPLES
from deepdsl.frontend.transformer import RESERVED, ToAst

_FRIENDLY = {
    "NAME": "a name",
    "INT": "an integer",
    "FLOAT": "a number",
    "STRING": "a string",
    "CMP_OP": "a comparison",
    "ADD_OP": "'+' or '-'",
    "MUL_OP": "'*', '/' or '%'",
    "REDUCE": "'sum' or 'max'",
    "$END": "end of file",
}


# a reserved word that starts an item is more likely the next item than a misused name
ITEM_KEYWORDS = frozenset("network const input label layer def tensor loss predict train include".split())


def grammar_path() -> Path:
    """The grammar inside an installed wheel (deepdsl/grammar/), else the source tree's grammar/."""
    here = Path(__file__).resolve().parent.parent
    for candidate in (here / "grammar" / "ddsl.lark", here.parent / "grammar" / "ddsl.lark"):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError("grammar/ddsl.lark is missing from the deepdsl installation")


_LARK_OPTIONS = {"parser": "lalr", "propagate_positions": True, "maybe_placeholders": True}


def _tables_file(grammar: str) -> Path | None:
    """Where the parser tables of this grammar, Lark and Python are kept between runs (None: not kept). The key
    names all three, so a changed grammar or an upgrade never reads another's tables."""
    folder = config.from_env().cache_dir
    if folder is None:
        return None
    key = "\0".join((grammar, repr(sorted(_LARK_OPTIONS.items())), lark.__version__, sys.version))
    return Path(folder) / f"grammar-{hashlib.sha256(key.encode()).hexdigest()[:20]}.lark"


def load_or_build(grammar: str, tables: Path | None) -> Lark:
    """The LALR parser of `grammar`, its tables loaded from `tables` when they are there, else built and saved
    there. The tables are a pickle, and loading one another user could have written would run their code: they
    are read only from a folder and a file that are ours alone (owned by this user, writable by no one else, no
    link, no FIFO or device), checked on the opened descriptors (files.private_folder, files.read_private), and
    written into that same open folder, mode 0600. A missing, damaged, unwritable or shared cache only means
    building them again."""
    folder = None
    if tables is not None:
        os.makedirs(tables.parent, mode=0o700, exist_ok=True)
        folder = files.private_folder(tables.parent)
    try:
        if folder is not None and tables is not None:
            data = files.read_private(folder, tables.name)
            if data is not None:
                try:
                    return Lark.load(io.BytesIO(data))
                except Exception:  # noqa: BLE001 - damaged (another Lark's, a cut-off copy): build anew
                    pass
        parser = Lark(grammar, **_LARK_OPTIONS)
        if folder is not None and tables is not None:
            try:
                with files.atomic_output_at(folder, tables.name, str(tables), replace_readonly=True, mode=0o600) as f:
                    parser.save(f)
            except OSError:
                pass  # a full disk, a read-only home, something else at the path: every run builds the tables
        return parser
    finally:
        if folder is not None:
            os.close(folder)


@functools.cache
def _lark() -> Lark:
    """The parser. Building its tables takes about half a second, more than parsing ResNet-50, so they are kept in
    the user's cache folder (DEEPDSL_CACHE) for every later run."""
    grammar = grammar_path().read_text()
    try:
        return load_or_build(grammar, _tables_file(grammar))
    except OSError:  # the cache folder cannot be made
        return load_or_build(grammar, None)


def parse_text(text: str, file: str = "<input>") -> ast.Module:
    """Parse one .ddsl text into an `ast.Module`; raises DslSyntaxError (or DslNameError) on bad input. A byte
    order mark at the start (editors on Windows write one) is no part of the text."""
    text = text.removeprefix("\ufeff")
    parser = _lark()
    try:
        tree = parser.parse(text)
    except UnexpectedInput as exc:
        raise _syntax_error(exc, text, file) from None
    _check_nesting(tree, file)
    try:
        return ToAst(file).transform(tree)
    except VisitError as exc:
        if isinstance(exc.orig_exc, DslError):
            raise exc.orig_exc from None
        raise


MAX_NESTING = 500  # levels of one expression: what every later stage (they recurse over the tree) handles


def _check_nesting(tree: Tree, file: str) -> None:
    """A syntax error where an expression nests deeper than MAX_NESTING (a chain of 600 `+` or `o` terms), found
    without recursion, so that no later stage runs out of Python stack on it."""
    todo: list[tuple[Tree, int, Tree]] = [(tree, 0, tree)]  # a node, its depth, and the item it is in
    while todo:
        t, depth, item = todo.pop()
        if depth > MAX_NESTING:
            meta = item.meta
            raise DslSyntaxError(
                f"this expression nests more than {MAX_NESTING} levels deep",
                Span.point(file, 1, 1) if meta.empty else Span.point(file, meta.line, meta.column),
                hint="split it into named parts (`a = f1 o f2 o ...`, then `net = a o b`) or use a def with a loop",
            )
        todo.extend((c, depth + 1, c if depth == 0 else item) for c in t.children if isinstance(c, Tree))


def parse_file(path: str | Path) -> ast.Module:
    p = Path(path)
    return parse_text(p.read_text(), str(path))


def _describe(term: str) -> str:
    if term in _FRIENDLY:
        return _FRIENDLY[term]
    try:
        pattern = _lark().get_terminal(term).pattern
    except KeyError:
        return term
    return f"'{pattern.value}'" if pattern.type == "str" else term


def _expected(names: set[str]) -> str:
    shown = sorted({_describe(n) for n in names})
    if len(shown) > 8:
        shown = shown[:8] + ["..."]
    return ", ".join(shown)


def _syntax_error(exc: UnexpectedInput, text: str, file: str) -> DslSyntaxError:
    line, col = exc.line, exc.column
    if isinstance(exc, UnexpectedEOF) or (isinstance(exc, UnexpectedToken) and exc.token.type == "$END"):
        lines = text.splitlines() or [""]
        line, col = len(lines), len(lines[-1]) + 1
        found = "end of file"
        width = 1
    elif isinstance(exc, UnexpectedToken):
        tok: Token = exc.token
        kind = {"NAME": "name", "INT": "integer", "FLOAT": "number", "STRING": "string"}.get(tok.type)
        found = f"{kind} {tok}" if kind == "string" else f"{kind} '{tok}'" if kind else f"'{tok}'"
        width = max(1, len(str(tok)))
    else:
        assert isinstance(exc, UnexpectedCharacters)
        found = f"character {text[exc.pos_in_stream]!r}" if 0 <= exc.pos_in_stream < len(text) else "a character"
        width = 1
    if line is None or line < 1:
        line, col = 1, 1
    expected = getattr(exc, "expected", None) or getattr(exc, "allowed", None) or set()
    if isinstance(exc, UnexpectedToken):
        expected = exc.accepts or exc.expected
    message = f"unexpected {found}"
    if expected:
        message += f"; expected {_expected(set(expected))}"
    hint = _example_hint(exc)
    word = str(exc.token) if isinstance(exc, UnexpectedToken) else ""
    if hint is None and word in RESERVED - ITEM_KEYWORDS and "NAME" in expected:
        hint = f"'{word}' is a reserved word and cannot name a value"
    return DslSyntaxError(message, Span.point(file, line, col or 1, width), hint=hint)


def _failure_key(exc: UnexpectedInput) -> tuple:
    """Where a parse failed: the exception kind and the parser's top state.

    Lark's own `match_examples` also compares the depth of the parser stack, so an example only
    matches a mistake in the first item of a file; comparing the top state matches it anywhere.
    """
    state = getattr(exc, "state", None)
    top = getattr(state, "position", state)
    return (type(exc).__name__, top)


@functools.cache
def _example_keys() -> dict[tuple, str]:
    keys: dict[tuple, str] = {}
    for label, examples in EXAMPLES.items():
        for text in examples:
            try:
                _lark().parse(text)
            except UnexpectedInput as exc:
                keys.setdefault(_failure_key(exc), label)
    return keys


def _example_hint(exc: UnexpectedInput) -> str | None:
    try:
        return _example_keys().get(_failure_key(exc))
    except TypeError:  # an unhashable parser state: no hint
        return None
