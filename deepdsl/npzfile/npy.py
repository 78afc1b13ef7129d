"""One `.npy` array read from an archive entry's bytes (a `Stream`), by the rules the Java runtime's `Npy.read` follows
(the last of the package docstring's): a header of exactly 'descr', 'fortran_order' and 'shape' in the literal
syntax NumPy writes, floats or integers, at most MAX_ELEMENTS elements, exactly the bytes the header describes.
`Bad` is the error of a damaged or refused archive, which the ZIP container raises too.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from deepdsl.npzfile import Stream

MAX_ELEMENTS = 2**31 - 9  # the most elements of one Java array
MAGIC = b"\x93NUMPY"
_CHUNK = 1 << 20


class Bad(ValueError):
    """A damaged or refused archive; the message says what is wrong (naming the entry where there is one)."""


def _read(e: Stream, n: int, where: str, inside: str) -> bytes:
    data = e.read(n)
    if len(data) < n:
        raise Bad(f"{where}: truncated (it ends inside {inside})")
    return data


def read_array(e: Stream, size: int, where: str) -> np.ndarray:
    prefix = e.read(8)
    if len(prefix) < 8 or prefix[:6] != MAGIC:
        raise Bad(f"{where}: not a .npy array (bad magic bytes)")
    major, minor = prefix[6], prefix[7]
    if major not in (1, 2, 3):
        raise Bad(f"{where}: unsupported .npy format version {major}.{minor}")
    width = 2 if major == 1 else 4
    length = int.from_bytes(_read(e, width, where, "its .npy header"), "little")
    if length > 1 << 20:
        raise Bad(f"{where}: implausible .npy header length {length}")
    try:
        text = _read(e, length, where, "its .npy header").decode("utf-8" if major == 3 else "latin-1")
    except UnicodeDecodeError:
        raise Bad(f"{where}: its .npy header is not UTF-8") from None
    dtype, fortran, shape = _header(text, where)
    count = math.prod(shape)
    described = f"{count} elements of {dtype.str} {list(shape)}"
    if count > MAX_ELEMENTS:
        raise Bad(f"{where}: shape {list(shape)} holds {count} elements, more than one array may ({MAX_ELEMENTS})")
    data_bytes = size - 8 - width - length
    if data_bytes < count * dtype.itemsize:
        raise Bad(f"{where}: truncated (it ends inside {described})")
    if data_bytes > count * dtype.itemsize:
        raise Bad(f"{where}: more data than its header's {described}")
    data = bytearray()  # grows with what the entry really holds, whatever its size claims
    while len(data) < count * dtype.itemsize:
        data += _read(e, min(count * dtype.itemsize - len(data), _CHUNK), where, described)
    array = np.frombuffer(data, dtype).reshape(shape, order="F" if fortran else "C")
    if dtype.kind == "u" and dtype.itemsize == 8 and array.size and int(array.max()) > 2**63 - 1:
        raise Bad(f"{where}: the value {int(array.max())} does not fit in int64")
    return array.copy(order="C") if fortran else array


# the .npy header's literal syntax, as NumPy writes it (and the Java runtime parses it): a dict of quoted keys
_TOKEN = re.compile(r"[ \t\r\n]*(?:('[^'\\]*'|\"[^\"\\]*\")|(True|False)|(0|[1-9][0-9]*)|([{}():,]))")
_KEYS = ("descr", "fortran_order", "shape")


def _tokens(text: str, where: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            if text[pos:].strip(" \t\r\n"):
                raise Bad(f"{where}: unreadable .npy header {_shown(text)}")
            break
        kind = "str" if m[1] else "bool" if m[2] else "int" if m[3] else m[4]
        out.append((kind, m[1][1:-1] if m[1] else m[0].strip(" \t\r\n")))
        pos = m.end()
    return out


def _shown(text: str) -> str:
    text = text.strip()
    return text if len(text) <= 200 else text[:200] + "..."


def _header(text: str, where: str) -> tuple[np.dtype, bool, tuple[int, ...]]:
    bad = Bad(f"{where}: unreadable .npy header {_shown(text)}")
    tokens = _tokens(text, where)
    fields: dict[str, object] = {}
    i = 0

    def take(*kinds: str) -> tuple[str, str]:
        nonlocal i
        if i >= len(tokens) or tokens[i][0] not in kinds:
            raise bad
        i += 1
        return tokens[i - 1]

    take("{")
    while tokens[i:i + 1] != [("}", "}")]:  # fmt: skip
        key = take("str")[1]
        take(":")
        kind, value = take("str", "bool", "(")
        if kind == "(":
            dims: list[int] = []
            while tokens[i:i + 1] != [(")", ")")]:  # fmt: skip
                digits = take("int")[1]
                if len(digits) > 10 or int(digits) > MAX_ELEMENTS:
                    raise Bad(f"{where}: bad shape in its .npy header {_shown(text)}")
                dims.append(int(digits))
                if take(",", ")")[0] == ")":
                    i -= 1
                    if len(dims) == 1:
                        raise bad  # (5) is not a tuple
                    break
            take(")")
            parsed: object = tuple(dims)
        else:
            parsed = value if kind == "str" else value == "True"
        if key in fields:
            raise Bad(f"{where}: its .npy header gives '{key}' twice")
        if key not in _KEYS:
            raise Bad(f"{where}: its .npy header has a key '{key}' other than {', '.join(_KEYS)}")
        fields[key] = (kind, parsed)
        if take(",", "}")[0] == "}":
            i -= 1
            break
    take("}")
    if i != len(tokens) or set(fields) != set(_KEYS):
        raise bad
    kinds = {k: fields[k][0] for k in _KEYS}  # type: ignore[index]
    if kinds != {"descr": "str", "fortran_order": "bool", "shape": "("}:
        raise bad
    descr, fortran, shape = (fields[k][1] for k in _KEYS)  # type: ignore[index]
    assert isinstance(descr, str) and isinstance(fortran, bool) and isinstance(shape, tuple)
    ok = len(descr) == 3 and descr[0] in "<>=|"
    ok = ok and (descr[1] == "f" and descr[2] in "248" or descr[1] in "iu" and descr[2] in "1248")
    if not ok:
        raise Bad(f"{where}: unsupported element type '{descr}' (expected floats or integers)")
    return np.dtype(descr), fortran, shape
