"""``cifar10("dir")``: the binary version of CIFAR-10.

DIR (or its subfolder ``cifar-10-batches-bin``, as the archive unpacks) holds
``data_batch_1.bin`` .. ``data_batch_5.bin`` (all five, concatenated in that order, form the
training set) and optionally ``test_batch.bin``. Each file is a sequence of 3073-byte records: one
label byte, then 3072 pixel bytes (the red, green and blue 32x32 planes, row-major). Pixels become
float32 ``byte / 255`` (a float32 division) in ``[n, 3, 32, 32]``.
"""

from __future__ import annotations

import os

import numpy as np

from ..errors import DslProgramError
from .download import get_it

__all__ = ["MAX_RECORDS", "RECORD", "TEST_FILE", "TRAIN_FILES", "load_cifar10", "read_cifar_batch"]

RECORD = 1 + 3 * 32 * 32
TRAIN_FILES = tuple(f"data_batch_{k}.bin" for k in range(1, 6))
TEST_FILE = "test_batch.bin"


MAX_RECORDS = (2**31 - 9) // (RECORD - 1)  # 699,050: the most whose pixels one Java array (the runtime's) holds


def _check_records(paths: list[str]) -> None:
    """Before reading: the files hold at most MAX_RECORDS records together (their sizes say how many)."""
    total = 0
    for path in paths:
        try:
            total += os.path.getsize(path) // RECORD
        except OSError as e:
            raise DslProgramError(f"cannot read CIFAR-10 file '{path}': {e.strerror or e}") from None
        if total > MAX_RECORDS:
            raise DslProgramError(
                f"CIFAR-10 file '{path}' brings the data to {total} or more records of {RECORD} bytes, more than "
                f"deepdsl reads ({MAX_RECORDS}: {MAX_RECORDS * (RECORD - 1)} pixels)"
            )


def read_cifar_batch(path: str) -> tuple[np.ndarray, np.ndarray]:
    """One binary batch file as ``(x float32 [n, 3, 32, 32], y int64 [n])``."""
    _check_records([path])
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise DslProgramError(f"cannot read CIFAR-10 file '{path}': {e.strerror or e}") from None
    if not data:
        raise DslProgramError(f"CIFAR-10 file '{path}' is empty")
    if len(data) % RECORD:
        raise DslProgramError(
            f"CIFAR-10 file '{path}' is truncated: {len(data)} bytes is not a whole number of "
            f"{RECORD}-byte records ({len(data) // RECORD} whole records and {len(data) % RECORD} bytes over)"
        )
    records = np.frombuffer(data, dtype=np.uint8).reshape(-1, RECORD)
    y = records[:, 0].astype(np.int64)
    x = (records[:, 1:].astype(np.float32) / np.float32(255)).reshape(-1, 3, 32, 32)
    return x, y


def _locate(directory: str) -> str:
    if not os.path.isdir(directory):
        raise DslProgramError(f"CIFAR-10 directory not found: '{directory}'; {get_it('cifar10', directory)}")
    nested = os.path.join(directory, "cifar-10-batches-bin")
    if not os.path.isfile(os.path.join(directory, TRAIN_FILES[0])) and os.path.isdir(nested):
        return nested
    return directory


def load_cifar10(directory: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """``(x_train, y_train, x_test, y_test)`` from DIR; the test pair is None without ``test_batch.bin``."""
    base = _locate(directory)
    xs, ys = [], []
    for name in TRAIN_FILES:
        path = os.path.join(base, name)
        if not os.path.isfile(path):
            raise DslProgramError(
                f"CIFAR-10 file not found: '{path}' (the binary version has {', '.join(TRAIN_FILES)}); "
                f"{get_it('cifar10', directory)}"
            )
    _check_records([os.path.join(base, name) for name in TRAIN_FILES])
    for name in TRAIN_FILES:
        x, y = read_cifar_batch(os.path.join(base, name))
        xs.append(x)
        ys.append(y)
    test = os.path.join(base, TEST_FILE)
    xt, yt = read_cifar_batch(test) if os.path.isfile(test) else (None, None)
    return np.concatenate(xs), np.concatenate(ys), xt, yt
