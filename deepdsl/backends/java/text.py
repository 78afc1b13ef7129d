"""Java text the emitter writes in many places: integer literals, wrapped argument lists, methods."""

from __future__ import annotations


def long_literal(n: int) -> str:
    """An integer literal; a `long` one where it exceeds `int`."""
    return f"{n}L" if n >= 2**31 else str(n)


def wrapped(head: str, items: list[str], tail: str, width: int = 116) -> list[str]:
    """`head item, item, ...tail` broken into lines of at most `width` characters, continued under the first item."""
    lines, line = [], head
    for k, item in enumerate(items):
        text = item + ("," if k < len(items) - 1 else tail)
        if len(line) + len(text) + 1 > width and line.strip() != head.strip():
            lines.append(line.rstrip())
            line = " " * len(head)
        line += text + " "
    return [*lines, line.rstrip() if items else head + tail]


def method(doc: str, head: str, body: list[str]) -> str:
    """A method's text, under its javadoc `doc` (none where empty)."""
    lines = [*([f"  {doc}"] if doc else []), f"  {head} {{"]
    lines += [f"    {line}" if line else "" for line in body]
    lines.append("  }")
    return "\n".join(lines)
