"""Numeric CSV files (`csv("file.csv")`, `--data csv:FILE`): columns bound to a network's inputs and labels by name.

    load_csv(path, fields) -> Samples

The first line is a header naming the columns. A field (an `input` or `label`) of one value per sample (``[N]``, or
``[N, 1]``) takes the column of its own name (``y``, ``t``); a field of S > 1 values per sample (``x : [N, 4]``,
``[N, 3, 2]``) the columns ``x0`` ... ``x{S-1}``, its values in C order. Every field needs its columns, and a column
that names no field is an error (as an npz array is). Columns may come in any order. Every other line is one sample:
as many values as the header has names, separated by commas, each a decimal number (``-1``, ``2.5``, ``.5``,
``3e-2``; spaces and tabs around it are ignored; no quotes, no NaN or infinity); an input's values become float32
(rounded from the double the text denotes, a value beyond float32's range is an error), a label's (or a token
input's) must be integers in ``[0, K)``. Blank lines are skipped; line numbers in errors count every line of the
file. The file is UTF-8 (a byte order mark is dropped), lines end in ``\\n`` or ``\\r\\n``, and it may hold at most
`MAX_BYTES` bytes.

The test set is the file of the same name with ``_test`` before its extension (``iris.csv`` -> ``iris_test.csv``)
in the same folder, when it exists. The Java runtime's CsvData.java reads both the same way, to the same values.
"""

from __future__ import annotations

import math
import os
import re

import numpy as np

from ..errors import DslProgramError

__all__ = ["MAX_BYTES", "column_names", "load_csv", "test_file"]

MAX_BYTES = 1 << 28  # 256 MiB, as the text source
NUMBER = re.compile(r"[+-]?([0-9]+[.]?[0-9]*|[.][0-9]+)([eE][+-]?[0-9]+)?")
INTEGER = re.compile(r"[+-]?[0-9]+")
_BLANK = " \t\r"


def test_file(path: str) -> str:
    """The test set's file beside `path`: ``_test`` before the extension."""
    head, tail = os.path.split(path)
    stem, dot, ext = tail.rpartition(".")
    name = f"{stem}_test.{ext}" if dot and stem else f"{tail}_test"
    return os.path.join(head, name)


def column_names(name: str, size: int) -> list[str]:
    """The columns of a field `name` of `size` values per sample."""
    return [name] if size == 1 else [f"{name}{k}" for k in range(size)]


def load_csv(
    path: object, fields: tuple, other_columns: bool = False
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray] | None]:
    """The training (and test) arrays of every field from the CSV file `path` (module docstring); with
    `other_columns`, columns that name no field are ignored (`deepdsl predict` reads the inputs of a file that also
    holds labels)."""
    if not isinstance(path, str) or not path:
        raise DslProgramError('csv() needs a file name as a string, e.g. csv("data/train.csv")')
    if not os.path.isfile(path):
        raise DslProgramError(f"csv data file not found: '{path}'")
    train = _read(path, fields, other_columns)
    test = test_file(path)
    return train, (_read(test, fields, other_columns) if os.path.isfile(test) else None)


def _read(path: str, fields: tuple, other_columns: bool) -> dict[str, np.ndarray]:
    size = os.path.getsize(path)
    if size > MAX_BYTES:
        raise DslProgramError(f"csv file '{path}' is larger than {MAX_BYTES} bytes ({size:,} bytes)")
    with open(path, "rb") as f:
        raw = f.read(MAX_BYTES + 1)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DslProgramError(f"csv file '{path}' is not UTF-8 text (byte {err.start})") from None
    text = text.removeprefix("\ufeff")
    lines = text.split("\n")
    header_at = next((k for k, line in enumerate(lines) if line.strip(_BLANK)), None)
    if header_at is None:
        raise DslProgramError(f"csv file '{path}' holds no header (a first line naming the columns)")
    header = [c.strip(_BLANK) for c in lines[header_at].split(",")]
    where: dict[str, int] = {}
    for k, name in enumerate(header):
        if not name:
            raise DslProgramError(f"csv file '{path}': column {k + 1} of the header has no name")
        if name in where:
            raise DslProgramError(f"csv file '{path}' names the column '{name}' twice")
        where[name] = k
    columns: list[tuple[object, list[int]]] = []  # (field, the header positions of its values)
    taken: set[str] = set()
    for f in fields:
        names = column_names(f.name, math.prod(f.shape))
        for n in names:
            if n not in where:
                raise DslProgramError(f"csv file '{path}' has no column '{n}' for the network's {f.describe()}")
        taken.update(names)
        columns.append((f, [where[n] for n in names]))
    for name in header:
        if name not in taken and not other_columns:
            raise DslProgramError(f"csv file '{path}' has a column '{name}' that names no input or label of the "
                                  f"network (it takes {', '.join(f.describe() for f in fields)})")  # fmt: skip
    rows: list[list[str]] = []
    numbers: list[int] = []
    for k in range(header_at + 1, len(lines)):
        line = lines[k]
        if not line.strip(_BLANK):
            continue
        cells = [c.strip(_BLANK) for c in line.split(",")]
        if len(cells) != len(header):
            raise DslProgramError(f"csv file '{path}', line {k + 1}: {len(cells)} values, but the header names "
                                  f"{len(header)} columns")  # fmt: skip
        rows.append(cells)
        numbers.append(k + 1)
    if not rows:
        raise DslProgramError(f"csv file '{path}' holds no rows (only its header)")
    out: dict[str, np.ndarray] = {}
    for f, at in columns:
        integer = f.kind == "label" or f.tokens
        values = np.empty((len(rows), len(at)), dtype=np.int64 if integer else np.float32)
        for r, cells in enumerate(rows):
            for j, c in enumerate(at):
                values[r, j] = _value(cells[c], f, integer, path, numbers[r], header[c])
        out[f.name] = values.reshape((len(rows), *f.shape))
    return out


def _value(cell: str, f: object, integer: bool, path: str, line: int, column: str) -> float | int:
    here = f"csv file '{path}', line {line}, column '{column}'"
    if integer:
        if not INTEGER.fullmatch(cell):
            what = "an integer" if NUMBER.fullmatch(cell) else "a number"
            raise DslProgramError(f"{here}: '{cell}' is not {what}")
        v = int(cell) if len(cell.lstrip("+-")) <= 18 else -1  # longer: beyond any class count (and a long)
        classes = f.classes  # type: ignore[attr-defined]
        if not 0 <= v < classes:
            raise DslProgramError(f"csv file '{path}': label {cell} on line {line} is outside [0, {classes}) "
                                  f"(the network's {f.describe()})")  # type: ignore[attr-defined]  # fmt: skip
        return v
    if not NUMBER.fullmatch(cell):
        raise DslProgramError(f"{here}: '{cell}' is not a number")
    x = float(cell)
    with np.errstate(over="ignore"):
        rounded = np.float32(x)  # as the Java runtime's (float) of the double: infinite beyond float32's range
    if not math.isfinite(x) or np.isinf(rounded):
        raise DslProgramError(f"{here}: '{cell}' is too large for a float32")
    return x
