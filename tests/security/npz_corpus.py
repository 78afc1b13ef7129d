"""A corpus of crafted `.npz` archives that both npz readers (deepdsl/npzfile/, deepdsl/runtime/Npz.java) must
read alike (issue 36: one format, one reading). `write_corpus(folder)` writes every case and gives
{case: (path, verdict)}, verdict "accept" or the phrase the refusal must hold.

The archives are built byte by byte by `zip_bytes` (so a case can set any field: method, flags, sizes, names, a
second record for the same data), except the ones NumPy and zipfile write themselves.
"""

from __future__ import annotations

import bz2
import io
import struct
import warnings
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

W = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
Y = np.array([3, 1, 4, 1, 5], dtype=np.int64)


def npy(array: np.ndarray, version: tuple[int, int] | None = None) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, array, version=version, allow_pickle=False)
    return buf.getvalue()


def npy_with_header(text: str, data: bytes, version: int = 1, encoding: str = "latin-1") -> bytes:
    """A .npy entry whose header is `text` as given (padded to 64 bytes, ending in a newline)."""
    raw = text.encode(encoding)
    width = 2 if version == 1 else 4
    pad = -(6 + 2 + width + len(raw) + 1) % 64
    raw += b" " * pad + b"\n"
    return b"\x93NUMPY" + bytes([version, 0]) + len(raw).to_bytes(width, "little") + raw + data


@dataclass
class Entry:
    """One member as the ZIP records it; None fields are computed from `data`."""

    name: bytes
    data: bytes  # the uncompressed bytes
    method: int = 0
    flags: int = 0
    packed: bytes | None = None  # the bytes stored (compressed), computed from data and method when None
    crc: int | None = None
    size: int | None = None  # the uncompressed size recorded
    local_name: bytes | None = None
    same_data_as: int | None = None  # a second central record pointing at entry k's local header
    extra: bytes = b""
    packed_size: int | None = None  # the compressed size recorded, when not that of the bytes stored


@dataclass
class Archive:
    entries: list[Entry]
    comment: bytes = b""
    before: bytes = b""  # bytes before the first local header (offsets shifted as a self-extractor's are not)
    after: bytes = b""  # bytes after the end record
    count: int | None = None  # the entry count the end record gives
    disk: int = 0
    options: dict = field(default_factory=dict)


def _pack(e: Entry) -> bytes:
    if e.packed is not None:
        return e.packed
    if e.method == 0:
        return e.data
    if e.method == 8:
        c = zlib.compressobj(9, zlib.DEFLATED, -15)
        return c.compress(e.data) + c.flush()
    if e.method == 12:
        return bz2.compress(e.data)
    return e.data  # any other method: the bytes as they are (the reader must refuse before looking)


def zip_bytes(a: Archive) -> bytes:
    out = bytearray(a.before)
    central = bytearray()
    offsets: list[int] = []
    for e in a.entries:
        packed = _pack(e)
        crc = zlib.crc32(e.data) if e.crc is None else e.crc
        size = len(e.data) if e.size is None else e.size
        if e.same_data_as is not None:
            offset = offsets[e.same_data_as]
            packed = _pack(a.entries[e.same_data_as])
        else:
            offset = len(out) - len(a.before)
            name = e.name if e.local_name is None else e.local_name
            out += struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 20, e.flags, e.method, 0, 0x21, crc, len(packed),
                               size, len(name), 0) + name + packed  # fmt: skip
        offsets.append(offset)
        recorded = len(packed) if e.packed_size is None else e.packed_size
        central += struct.pack("<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", 20, 20, e.flags, e.method, 0, 0x21, crc,
                               recorded, size, len(e.name), len(e.extra), 0, 0, 0, 0, offset)  # fmt: skip
        central += e.name + e.extra
    start = len(out) - len(a.before)
    count = len(a.entries) if a.count is None else a.count
    out += central
    out += struct.pack("<4sHHHHIIH", b"PK\x05\x06", a.disk, a.disk, count, count, len(central), start,
                       len(a.comment)) + a.comment  # fmt: skip
    return bytes(out + a.after)


