"""Reading an ONNX file: the model loaded without trusting its sizes (`load_model`), its external data read from
the model's own folder only (`read_external_data`), a tensor's array checked before it is made (`tensor_array`),
and the skeleton without the weights that the checker and shape inference see (GroupNormalization standing in as an
Identity of its input there: ONNX infers no shape for it, and its checker refuses opset 18's as deprecated)."""

from __future__ import annotations

import math
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from deepdsl.errors import DslProgramError
from deepdsl.ir.types import MAX_ELEMENTS

ONNX_EXTRA = "pip install 'deepdsl[onnx]'"


MIN_OPSET = 11


MAX_ONNX_BYTES = 2**31 - 1  # protobuf's limit for one message: a larger model keeps its weights in external files


MAX_EXTERNAL_BYTES = 2**34  # the external data of one model, all its tensors together


# the element types deepdsl reads, as little-endian NumPy types (TensorProto's numbers); a string, bfloat16,
# float8, 4-bit or complex tensor is refused
DTYPES = {1: "<f4", 2: "u1", 3: "i1", 4: "<u2", 5: "<i2", 6: "<i4", 7: "<i8", 9: "?", 10: "<f2", 11: "<f8",
           12: "<u4", 13: "<u8"}  # fmt: skip


def require_onnx() -> Any:
    """The `onnx` module, or a user error saying how to install it."""
    try:
        import onnx
    except ImportError:
        raise DslProgramError(f"reading and writing ONNX needs the onnx package: {ONNX_EXTRA}") from None
    return onnx


def newest_opset() -> int:
    return int(require_onnx().defs.onnx_opset_version())


SMALL_CONSTANT = 64  # elements: an initialiser this small (a shape, a ratio) stays a constant in the skeleton


# operators whose output has their first input's shape but get none from ONNX's shape inference (GroupNormalization,
# a function whose body it does not infer through), and whose opset-18 form onnx's checker refuses as deprecated
# (ONNX Runtime runs both): an Identity of that input in the skeleton; the import rule checks the node itself
SAME_SHAPE_STAND_INS = frozenset({"GroupNormalization"})


def skeleton(model: Any) -> Any:
    """`model` without its weights' data: every initialiser larger than SMALL_CONSTANT becomes a graph input of its
    type, so that the checker and shape inference need not copy or read a 100 MB model."""
    onnx = require_onnx()
    from onnx import helper

    graph = model.graph
    m = onnx.ModelProto(**{f.name: v for f, v in model.ListFields() if f.name != "graph"})
    g = m.graph
    g.CopyFrom(onnx.GraphProto(**{f.name: v for f, v in graph.ListFields() if f.name != "initializer"}))
    listed = {i.name for i in g.input}
    for t in graph.initializer:
        if math.prod(t.dims) <= SMALL_CONSTANT:
            g.initializer.append(t)
        elif t.name not in listed:
            g.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    for node in g.node:
        if node.op_type in SAME_SHAPE_STAND_INS and node.domain in ("", "ai.onnx") and node.input:
            node.op_type, node.domain = "Identity", ""
            del node.input[1:], node.attribute[:]
    return m


