"""Small lexers of Java (JLS 3.3-3.10) and C (translation phases 1-3) that say what a compiler sees in a
generated file: a list of (kind, text) tokens, kind one of COMMENT, STRING, CHAR, NAME, NUMBER, OP, where a
string literal's text is its decoded value. They model the steps an injection abuses: javac's unicode escapes
before lexing, line terminators ending `//` comments, C's trigraphs and line splicing. Anything else they do not
know (a text block, a stray character) is a LexError rather than a guess."""

from __future__ import annotations

import re

__all__ = ["LexError", "c_tokens", "java_text", "java_tokens", "java_unicode_escapes"]


class LexError(ValueError):
    pass


_JAVA_OPS = sorted(
    """>>>= <<= >>= >>> ... -> :: ++ -- && || == != <= >= += -= *= /= &= |= ^= %= << >> ( ) { } [ ] ; , . @ = > < ! ~
    ? : + - * / & | ^ %""".split(),
    key=len,
    reverse=True,
)
_C_OPS = sorted(
    """<<= >>= ... -> ++ -- && || == != <= >= += -= *= /= &= |= ^= %= << >> :: ## ( ) { } [ ] ; , . = > < ! ~ ? : + -
    * / & | ^ % #""".split(),
    key=len,
    reverse=True,
)
_JAVA_NUMBER = (
    r"0[xX][0-9a-fA-F_]*\.?[0-9a-fA-F_]*(?:[pP][+-]?\d+)?[fFdDlL]?"
    r"|(?:\d[\d_]*\.?[\d_]*|\.\d[\d_]*)(?:[eE][+-]?\d+)?[fFdDlL]?"
)
_C_NUMBER = r"\.?\d(?:[\w.]|[eEpP][+-])*"
_JAVA_NAME = r"[^\W\d]\w*|\$[\w$]*"
_C_NAME = r"(?a:[A-Za-z_]\w*)"
_SIMPLE = {"b": "\b", "t": "\t", "n": "\n", "f": "\f", "r": "\r", "s": " ", '"': '"', "'": "'", "\\": "\\"}
_C_SIMPLE = {"a": "\a", "b": "\b", "t": "\t", "n": "\n", "v": "\v", "f": "\f", "r": "\r", '"': '"', "'": "'",
             "\\": "\\", "?": "?"}  # fmt: skip


_UNICODE_ESCAPE = re.compile(r"(\\+)(u+)([0-9a-fA-F]{0,4})")


def java_unicode_escapes(text: str) -> str:
    """JLS 3.3: every eligible `\\uXXXX` (a backslash after an even number of backslashes, one or more u's, four
    hex digits) replaced by its character; an eligible `\\u` without four hex digits is a compile error."""

    def one(m: re.Match) -> str:
        slashes, _, digits = m.groups()
        if len(slashes) % 2 == 0:  # the last backslash is escaped by the one before it
            return m.group()
        if len(digits) < 4:
            raise LexError(f"illegal unicode escape at {m.start()}")
        return slashes[:-1] + chr(int(digits, 16))

    return _UNICODE_ESCAPE.sub(one, text)


def _literal(text: str, i: int, quote: str, c_rules: bool) -> tuple[str, int]:
    """The decoded literal starting at the quote text[i], and the position after it."""
    out: list[str] = []
    i += 1
    simple = _C_SIMPLE if c_rules else _SIMPLE
    while True:
        if i >= len(text) or text[i] in "\r\n":
            raise LexError(f"unterminated literal at {i}")
        c = text[i]
        if c == quote:
            return "".join(out), i + 1
        if c != "\\":
            out.append(c)
            i += 1
            continue
        e = text[i + 1 : i + 2]
        if e in simple:
            out.append(simple[e])
            i += 2
        elif e in "01234567" and e:
            most = 3 if (c_rules or e in "0123") else 2
            j = i + 1
            while j < i + 1 + most and text[j : j + 1] in tuple("01234567"):
                j += 1
            out.append(chr(int(text[i + 1 : j], 8)))
            i = j
        elif c_rules and e == "x":
            m = re.compile(r"[0-9a-fA-F]+").match(text, i + 2)
            if not m:
                raise LexError(f"bad \\x escape at {i}")
            out.append(chr(int(m.group(), 16)))
            i = m.end()
        else:
            raise LexError(f"illegal escape {e!r} in a literal at {i}")


def _scanner(ops: list[str], number: str, name: str) -> re.Pattern:
    return re.compile(
        r"(?P<ws>[ \t\f\r\n\v]+)|(?P<comment>//[^\r\n]*|/\*.*?\*/)|(?P<bad>/\*|\"\"\")"
        r"|(?P<literal>\"(?:[^\"\\\r\n]|\\[^\r\n])*\"|'(?:[^'\\\r\n]|\\[^\r\n])*')|(?P<badliteral>[\"'])"
        f"|(?P<NUMBER>{number})|(?P<NAME>{name})|(?P<OP>{'|'.join(map(re.escape, ops))})",
        re.DOTALL,
    )


_JAVA_SCANNER = _scanner(_JAVA_OPS, _JAVA_NUMBER, _JAVA_NAME)
_C_SCANNER = _scanner(_C_OPS, _C_NUMBER, _C_NAME)


def _tokens(text: str, c_rules: bool) -> list[tuple[str, str]]:
    scanner = _C_SCANNER if c_rules else _JAVA_SCANNER
    out: list[tuple[str, str]] = []
    i = 0
    while i < len(text):
        m = scanner.match(text, i)
        if m is None or m.lastgroup in ("bad", "badliteral"):
            raise LexError(f"cannot lex {text[i : i + 20]!r} at {i}")
        kind, token = m.lastgroup, m.group()
        if kind == "comment":
            out.append(("COMMENT", token[2:] if token.startswith("//") else token[2:-2]))
        elif kind == "literal":
            value, end = _literal(text, i, token[0], c_rules)
            assert end == m.end()
            out.append(("STRING" if token[0] == '"' else "CHAR", value))
        elif kind != "ws":
            out.append((kind, token))
        i = m.end()
    return out


def java_text(text: str) -> str:
    """`text` as a Java String holds it, UTF-16: a surrogate pair written as two characters is one character."""
    return text.encode("utf-16-be", "surrogatepass").decode("utf-16-be", "surrogatepass")


def java_tokens(source: str) -> list[tuple[str, str]]:
    """What javac lexes in `source` (a literal's value as java_text)."""
    tokens = _tokens(java_unicode_escapes(source), c_rules=False)
    return [(k, java_text(v)) if k in ("STRING", "CHAR") else (k, v) for k, v in tokens]


_TRIGRAPHS = {"=": "#", "(": "[", "/": "\\", ")": "]", "'": "^", "<": "{", "!": "|", ">": "}", "-": "~"}


def c_tokens(source: str) -> list[tuple[str, str]]:
    """What a C/C++ compiler lexes in `source`, with trigraphs on (the strictest reading): phase 1 trigraphs,
    phase 2 line splicing (as GCC, also across trailing blanks), phase 3 tokens and comments."""
    text = re.sub(r"\?\?([=(/)'<!>-])", lambda m: _TRIGRAPHS[m.group(1)], source)
    text = re.sub(r"\\[ \t]*\r?\n", "", text)
    return _tokens(text, c_rules=True)
