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


def block_abbreviations(paths: list[str], min_length: int = 5) -> dict[str, str]:
    """The short form of each repeated block in the layer paths `paths`: a scope that occurs with ordinals 1, 2, ...
    (a def called more than once in one scope: `bottleneck1` ... `bottleneck6`) is written with the initials of its
    words (`b1` ... `b6`, `conv_bn2` -> `cb2`), so that ResNet-50's `stage1.bottleneck2.conv_bn1.bn` names its
    temporaries `s1_b2_cb1_bn_...`. A name shorter than `min_length` stays; so do names whose initials two names
    share or that another part of a path already spells (`b1` as a layer's own name)."""
    parts = {q for p in paths for q in p.split(".") if q}
    ordinals: dict[str, set[int]] = {}
    for q in {q for p in paths for q in p.split(".")[:-1]}:  # the scopes: every part but a path's last
        m = re.fullmatch(r"([A-Za-z][A-Za-z_]*[A-Za-z])(\d+)", q)
        if m and len(m.group(1)) >= min_length:
            ordinals.setdefault(m.group(1), set()).add(int(m.group(2)))
    short = {b: "".join(w[0] for w in b.split("_") if w) for b, ks in ordinals.items() if max(ks) >= 2}
    clash = {s for s in short.values() if list(short.values()).count(s) > 1}
    return {b: s for b, s in short.items() if s not in clash and not any(re.fullmatch(rf"{s}\d+", q) for q in parts)}


def abbreviated(path: str, short: dict[str, str]) -> str:
    """`path` with each part `NAME<k>` of a repeated block written `SHORT<k>` (see block_abbreviations)."""
    if not short:
        return path

    def part(q: str) -> str:
        m = re.fullmatch(r"([A-Za-z][A-Za-z_]*[A-Za-z])(\d+)", q)
        return short[m.group(1)] + m.group(2) if m and m.group(1) in short else q

    return ".".join(part(q) for q in path.split("."))
