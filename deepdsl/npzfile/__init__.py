"""Reading `.npz` archives that may be damaged or hostile, by the rules the Java runtime's `Npz.read` follows.

`read_npz(path, what)` gives every array of the archive by name (the entry name without `.npy`), in file order, or
raises a DslProgramError naming the file and the entry. Both runtimes read the ZIP container themselves, by the
same steps and the same rules (docs/formats.md, "Reading an .npz archive"), so they accept and refuse the same
files; tests/security/test_readers.py runs one corpus of crafted archives through both. Everything about the
archive is checked from its central directory before any array is allocated:

- the end record is the last one in the file's last 65,557 bytes and ends exactly at the file's end; the central
  directory ends where it (or its ZIP64 record) begins, on one disk, holds exactly the entries it counts, and its
  records and extra fields are whole;
- an entry is stored or deflated (no bzip2, LZMA or other method), not encrypted or patched, its name ASCII or
  flagged UTF-8 and without NUL, given once (`w` and `w.npy` are the same array), under 4 GiB; a stored entry
  takes exactly its size; every entry's local header and data lie inside the archive, before the central
  directory, without overlapping another's;
- what the deflated entries promise in all is at most ``max(16 x the archive's size, 64 MiB)``
  (`MAX_INFLATE_RATIO`, `MIN_INFLATE_LIMIT`): a small file cannot make the reader allocate gigabytes, and
  inflating stops at the size an entry promises;
- each entry's `.npy` header is a dict of exactly 'descr', 'fortran_order' and 'shape', each once, in the literal
  syntax NumPy writes; its element type a float of 2, 4 or 8 bytes or an integer of 1 to 8 bytes (an unsigned
  8-byte value above 2^63 - 1 is refused); its shape at most 2^31 - 9 elements; the entry holds exactly header +
  shape x item size bytes, and its CRC-32 matches.

The ZIP container is read here, each entry's `.npy` array by `npy.py`.
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass
from typing import IO

import numpy as np

from ..errors import DslProgramError
from .npy import MAGIC, Bad, read_array

__all__ = ["MAX_ENTRY_BYTES", "MAX_INFLATE_RATIO", "MIN_INFLATE_LIMIT", "inflate_limit", "read_npz"]

MAX_ENTRY_BYTES = 2**32  # an entry of this size or more is refused (the Java runtime reads the same)
MAX_INFLATE_RATIO = 16  # the deflated entries of an archive promise at most this many times its size in all ...
MIN_INFLATE_LIMIT = 64 * 2**20  # ... or this many bytes, whichever is more
MAX_DIRECTORY_BYTES = 16 * 2**20  # a larger central directory (some 300,000 entries) is refused
_END, _END64, _LOCATOR = b"PK\x05\x06", b"PK\x06\x06", b"PK\x06\x07"
_CENTRAL, _LOCAL = b"PK\x01\x02", b"PK\x03\x04"
_METHODS = {0: "stored", 8: "deflate"}
_KNOWN_METHODS = {12: "bzip2", 14: "LZMA", 9: "deflate64", 93: "Zstandard", 95: "XZ", 98: "PPMd"}
_ENCRYPTED, _PATCHED, _STRONG, _UTF8 = 0x1, 0x20, 0x40, 0x800


def inflate_limit(archive_bytes: int) -> int:
    """The most bytes the deflated entries of an archive of `archive_bytes` bytes may promise in all."""
    return max(MAX_INFLATE_RATIO * archive_bytes, MIN_INFLATE_LIMIT)


@dataclass(frozen=True)
class _Entry:
    name: str  # as the central directory gives it
    raw_name: bytes
    flags: int
    method: int
    crc: int
    packed: int  # compressed size
    size: int  # uncompressed size
    offset: int  # of the local header


def read_npz(path: str, what: str) -> dict[str, np.ndarray]:
    """The arrays of the `.npz` archive at `path` (`what` names the kind of file in messages)."""
    try:
        with open(path, "rb") as f:
            if f.read(len(MAGIC)) == MAGIC:
                raise DslProgramError(f"{what} '{path}' is a single .npy array, not an .npz archive")
            size = os.fstat(f.fileno()).st_size
            start, entries = _directory(f, size)
            _check_entries(entries, size, start)
            out: dict[str, np.ndarray] = {}
            for e in entries:
                if not e.name.endswith("/"):
                    out[_array_name(e.name)] = _read_entry(f, e, start)
            return out
    except DslProgramError:
        raise
    except Bad as e:
        raise DslProgramError(f"cannot read {what} '{path}': {e}") from None
    except (OSError, EOFError, ValueError, MemoryError) as e:
        raise DslProgramError(f"cannot read {what} '{path}': {getattr(e, 'strerror', None) or e}") from None


def _array_name(entry: str) -> str:
    return entry[:-4] if entry.endswith(".npy") else entry


def _u(data: bytes, at: int, n: int) -> int:
    return int.from_bytes(data[at : at + n], "little")


def _directory(f: IO[bytes], size: int) -> tuple[int, list[_Entry]]:
    """The central directory's offset and entries, after the end record's checks (module docstring)."""
    tail_size = min(size, 22 + 65535)
    f.seek(size - tail_size)
    tail = f.read(tail_size)
    at = tail.rfind(_END, 0, len(tail) - 18)  # a whole record fits after it
    if at < 0:
        raise Bad("not an .npz archive (no ZIP end record)")
    end = at + 22 + _u(tail, at + 20, 2)
    if end < len(tail):
        raise Bad(f"{len(tail) - end} bytes of other data after the archive's end")
    if end > len(tail):
        raise Bad("not an .npz archive (its end record's comment runs past the end of the file)")
    record = size - tail_size + at  # where the end record begins
    disk, cd_disk = _u(tail, at + 4, 2), _u(tail, at + 6, 2)
    count_here, count = _u(tail, at + 8, 2), _u(tail, at + 10, 2)
    cd_size, cd_offset = _u(tail, at + 12, 4), _u(tail, at + 16, 4)
    before = record  # the central directory ends here
    if record >= 20 + 56:
        f.seek(record - 20)
        locator = f.read(20)
        f.seek(record - 20 - 56)
        z64 = f.read(56)
        if locator[:4] == _LOCATOR and z64[:4] == _END64:
            if _u(locator, 4, 4) != 0 or _u(locator, 16, 4) > 1:
                raise Bad("an archive that spans several disks is not read")
            disk, cd_disk = _u(z64, 16, 4), _u(z64, 20, 4)
            count_here, count, cd_size, cd_offset = _u(z64, 24, 8), _u(z64, 32, 8), _u(z64, 40, 8), _u(z64, 48, 8)
            before = record - 20 - 56
    if disk != 0 or cd_disk != 0 or count_here != count:
        raise Bad("an archive that spans several disks is not read")
    if cd_offset + cd_size != before:
        raise Bad(
            f"damaged ZIP archive: its central directory ({cd_size} bytes at {cd_offset}) does not end where its end "
            f"record begins ({before}); data before or inside the archive is not read"
        )
    if cd_size > MAX_DIRECTORY_BYTES:
        raise Bad(f"its central directory of {cd_size} bytes is larger than deepdsl reads ({MAX_DIRECTORY_BYTES})")
    f.seek(cd_offset)
    cd = f.read(cd_size)
    entries: list[_Entry] = []
    pos = 0
    while pos < len(cd):
        if len(cd) - pos < 46 or cd[pos : pos + 4] != _CENTRAL:
            raise Bad(f"damaged ZIP archive: a bad central directory record at {cd_offset + pos}")
        flags, method, crc = _u(cd, pos + 8, 2), _u(cd, pos + 10, 2), _u(cd, pos + 16, 4)
        packed, unpacked = _u(cd, pos + 20, 4), _u(cd, pos + 24, 4)
        n, m, k = _u(cd, pos + 28, 2), _u(cd, pos + 30, 2), _u(cd, pos + 32, 2)
        offset = _u(cd, pos + 42, 4)
        if pos + 46 + n + m + k > len(cd):
            raise Bad(f"damaged ZIP archive: a central directory record at {cd_offset + pos} runs past its end")
        raw = cd[pos + 46 : pos + 46 + n]
        name = _name(raw, flags, f"the central directory record at {cd_offset + pos}")
        extra = cd[pos + 46 + n : pos + 46 + n + m]
        unpacked, packed, offset = _zip64(extra, unpacked, packed, offset, name)
        entries.append(_Entry(name, raw, flags, method, crc, packed, unpacked, offset))
        pos += 46 + n + m + k
    if len(entries) != count:
        raise Bad(f"damaged ZIP archive: its end record counts {count} entries, its central directory holds "
                   f"{len(entries)}")  # fmt: skip
    return cd_offset, entries


def _name(raw: bytes, flags: int, where: str) -> str:
    if b"\0" in raw:
        raise Bad(f"{where}: an entry name holding a NUL byte")
    if flags & _UTF8:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise Bad(f"{where}: an entry name flagged UTF-8 that is not UTF-8") from None
    if not raw.isascii():
        raise Bad(f"{where}: an entry name of other than ASCII characters without the UTF-8 flag")
    return raw.decode("ascii")


def _zip64(extra: bytes, unpacked: int, packed: int, offset: int, name: str) -> tuple[int, int, int]:
    """The sizes and offset with the first ZIP64 extra field's values where the record holds 0xFFFFFFFF."""
    seen = False
    while len(extra) >= 4:
        kind, n = _u(extra, 0, 2), _u(extra, 2, 2)
        if 4 + n > len(extra):
            raise Bad(f"entry '{name}': damaged ZIP data (an extra field runs past its record)")
        data = extra[4 : 4 + n]
        if kind == 1 and not seen:
            seen = True
            values = [unpacked, packed, offset]
            for i in range(3):
                if values[i] == 0xFFFFFFFF:
                    if len(data) < 8:
                        raise Bad(f"entry '{name}': damaged ZIP data (a ZIP64 extra field too short)")
                    values[i], data = _u(data, 0, 8), data[8:]
            unpacked, packed, offset = values
        extra = extra[4 + n :]
    return unpacked, packed, offset


