"""Text from a `.ddsl` file as it may appear in generated Java and CUDA C: the one escaping function per language
and place. Every string the emitters write into a string literal goes through `java_string`, every piece of a
comment through `java_comment` or `c_comment`; the output is plain ASCII, so no source encoding matters.

Why each rule is needed:
- javac turns every `\\uXXXX` into its character *before* lexing (JLS 3.3), also inside literals and comments:
  `\\u0022` ends a string, `\\u000a` ends a `//` comment. A backslash is only eligible to start such an escape
  when an even number of backslashes precede it, so doubling every backslash of the text disarms them all, and
  the escapes written here (`\\n`, octal `\\001`, `\\u00e9` for a non-ASCII character) decode to exactly the text.
- A comment can end at a line terminator (CR, LF) or at `*/`; in C also at a backslash before the line's end
  (line splicing, which `??/` spells too), so C comments write a backslash as `\\x{5c}` and break up `??`.
"""

from __future__ import annotations

__all__ = ["c_comment", "java_comment", "java_string"]

_JAVA_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}
_COMMENT_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def java_string(text: str) -> str:
    """`text` as a Java string literal (quotes included) that javac reads back as exactly `text`."""
    out = []
    for k, c in enumerate(text):
        code = ord(c)
        if c == "\\" and k and 0xD800 <= ord(text[k - 1]) < 0xDC00:
            # javac 17 reads a backslash escape right after a lone high surrogate's \\uXXXX as a new unicode
            # escape (it looks ahead for the low surrogate and loses count of the backslashes): octal is read safely
            out.append("\\134")
        elif c in _JAVA_ESCAPES:
            out.append(_JAVA_ESCAPES[c])
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\{code:03o}")  # three octal digits: a digit after it cannot extend it
        elif code < 0x7F:
            out.append(c)
        else:  # UTF-16 code units (a lone surrogate from an undecodable file name stays one)
            units = c.encode("utf-16-be", "surrogatepass")
            out.extend(f"\\u{int.from_bytes(units[i : i + 2], 'big'):04x}" for i in range(0, len(units), 2))
    return '"' + "".join(out) + '"'


def _comment(text: str, backslash: str) -> str:
    out = []
    for c in text:
        code = ord(c)
        if c == "\\":
            out.append(backslash)
        elif c in _COMMENT_ESCAPES:
            out.append(_COMMENT_ESCAPES[c])
        elif 0x20 <= code < 0x7F:
            out.append(c)
        else:
            out.append(f"\\x{{{code:x}}}")
    return "".join(out).replace("*/", "*\\/")


def java_comment(text: str) -> str:
    """`text` as the inside of a Java `//` or `/* */` comment: one line, ASCII, no unicode escape, no `*/`."""
    return _comment(text, "\\\\")


def c_comment(text: str) -> str:
    """`text` as the inside of a C/CUDA `//` or `/* */` comment: one line, ASCII, no backslash that could splice
    the next line into the comment, no trigraph, no `*/`."""
    return _comment(text, "\\x{5c}").replace("??", "?\\x{3f}")
