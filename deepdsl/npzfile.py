"""Reading `.npz` archives that may be damaged or hostile, as the Java runtime's `Npz.read` reads them.

`read_npz(path, what)` gives every array of the archive by name (the entry name without `.npy`), in file order, or
raises a DslProgramError naming the file and the entry. Unlike `np.load` it refuses, before it allocates anything:
an entry name given twice (np.load would take the last one silently), bytes after the archive's end record, an
entry of 4 GiB or more, a header whose shape holds more elements than one Java array (so a header claiming 1e11
elements costs nothing), and an entry whose size is not exactly header + shape x item size (trailing data inside
the entry, or one that ends early); element types are those both runtimes read: floats of 2, 4 or 8 bytes and
integers of 1 to 8 bytes. `zipfile` checks each entry's CRC-32 as the entry is read to its end.
"""

from __future__ import annotations

import ast
import math
import os
import zipfile
from typing import IO

import numpy as np

from .errors import DslProgramError

__all__ = ["MAX_ELEMENTS", "MAX_ENTRY_BYTES", "read_npz"]

MAX_ENTRY_BYTES = 2**32  # an entry of this size or more is refused (the Java runtime reads the same)
MAX_ELEMENTS = 2**31 - 9  # the most elements of one Java array
_MAGIC = b"\x93NUMPY"
_END = b"PK\x05\x06"  # the end-of-central-directory record: 22 bytes and a comment of at most 65535
_CHUNK = 1 << 20


class _Bad(ValueError):
    """A damaged entry; the message says what is wrong with it."""


def read_npz(path: str, what: str) -> dict[str, np.ndarray]:
    """The arrays of the `.npz` archive at `path` (`what` names the kind of file in messages)."""
    try:
        with open(path, "rb") as f:
            if f.read(len(_MAGIC)) == _MAGIC:
                raise DslProgramError(f"{what} '{path}' is a single .npy array, not an .npz archive")
            _check_end(f, os.fstat(f.fileno()).st_size)
            f.seek(0)
            return _entries(zipfile.ZipFile(f))
    except DslProgramError:
        raise
    except _Bad as e:
        raise DslProgramError(f"cannot read {what} '{path}': {e}") from None
    except zipfile.BadZipFile as e:
        raise DslProgramError(f"cannot read {what} '{path}': not an .npz archive ({e})") from None
    except (OSError, EOFError, ValueError) as e:
        raise DslProgramError(f"cannot read {what} '{path}': {getattr(e, 'strerror', None) or e}") from None


def _check_end(f: IO[bytes], size: int) -> None:
    """Refuse bytes after the end record (which np.load and Java's ZipFile would skip)."""
    tail_size = min(size, 22 + 65535)
    f.seek(size - tail_size)
    tail = f.read(tail_size)
    short = None  # the bytes after the last record that ends before the file does
    at = tail.rfind(_END, 0, len(tail) - 21)
    while at >= 0:
        end = at + 22 + int.from_bytes(tail[at + 20 : at + 22], "little")
        if end == len(tail):
            return  # (a record-like pattern inside the comment cannot hide this one)
        if end < len(tail) and short is None:
            short = len(tail) - end
        at = tail.rfind(_END, 0, at)
    if short is not None:
        raise _Bad(f"{short} bytes of other data after the archive's end")
    # no end record: zipfile says what it finds


def _entries(zf: zipfile.ZipFile) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    with zf:
        for info in zf.infolist():
            if info.is_dir():
                continue
            entry = info.filename
            name = entry[:-4] if entry.endswith(".npy") else entry
            where = f"entry '{entry}'"
            if name in out:
                raise _Bad(f"{where}: the array '{name}' appears twice")
            if info.file_size >= MAX_ENTRY_BYTES:
                raise _Bad(f"{where} is {info.file_size} bytes; entries of 4 GiB or more are not read")
            if info.compress_type == zipfile.ZIP_STORED and info.compress_size != info.file_size:
                raise _Bad(f"{where}: a stored entry of {info.file_size} bytes that takes {info.compress_size}")
            try:
                with zf.open(info) as e:
                    out[name] = _array(e, info.file_size, where)
            except zipfile.BadZipFile as err:
                raise _Bad(f"{where}: damaged ZIP data ({err})") from None
            except EOFError:
                raise _Bad(f"{where}: truncated (the archive ends inside it)") from None
    return out


def _read(e: IO[bytes], n: int, where: str, inside: str) -> bytes:
    data = e.read(n)
    if len(data) < n:
        raise _Bad(f"{where}: truncated (it ends inside {inside})")
    return data


def _array(e: IO[bytes], size: int, where: str) -> np.ndarray:
    prefix = e.read(8)
    if len(prefix) < 8 or prefix[:6] != _MAGIC:
        raise _Bad(f"{where}: not a .npy array (bad magic bytes)")
    major, minor = prefix[6], prefix[7]
    if major not in (1, 2, 3):
        raise _Bad(f"{where}: unsupported .npy format version {major}.{minor}")
    width = 2 if major == 1 else 4
    length = int.from_bytes(_read(e, width, where, "its .npy header"), "little")
    if length > 1 << 20:
        raise _Bad(f"{where}: implausible .npy header length {length}")
    text = _read(e, length, where, "its .npy header").decode("utf-8" if major == 3 else "latin-1")
    dtype, fortran, shape = _header(text, where)
    count = math.prod(shape)
    described = f"{count} elements of {dtype.str} {list(shape)}"
    if count > MAX_ELEMENTS:
        raise _Bad(f"{where}: shape {list(shape)} holds {count} elements, more than one array may ({MAX_ELEMENTS})")
    data_bytes = size - 8 - width - length
    if data_bytes < count * dtype.itemsize:
        raise _Bad(f"{where}: truncated (it ends inside {described})")
    if data_bytes > count * dtype.itemsize:
        raise _Bad(f"{where}: more data than its header's {described}")
    data = bytearray()  # grows with what the entry really holds, whatever its size claims
    while len(data) < count * dtype.itemsize:
        data += _read(e, min(count * dtype.itemsize - len(data), _CHUNK), where, described)
    if e.read(1):
        raise _Bad(f"{where}: more data than its header's {described}")
    array = np.frombuffer(data, dtype).reshape(shape, order="F" if fortran else "C")
    return array.copy(order="C") if fortran else array


def _header(text: str, where: str) -> tuple[np.dtype, bool, tuple[int, ...]]:
    try:
        d = ast.literal_eval(text.strip())
        descr, fortran, shape = d["descr"], d["fortran_order"], tuple(d["shape"])
    except (ValueError, SyntaxError, KeyError, TypeError, MemoryError, RecursionError):
        raise _Bad(f"{where}: unreadable .npy header {text.strip()}") from None
    if not (isinstance(fortran, bool) and all(isinstance(n, int) and not isinstance(n, bool) for n in shape)):
        raise _Bad(f"{where}: unreadable .npy header {text.strip()}")
    if any(n < 0 for n in shape):
        raise _Bad(f"{where}: bad shape {shape} in its .npy header")
    ok = isinstance(descr, str) and len(descr) == 3 and descr[0] in "<>=|"
    ok = ok and (descr[1] == "f" and descr[2] in "248" or descr[1] in "iu" and descr[2] in "1248")
    if not ok:
        raise _Bad(f"{where}: unsupported element type '{descr}' (expected floats or integers)")
    return np.dtype(descr), fortran, shape
