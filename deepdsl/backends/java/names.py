"""Java identifiers for the names of a network: `cv1.W` -> `cv1_W`, keywords avoided, every name unique."""

from __future__ import annotations

import re

JAVA_KEYWORDS = frozenset(
    """abstract assert boolean break byte case catch char class const continue default do double else enum extends
    false final finally float for goto if implements import instanceof int interface long native new null package
    private protected public return short static strictfp super switch synchronized this throw throws transient true
    try var void volatile while yield record sealed permits""".split()
)


def identifier(name: str) -> str:
    """A Java identifier that reads like `name`: every other character becomes `_`, a digit start gets `t`."""
    ident = re.sub(r"[^A-Za-z0-9_]", "_", name).strip("_") or "t"
    ident = re.sub(r"__+", "_", ident)
    if ident[0].isdigit():
        ident = "t" + ident
    return ident + "_" if ident in JAVA_KEYWORDS else ident


def camel(name: str) -> str:
    """`channel_sum` -> `channelSum`."""
    head, *rest = identifier(name).split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def class_name(network: str) -> str:
    ident = identifier(network)
    return ident[:1].upper() + ident[1:]


class Namer:
    """Hands out distinct identifiers: the same key always gets the same name; a clash gets `_2`, `_3`, ..."""

    def __init__(self, reserved: tuple[str, ...] = ()) -> None:
        self._taken: set[str] = set(reserved)
        self._names: dict[str, str] = {}

    @property
    def taken(self) -> set[str]:
        return self._taken

    @staticmethod
    def preferred(key: str) -> str:
        return identifier(key)

    def __call__(self, key: str, preferred: str | None = None) -> str:
        if key not in self._names:
            base = preferred if preferred is not None else self.preferred(key)
            name, k = base, 2
            while name in self._taken:
                name, k = f"{base}_{k}", k + 1
            self._taken.add(name)
            self._names[key] = name
        return self._names[key]
