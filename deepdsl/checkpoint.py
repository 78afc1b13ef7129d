"""Parameter files (DESIGN.md 9): NumPy ``.npz`` archives shared with the Java runtime.

    save_npz(path, arrays)            write atomically, entries in dict order
    load_npz(path, expected)          read and check against {name: (shape, dtype)}

The archive is exactly what ``np.savez`` writes (uncompressed ZIP, one ``NAME.npy`` entry per
array, ZIP64 extra fields forced), but it is written with `zipfile` directly so that any name
works: ``np.savez(file, **arrays)`` would take a parameter called ``file`` or ``allow_pickle`` as
its own argument. Names may hold ``.`` and ``/`` (``cv1.W``, ``opt/cv1.W/momentum``, ``opt/step``):
a slash simply becomes a folder inside the ZIP, and ``np.load`` gives the name back unchanged.

Names with a slash are optimizer state and optional as a group: a file with none of the
expected ``opt/...`` names loads without them (the optimizer starts fresh); a file with some of
them must have all. The state a file holds for a parameter the network does not train (`freeze`)
is skipped, so that a frozen network fine-tunes from a file a full run saved.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Mapping
from typing import BinaryIO

import numpy as np

from .errors import DslProgramError
from .files import atomic_output, check_replaceable
from .npzfile import read_npz

__all__ = ["check_names", "check_writable", "is_optimizer_state", "load_npz", "save_npz", "write_npz"]


def is_optimizer_state(name: str) -> bool:
    """Optimizer state lives under names with a slash (``opt/<parameter>/momentum``, ``opt/step``)."""
    return "/" in name


def check_writable(path: str | os.PathLike[str], *, replace_readonly: bool = False) -> None:
    """Whether `save_npz` could write `path` (files.check_replaceable): `run` checks its --save before it
    trains."""
    try:
        check_replaceable(path, replace_readonly=replace_readonly)
    except OSError as e:
        raise DslProgramError(f"cannot write parameter file '{os.fspath(path)}': {e.strerror or e}") from None


def check_names(path: str, arrays: Mapping[str, np.ndarray]) -> None:
    """A name NumPy could not give back (empty, starting or ending with a slash, holding a backslash) is an error."""
    for name in arrays:
        if not name or name.startswith("/") or "\\" in name or name.endswith("/"):
            raise DslProgramError(f"cannot save an array under the name {name!r} in '{path}'")


def write_npz(f: BinaryIO, arrays: Mapping[str, np.ndarray]) -> None:
    """The archive of `arrays` written to the open file `f` (what `save_npz` puts in its temporary file)."""
    with zipfile.ZipFile(f, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, value in arrays.items():
            with zf.open(name + ".npy", "w", force_zip64=True) as entry:
                np.lib.format.write_array(entry, np.asanyarray(value), allow_pickle=False)


def save_npz(path: str | os.PathLike[str], arrays: Mapping[str, np.ndarray], *, replace_readonly: bool = False) -> None:
    """Write `arrays` to `path` (used as given, no suffix added) atomically: only a regular file is replaced, never
    a symbolic link, a read-only file only with `replace_readonly`; the old file's mode is kept (files.py)."""
    path = os.fspath(path)
    check_names(path, arrays)
    check_writable(path, replace_readonly=replace_readonly)
    try:
        with atomic_output(path, replace_readonly=replace_readonly) as f:
            write_npz(f, arrays)
    except OSError as e:
        raise DslProgramError(f"cannot write parameter file '{path}': {e.strerror or e}") from None


def load_npz(
    path: str | os.PathLike[str],
    expected: Mapping[str, tuple[tuple[int, ...], np.dtype]],
    *,
    ignore_optimizer_state: bool = False,
) -> dict[str, np.ndarray]:
    """Read `path` and check it holds exactly the `expected` arrays; returns them in `expected`'s order.

    Every name of `expected` must be present with its shape, except the optimizer state (names
    with a slash), which may be absent as a whole. Any entry the file has beyond `expected` is an
    error, unless it is optimizer state and `ignore_optimizer_state` is set (loading a training
    checkpoint for inference). Arrays are converted to the expected dtype within the same kind
    (float64 -> float32, int32 -> int64); a float where an int is expected, or the reverse, is an error.
    The first problem found (in `expected`'s order, then the file's extra entries) is reported.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise DslProgramError(f"parameter file not found: '{path}'")
    arrays = read_npz(path, "parameter file")
    with_opt = any(is_optimizer_state(n) and n in arrays for n in expected)
    frozen = _stateless_parameters(expected)
    extra = [
        n for n in arrays
        if n not in expected and not (ignore_optimizer_state and is_optimizer_state(n)) and _owner(n) not in frozen
    ]  # fmt: skip
    out: dict[str, np.ndarray] = {}
    for name, (shape, dtype) in expected.items():
        if is_optimizer_state(name) and not with_opt:
            continue
        if name not in arrays:
            what = "optimizer state" if is_optimizer_state(name) else "array"
            raise DslProgramError(f"parameter file '{path}' has no {what} '{name}'")
        value = arrays[name]
        shape = tuple(int(d) for d in shape)
        if value.shape != shape:
            raise DslProgramError(
                f"parameter file '{path}': '{name}' has shape {list(value.shape)}, "
                f"but the network expects {list(shape)}"
            )
        out[name] = _convert(value, np.dtype(dtype), name, path)
    if extra:
        name = extra[0]
        hint = " (saved with a different optimizer?)" if is_optimizer_state(name) else ""
        raise DslProgramError(f"parameter file '{path}' has an entry '{name}' that the network does not have{hint}")
    return out


def _owner(name: str) -> str | None:
    """The parameter whose optimizer state `name` is (`opt/cv1.W/momentum` -> `cv1.W`); None for anything else."""
    if not name.startswith("opt/") or name.count("/") < 2:
        return None
    return name[len("opt/") : name.rindex("/")]


def _stateless_parameters(expected: Mapping[str, object]) -> set[str]:
    """The parameters a network holds but keeps no optimizer state for while it keeps some for others: the frozen
    ones (`freeze`). A file saved before they were frozen holds their state, which loading skips (fine-tuning
    from a full run); a network that keeps no state at all skips nothing, so another optimizer's file is an error."""
    owners = {_owner(n) for n in expected} - {None}
    if not owners:
        return set()
    return {n for n in expected if not is_optimizer_state(n) and n not in owners}


def _kind(dtype: np.dtype) -> str:
    return {"f": "float", "i": "int", "u": "int", "b": "bool"}.get(dtype.kind, dtype.kind)


def _convert(value: np.ndarray, dtype: np.dtype, name: str, path: str) -> np.ndarray:
    if value.dtype == dtype:
        return value
    if _kind(value.dtype) != _kind(dtype):
        raise DslProgramError(f"parameter file '{path}': '{name}' holds {value.dtype}, but the network expects {dtype}")
    return value.astype(dtype)