def _np(save: Callable[..., None], **arrays: np.ndarray) -> Callable[[], bytes]:
    def make() -> bytes:
        buf = io.BytesIO()
        save(buf, **arrays)
        return buf.getvalue()

    return make


def _zipfile(entries: list[tuple[str, bytes, int]], stream: bool = False) -> Callable[[], bytes]:
    """An archive zipfile writes: (name, data, method) each; `stream`: to an unseekable file (data descriptors)."""

    def make() -> bytes:
        buf = io.BytesIO()

        class Unseekable(io.RawIOBase):
            def writable(self) -> bool:
                return True

            def write(self, b) -> int:  # noqa: ANN001
                return buf.write(b)

        with zipfile.ZipFile(Unseekable() if stream else buf, "w") as zf:
            for name, data, method in entries:
                if stream:
                    with zf.open(zipfile.ZipInfo(name), "w") as f:
                        f.write(data)
                else:
                    zf.writestr(zipfile.ZipInfo(name), data, compress_type=method)
        return buf.getvalue()

    return make


def _arc(*entries: Entry, **kw: object) -> Callable[[], bytes]:
    return lambda: zip_bytes(Archive(list(entries), **kw))  # type: ignore[arg-type]


GOOD = npy(W)
HEADER = "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }"
DATA = W.tobytes()


def _claiming_4gib() -> bytes:
    """The issue's 2,225-byte archive: a deflated entry whose size (and header) claims just under 4 GiB of float32."""
    count = (2**32 - 256) // 4
    head = npy_with_header(f"{{'descr': '<f4', 'fortran_order': False, 'shape': ({count},), }}", b"")
    data = head + b"\0" * 2000
    e = Entry(b"w.npy", data, method=8, size=len(head) + 4 * count)
    return zip_bytes(Archive([e]))


def _zeros(name: bytes, megabytes: int) -> Entry:
    """A deflated entry that really inflates to `megabytes` MiB of float32 zeros, its header and size telling the
    truth (its compressed bytes made a MiB at a time)."""
    count = megabytes * 2**20 // 4
    head = npy_with_header(f"{{'descr': '<f4', 'fortran_order': False, 'shape': ({count},), }}", b"")
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    parts = [c.compress(head)]
    zeros = b"\0" * 2**20
    parts += [c.compress(zeros) for _ in range(megabytes)]
    crc = zlib.crc32(head)
    for _ in range(megabytes):
        crc = zlib.crc32(zeros, crc)
    return Entry(name, b"", method=8, packed=b"".join(parts) + c.flush(), crc=crc, size=len(head) + 4 * count)


def _stored_claims_3gib() -> bytes:
    """A stored entry whose records (and header) say 3 GiB, in a file of a few hundred bytes."""
    count = 3 * 2**30 // 4
    head = npy_with_header(f"{{'descr': '<f4', 'fortran_order': False, 'shape': ({count},), }}", b"")
    size = len(head) + 4 * count
    return zip_bytes(Archive([Entry(b"w.npy", head, crc=0, size=size, packed_size=size)]))