def load_model(path: str | Path) -> Any:
    """The ModelProto in `path`; a missing, huge or malformed file is a user error."""
    onnx = require_onnx()
    p = Path(path)
    if not p.is_file():
        raise DslProgramError(f"'{path}' is not a regular file" if p.exists() else f"file not found: '{path}'")
    if p.stat().st_size > MAX_ONNX_BYTES:
        raise DslProgramError(f"'{path}' is larger than 2 GiB; save the model with external data")
    try:
        model = onnx.load_model(str(p), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 — protobuf's DecodeError and friends
        raise DslProgramError(f"'{path}' is not an ONNX model: {type(exc).__name__}: {exc}") from None
    if not model.HasField("graph"):
        raise DslProgramError(f"'{path}' is not an ONNX model (it holds no graph)")
    read_external_data(model, p, onnx)  # before the checker, which would look for the files in the cwd
    try:
        onnx.checker.check_model(skeleton(model))
    except Exception as exc:  # noqa: BLE001 — onnx.checker.ValidationError
        raise DslProgramError(f"'{path}' is not a valid ONNX model: {str(exc).strip().splitlines()[0]}") from None
    return model


def tensor_array(t: Any, what: str, onnx: Any) -> np.ndarray:
    """The array `t` (a TensorProto whose data is in the model) holds, checked before anything is allocated: an
    element type deepdsl reads, at most MAX_ELEMENTS elements, and data of the length its dims need (dims that lie
    about it are refused, not reshaped)."""
    from onnx import numpy_helper

    name = t.name if len(t.name) <= 200 else f"{t.name[:100]}...({len(t.name):,} characters)"
    where = f"{what} '{name}'"
    dtype = DTYPES.get(t.data_type)
    if dtype is None:
        kind = onnx.TensorProto.DataType.Name(t.data_type) if t.data_type in onnx.TensorProto.DataType.values() else (
            f"type {t.data_type}")  # fmt: skip
        raise DslProgramError(f"{where} holds {kind} elements; deepdsl reads tensors of numbers")
    dims = [int(d) for d in t.dims]
    count = math.prod(dims)
    if any(d < 0 for d in dims) or count > MAX_ELEMENTS:
        raise DslProgramError(f"{where} has dims {dims}; at most {MAX_ELEMENTS:,} elements, none negative")
    if t.data_location == onnx.TensorProto.EXTERNAL:
        raise DslProgramError(f"{where} keeps its data in an external file")  # read_external_data reads them all
    raw = t.raw_data  # one copy out of the message (each access of the field makes another)
    if raw:
        held, need = len(raw), count * np.dtype(dtype).itemsize
        if held == need:  # the bytes as they are, little-endian as ONNX stores them
            return np.frombuffer(raw, dtype=dtype).reshape(dims).astype(np.dtype(dtype).newbyteorder("="))
        unit = "bytes"
    else:
        field = {1: "float_data", 7: "int64_data", 11: "double_data", 12: "uint64_data", 13: "uint64_data"}.get(
            t.data_type, "int32_data")  # fmt: skip
        held, need, unit = len(getattr(t, field)), count, "values"
    if held != need:
        raise DslProgramError(f"{where}: its dims {dims} need {need:,} {unit} of data, it holds {held:,}")
    try:
        return np.asarray(numpy_helper.to_array(t))
    except (ValueError, TypeError) as exc:
        raise DslProgramError(f"{where} cannot be read: {exc}") from None


def read_external_data(model: Any, path: Path, onnx: Any) -> None:
    """Every tensor of `model` that keeps its data in an external file (initialisers as PyTorch's exporter writes
    them for a large model, a Constant's value, anywhere in the model) given that data, read from the model's
    folder only: a location that is absolute, climbs out with `..` or leads out through a link is refused, and so
    is anything but a regular file, and an offset or length past the file's end; at most MAX_EXTERNAL_BYTES in
    all. Never onnx's own loader, which resolves the location against the current directory."""
    root = os.path.realpath(path.parent)
    total = 0
    todo: list[Any] = [model]  # every message of the model, without recursion (subgraphs may nest deep)
    while todo:
        m = todo.pop()
        if isinstance(m, onnx.TensorProto):
            if m.data_location == onnx.TensorProto.EXTERNAL:
                total += _read_external(m, root, str(path), MAX_EXTERNAL_BYTES - total)
            continue
        for f, v in m.ListFields():
            if f.message_type is None:
                continue
            if hasattr(v, "ListFields"):  # one message, else a repeated field of them
                todo.append(v)
            else:
                todo.extend(v)


def _read_external(t: Any, root: str, file: str, budget: int) -> int:
    """Read `t`'s external data into it (raw_data) and return its length; see read_external_data."""
    info = {e.key: e.value for e in t.external_data}
    name = t.name if len(t.name) <= 200 else f"{t.name[:100]}...({len(t.name):,} characters)"
    location = info.get("location", "")
    shown = location if len(location) <= 200 else f"{location[:100]}..."

    def refuse(why: str) -> DslProgramError:
        return DslProgramError(f"'{file}': tensor '{name}' keeps its data in '{shown}', {why}")

    if not location or "\x00" in location:
        raise refuse("which names no file")
    if os.path.isabs(location) or location.startswith(("/", "\\")) or re.match(r"[A-Za-z]:", location):
        raise refuse("an absolute path; deepdsl reads external data from the model's own folder only")
    if ".." in re.split(r"[/\\]", location):
        raise refuse("which climbs out of the model's folder; deepdsl reads external data from that folder only")
    target = os.path.realpath(os.path.join(root, location))
    if os.path.commonpath([root, target]) != root or target == root:
        raise refuse("which leads out of the model's folder (through a link); deepdsl reads external data from "
                     "that folder only")  # fmt: skip
    numbers = {}
    for key in ("offset", "length"):
        text = info.get(key)
        if text is not None and not (text.isascii() and text.isdigit() and len(text) <= 19):
            raise refuse(f"at {key} '{text[:40]}', which is not a byte count")
        numbers[key] = None if text is None else int(text)
    dtype = DTYPES.get(t.data_type)
    if dtype is None:  # tensor_array says what it holds
        return 0
    need = math.prod(int(d) for d in t.dims) * np.dtype(dtype).itemsize
    if need > budget or any(d < 0 for d in t.dims):
        raise refuse(f"for dims {list(t.dims)}: more than the {MAX_EXTERNAL_BYTES:,} bytes deepdsl reads in all")
    fd = _open_below(root, os.path.relpath(target, root), refuse)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise refuse("which is not a regular file")
        offset = numbers["offset"] or 0
        length = st.st_size - offset if numbers["length"] is None else numbers["length"]
        if offset > st.st_size or offset + length > st.st_size:
            raise refuse(f"at offset {offset:,}, {length:,} bytes, past the end of the file ({st.st_size:,} bytes)")
        if length != need:
            raise refuse(f"{length:,} bytes, but its dims {list(t.dims)} need {need:,}")
        chunks, at = [], offset
        while at < offset + length:  # the file may shrink meanwhile: a short read is an error, never a hang
            chunk = os.pread(fd, min(offset + length - at, 2**26), at)
            if not chunk:
                raise refuse("which ended early while it was read")
            chunks.append(chunk)
            at += len(chunk)
    finally:
        os.close(fd)
    t.raw_data = b"".join(chunks)
    del t.external_data[:]
    t.data_location = 0  # DEFAULT: the data is in the tensor now
    return length


def _open_below(root: str, rel: str, refuse: Callable[[str], DslProgramError]) -> int:
    """A descriptor of the file `rel` below the folder `root`, each part opened below the one before without
    following a link (`rel` was resolved already: a link put there since is refused), non-blocking (a FIFO)."""
    parts = rel.split(os.sep)
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        if os.open not in os.supports_dir_fd:  # no openat: the resolved path, its last part not followed
            return os.open(os.path.join(root, rel), flags | getattr(os, "O_NONBLOCK", 0))
        fd = os.open(root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            for part in parts[:-1]:
                inner = os.open(part, flags | getattr(os, "O_DIRECTORY", 0), dir_fd=fd)
                os.close(fd)
                fd = inner
            return os.open(parts[-1], flags | getattr(os, "O_NONBLOCK", 0), dir_fd=fd)
        finally:
            os.close(fd)
    except OSError as e:
        raise refuse(f"which cannot be read: {e.strerror or e}") from None
