"""``mnist("dir")``: the standard IDX files, plain or gzip-compressed.

DIR holds ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte`` and, optionally (both or
neither), ``t10k-images-idx3-ubyte``, ``t10k-labels-idx1-ubyte``; each may instead carry a
``.gz`` suffix (the plain file wins when both exist). Image files start with the big-endian
int32s ``2051, n, rows, cols``, label files with ``2049, n``; then one unsigned byte per pixel or
label. Pixels become float32 ``byte / 255`` (a float32 division) in ``[n, 1, rows, cols]``.
"""

from __future__ import annotations

import gzip
import os
import zlib

import numpy as np

from ..errors import DslProgramError

__all__ = ["IMAGE_MAGIC", "LABEL_MAGIC", "load_mnist", "read_idx_images", "read_idx_labels"]

IMAGE_MAGIC = 2051
LABEL_MAGIC = 2049


def _find(directory: str, name: str) -> str | None:
    for candidate in (name, name + ".gz"):
        path = os.path.join(directory, candidate)
        if os.path.isfile(path):
            return path
    return None


def _read_bytes(path: str) -> bytes:
    try:
        if path.endswith(".gz"):
            with gzip.open(path, "rb") as f:
                return f.read()
        with open(path, "rb") as f:
            return f.read()
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise DslProgramError(f"cannot decompress MNIST file '{path}' (damaged or truncated gzip: {e})") from None
    except OSError as e:
        raise DslProgramError(f"cannot read MNIST file '{path}': {e.strerror or e}") from None


def _header(data: bytes, path: str, magic: int, words: int, what: str) -> list[int]:
    if len(data) < 4 * words:
        raise DslProgramError(f"MNIST file '{path}' is truncated: {len(data)} bytes, shorter than its header")
    header = [int.from_bytes(data[4 * k : 4 * k + 4], "big") for k in range(words)]
    if header[0] != magic:
        raise DslProgramError(
            f"MNIST file '{path}' has magic number {header[0]}, but an IDX {what} file starts with {magic}"
        )
    return header


def _body(data: bytes, path: str, offset: int, size: int, what: str) -> np.ndarray:
    found = len(data) - offset
    if found < size:
        raise DslProgramError(
            f"MNIST file '{path}' is truncated: its header promises {what} ({size} bytes of data), "
            f"but only {found} bytes follow the header"
        )
    if found > size:
        raise DslProgramError(f"MNIST file '{path}' has {found - size} bytes after the {what} its header describes")
    return np.frombuffer(data, dtype=np.uint8, count=size, offset=offset)


def read_idx_images(path: str) -> np.ndarray:
    """An IDX image file as float32 ``[n, 1, rows, cols]`` in [0, 1]."""
    data = _read_bytes(path)
    _, n, rows, cols = _header(data, path, IMAGE_MAGIC, 4, "image")
    pixels = _body(data, path, 16, n * rows * cols, f"{n} images of {rows}x{cols}")
    return (pixels.astype(np.float32) / np.float32(255)).reshape(n, 1, rows, cols)


def read_idx_labels(path: str) -> np.ndarray:
    """An IDX label file as int64 ``[n]``."""
    data = _read_bytes(path)
    _, n = _header(data, path, LABEL_MAGIC, 2, "label")
    return _body(data, path, 8, n, f"{n} labels").astype(np.int64)


def _pair(directory: str, prefix: str, required: bool):  # noqa: ANN202
    names = (f"{prefix}-images-idx3-ubyte", f"{prefix}-labels-idx1-ubyte")
    paths = [_find(directory, name) for name in names]
    if not required and paths == [None, None]:
        return None, None
    for name, path in zip(names, paths):
        if path is None:
            looked = os.path.join(directory, name)
            raise DslProgramError(f"MNIST file not found: looked for '{looked}' and '{looked}.gz'")
    x = read_idx_images(paths[0])
    y = read_idx_labels(paths[1])
    if len(x) != len(y):
        raise DslProgramError(
            f"MNIST files disagree: '{paths[0]}' holds {len(x)} images but '{paths[1]}' holds {len(y)} labels"
        )
    return x, y


def load_mnist(directory: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """``(x_train, y_train, x_test, y_test)`` from DIR; the test pair is None when DIR has no t10k files."""
    if not os.path.isdir(directory):
        raise DslProgramError(f"MNIST directory not found: '{directory}'")
    x, y = _pair(directory, "train", required=True)
    xt, yt = _pair(directory, "t10k", required=False)
    return x, y, xt, yt