# case: (builder, verdict) -- verdict "accept", or a phrase both readers' refusals hold
CASES: dict[str, tuple[Callable[[], bytes], str]] = {
    # what NumPy and zipfile write
    "savez": (_np(np.savez, w=W, y=Y), "accept"),
    "savez_compressed": (_np(np.savez_compressed, w=W, y=Y), "accept"),
    "dtypes": (
        _np(
            np.savez,
            a=W.astype(">f8"),
            b=W.astype("<f2"),
            c=Y.astype("u1"),
            d=Y.astype(">i2"),
            e=Y.astype("<u8"),
            f=np.asfortranarray(W),
            s=np.float32(2.5),
            z=np.zeros((0, 3), np.float32),
        ),
        "accept",
    ),
    "version_2_and_3": (_arc(Entry(b"a.npy", npy(W, (2, 0))), Entry(b"b.npy", npy(W, (3, 0)))), "accept"),
    "streamed_deflate": (_zipfile([("w.npy", GOOD, zipfile.ZIP_DEFLATED)], stream=True), "accept"),
    "zip64": (lambda: _zip64(), "accept"),
    "no_suffix_and_folder": (_arc(Entry(b"dir/", b""), Entry(b"dir/w", GOOD)), "accept"),
    "comment": (_arc(Entry(b"w.npy", GOOD), comment=b"a comment PK\x05"), "accept"),
    "utf8_name": (_arc(Entry("é.npy".encode(), GOOD, flags=0x800)), "accept"),
    "double_quotes": (_arc(Entry(b"w.npy", npy_with_header(HEADER.replace("'", '"'), DATA))), "accept"),
    "keys_reordered": (
        _arc(Entry(b"w.npy", npy_with_header("{'shape': (3, 4), 'fortran_order': False, 'descr': '<f4'}", DATA))),
        "accept",
    ),
    "deflate_and_stored": (_arc(Entry(b"w.npy", GOOD, method=8), Entry(b"y.npy", npy(Y))), "accept"),
    # the .npy header: one literal syntax
    "header_key_twice": (
        _arc(
            Entry(
                b"w.npy",
                npy_with_header("{'descr': '<f8', 'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }", DATA),
            )
        ),
        "gives 'descr' twice",
    ),
    "header_shape_twice": (
        _arc(Entry(b"w.npy", npy_with_header(HEADER[:-1] + "'shape': (4, 3), }", DATA))),
        "gives 'shape' twice",
    ),
    "header_other_key": (_arc(Entry(b"w.npy", npy_with_header(HEADER[:-1] + "'x': True}", DATA))), "a key 'x'"),
    "header_missing_key": (
        _arc(Entry(b"w.npy", npy_with_header("{'descr': '<f4', 'shape': (3, 4)}", DATA))),
        "unreadable .npy header",
    ),
    "header_not_a_tuple": (
        _arc(Entry(b"w.npy", npy_with_header(HEADER.replace("(3, 4)", "(12)"), DATA))),
        "unreadable .npy header",
    ),
    "header_leading_zero": (
        _arc(Entry(b"w.npy", npy_with_header(HEADER.replace("(3, 4)", "(03, 4)"), DATA))),
        "unreadable .npy header",
    ),
    "header_expression": (
        _arc(Entry(b"w.npy", npy_with_header(HEADER.replace("(3, 4)", "(3, 2 + 2)"), DATA))),
        "unreadable .npy header",
    ),
    "header_garbage_after": (_arc(Entry(b"w.npy", npy_with_header(HEADER + " 7", DATA))), "unreadable .npy header"),
    "header_fortran_string": (
        _arc(Entry(b"w.npy", npy_with_header(HEADER.replace("False", "'False'"), DATA))),
        "unreadable .npy header",
    ),
    "header_v3_not_utf8": (
        _arc(Entry(b"w.npy", npy_with_header(HEADER.replace("}", "'\xff': 1}"), DATA, version=3))),
        "not UTF-8",
    ),
    "header_huge_dim": (
        _arc(Entry(b"w.npy", npy_with_header(HEADER.replace("(3, 4)", "(0, 3000000000)"), b""))),
        "bad shape",
    ),
    "complex": (_np(np.savez, w=W.astype(np.complex64)), "unsupported element type"),
    "uint64_too_large": (_np(np.savez, y=np.array([1, 2**63], np.uint64)), "does not fit in int64"),
    # the container
    "bzip2": (_zipfile([("w.npy", GOOD, zipfile.ZIP_BZIP2)]), "compression method 12 (bzip2)"),
    "lzma": (_zipfile([("w.npy", GOOD, zipfile.ZIP_LZMA)]), "compression method 14 (LZMA)"),
    "method_99": (_arc(Entry(b"w.npy", GOOD, method=99)), "compression method 99"),
    "encrypted": (_arc(Entry(b"w.npy", GOOD, flags=0x1)), "encrypted"),
    "strong_encryption": (_arc(Entry(b"w.npy", GOOD, flags=0x41)), "encrypted"),
    "patch_data": (_arc(Entry(b"w.npy", GOOD, flags=0x20)), "patch data"),
    "name_twice": (_arc(Entry(b"w.npy", GOOD), Entry(b"w.npy", npy(W[:1]))), "appears twice"),
    "name_with_and_without_suffix": (_arc(Entry(b"w", GOOD), Entry(b"w.npy", GOOD)), "appears twice"),
    "latin1_name_unflagged": (_arc(Entry("é.npy".encode("latin-1"), GOOD)), "without the UTF-8 flag"),
    "bad_utf8_name": (_arc(Entry(b"\xff.npy", GOOD, flags=0x800)), "not UTF-8"),
    "nul_in_name": (_arc(Entry(b"w\0x.npy", GOOD)), "NUL"),
    "local_name_differs": (_arc(Entry(b"w.npy", GOOD, local_name=b"v.npy")), "local header names"),
    "overlapping": (_arc(Entry(b"w.npy", GOOD), Entry(b"v.npy", GOOD, same_data_as=0)), "overlaps"),
    "data_before": (_arc(Entry(b"w.npy", GOOD), before=b"#!/bin/sh\nexit 0\n"), "data before or inside"),
    "data_after": (_arc(Entry(b"w.npy", GOOD), after=b"more"), "bytes of other data after the archive's end"),
    "comment_too_long": (lambda: zip_bytes(Archive([Entry(b"w.npy", GOOD)], comment=b"abc"))[:-2], "runs past"),
    "count_differs": (_arc(Entry(b"w.npy", GOOD), count=2), "counts 2 entries"),
    "two_disks": (_arc(Entry(b"w.npy", GOOD), disk=1), "several disks"),
    "crc": (_arc(Entry(b"w.npy", GOOD, crc=12345)), "CRC-32"),
    "stored_size_differs": (_arc(Entry(b"w.npy", GOOD, size=len(GOOD) + 4)), "a stored entry of"),
    "deflate_truncated": (
        _arc(Entry(b"w.npy", GOOD, method=8, packed=zlib.compress(GOOD)[2:-30])),
        "truncated",  # the deflate stream ends before the entry does
    ),
    "deflate_garbage": (_arc(Entry(b"w.npy", GOOD, method=8, packed=b"\xff" * 40)), "damaged ZIP data"),
    "inside_entry": (_arc(Entry(b"w.npy", GOOD + b"\0" * 8)), "more data than its header"),
    "short_entry": (_arc(Entry(b"w.npy", GOOD[:-8])), "truncated"),
    "single_npy": (lambda: GOOD, "single .npy array"),
    "not_zip": (lambda: b"hello, this is not an archive at all" * 3, "no ZIP end record"),
    # sizes: refused from the records, before anything is allocated
    "claims_4gib_deflated": (_claiming_4gib, "more than deepdsl inflates"),
    "bomb_300mib": (_arc(_zeros(b"w.npy", 300)), "more than deepdsl inflates"),
    # 100 MiB inflated, then an array given twice: refused from the records, before the 100 MiB is inflated
    "bomb_then_twice": (
        _arc(_zeros(b"v.npy", 100), Entry(b"w", GOOD), Entry(b"w.npy", GOOD)),
        "more than deepdsl inflates",
    ),
    "stored_claims_3gib": (_stored_claims_3gib, "runs past the entries"),
}

# the cases that would cost gigabytes read naively: their peak memory is measured
MEMORY_CASES = ("claims_4gib_deflated", "bomb_300mib", "bomb_then_twice", "stored_claims_3gib")


def _zip64() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        with zf.open("w.npy", "w", force_zip64=True) as f:
            f.write(GOOD)
    return buf.getvalue()


def write_corpus(folder: Path) -> dict[str, tuple[Path, str]]:
    """Every case written into `folder`: {case: (path, verdict)}."""
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for case, (make, verdict) in CASES.items():
            path = folder / f"{case}.npz"
            path.write_bytes(make())
            out[case] = (path, verdict)
    return out