def _check_entries(entries: list[_Entry], archive: int, directory: int) -> None:
    """Every entry's central directory record against the rules (module docstring), before anything is read."""
    names: set[str] = set()
    regions: list[tuple[int, int, str]] = []
    inflated = 0
    for e in entries:
        where = f"entry '{e.name}'"
        if e.flags & (_ENCRYPTED | _STRONG):
            raise Bad(f"{where} is encrypted; encrypted entries are not read")
        if e.flags & _PATCHED:
            raise Bad(f"{where} holds patch data; it is not read")
        if e.method not in _METHODS:
            known = f" ({_KNOWN_METHODS[e.method]})" if e.method in _KNOWN_METHODS else ""
            raise Bad(f"{where} uses compression method {e.method}{known}; only stored (0) and deflate (8) entries "
                       "are read")  # fmt: skip
        name = _array_name(e.name)
        if not e.name.endswith("/"):
            if name in names:
                raise Bad(f"{where}: the array '{name}' appears twice")
            names.add(name)
        if e.size >= MAX_ENTRY_BYTES:
            raise Bad(f"{where} is {e.size} bytes; entries of 4 GiB or more are not read")
        if e.method == 0 and e.packed != e.size:
            raise Bad(f"{where}: a stored entry of {e.size} bytes that takes {e.packed}")
        if e.method == 8:
            inflated += e.size
            if inflated > inflate_limit(archive):
                raise Bad(
                    f"{where}: the deflated entries promise {inflated} bytes or more in all, more than deepdsl "
                    f"inflates from an archive of {archive} bytes ({MAX_INFLATE_RATIO} times its size, at least "
                    f"{MIN_INFLATE_LIMIT >> 20} MiB)"
                )
        end = e.offset + 30 + len(e.raw_name) + e.packed  # (at the least: the local header's extra field adds)
        if end > directory:
            raise Bad(f"{where}: damaged ZIP data (its data runs past the entries into the central directory)")
        regions.append((e.offset, end, e.name))
    regions.sort()
    for (_, end, name), (start, _, other) in zip(regions, regions[1:]):
        if end > start:
            raise Bad(f"entry '{other}' overlaps entry '{name}' (damaged or crafted ZIP data)")


def _read_entry(f: IO[bytes], e: _Entry, directory: int) -> np.ndarray:
    where = f"entry '{e.name}'"
    f.seek(e.offset)
    head = f.read(30)
    if len(head) < 30 or head[:4] != _LOCAL:
        raise Bad(f"{where}: damaged ZIP data (no local header at {e.offset})")
    n, m = _u(head, 26, 2), _u(head, 28, 2)
    local = f.read(n)
    if local != e.raw_name or (not local.isascii() and not _u(head, 6, 2) & _UTF8):
        raise Bad(f"{where}: damaged ZIP data (its local header names '{local.decode('latin-1')}')")
    start = e.offset + 30 + n + m
    if start + e.packed > directory:
        raise Bad(f"{where}: damaged ZIP data (its data runs past the entries into the central directory)")
    f.seek(start)
    stream = Stream(f, e, where)
    array = read_array(stream, e.size, where)
    stream.finish()
    return array


class Stream:
    """An entry's bytes: at most its size, read or inflated chunk by chunk, its CRC-32 checked at the end."""

    def __init__(self, f: IO[bytes], e: _Entry, where: str):
        self.f, self.left_in, self.left_out, self.where = f, e.packed, e.size, where
        self.expected, self.crc = e.crc, 0
        self.inflate = zlib.decompressobj(-15) if e.method == 8 else None
        self.tail = b""  # compressed bytes read but not yet inflated

    def _more(self, n: int) -> bytes:
        n = min(self.left_in, n)
        data = self.f.read(n)
        if len(data) < n:
            raise Bad(f"{self.where}: truncated (the archive ends inside it)")
        self.left_in -= n
        return data

    def read(self, n: int) -> bytes:
        """Up to `n` more bytes (fewer only at the entry's end, or where its data ends early)."""
        n = min(n, self.left_out)
        parts, got = [], 0
        while got < n:
            if self.inflate is None:
                if not self.left_in:
                    break
                chunk = self._more(n - got)
            else:
                if not self.tail:
                    if self.inflate.eof or not self.left_in:
                        break
                    self.tail = self._more(1 << 16)  # (small: each call copies what it leaves unconsumed)
                try:
                    chunk = self.inflate.decompress(self.tail, n - got)
                except zlib.error as err:
                    raise Bad(f"{self.where}: damaged ZIP data ({err})") from None
                self.tail = b"" if self.inflate.eof else self.inflate.unconsumed_tail
            parts.append(chunk)
            got += len(chunk)
        out = b"".join(parts)
        self.left_out -= len(out)
        self.crc = zlib.crc32(out, self.crc)
        return out

    def finish(self) -> None:
        if self.crc != self.expected:
            raise Bad(f"{self.where}: damaged ZIP data (its CRC-32 is {self.crc:08x}, the archive records "
                       f"{self.expected:08x})")  # fmt: skip
