"""``mnist("dir")``: the standard IDX files, plain or gzip-compressed.

DIR holds ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte`` and, optionally (both or
neither), ``t10k-images-idx3-ubyte``, ``t10k-labels-idx1-ubyte``; each may instead carry a
``.gz`` suffix (the plain file wins when both exist). Image files start with the big-endian
int32s ``2051, n, rows, cols``, label files with ``2049, n``; then one unsigned byte per pixel or
label. Pixels become float32 ``byte / 255`` (a float32 division) in ``[n, 1, rows, cols]``.
"""

from __future__ import annotations

import gzip
import math
import os
import zlib
from collections.abc import Callable

import numpy as np

from ..errors import DslProgramError
from ..npzfile import MAX_INFLATE_RATIO, MIN_INFLATE_LIMIT, inflate_limit
from .download import get_it

__all__ = ["IMAGE_MAGIC", "LABEL_MAGIC", "load_mnist", "read_idx_images", "read_idx_labels"]

IMAGE_MAGIC = 2051
LABEL_MAGIC = 2049


def _find(directory: str, name: str) -> str | None:
    for candidate in (name, name + ".gz"):
        path = os.path.join(directory, candidate)
        if os.path.isfile(path):
            return path
    return None


MAX_BYTES = 2**31 - 9  # the most pixels one Java array (the runtime's) holds; a header promising more is refused
_CHUNK = 1 << 20


def _read_idx(
    path: str, magic: int, words: int, what: str, describe: Callable[[list[int]], str]
) -> tuple[list[int], bytes]:
    """The header's int32s and the data bytes of an IDX file; reading (and decompressing) stops at the size its
    header promises, so a small gzip file that inflates to gigabytes is refused after one byte too many."""
    try:
        with gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb") as f:
            head = f.read(4 * words)
            if len(head) < 4 * words:
                raise DslProgramError(f"MNIST file '{path}' is truncated: {len(head)} bytes, shorter than its header")
            header = [int.from_bytes(head[4 * k : 4 * k + 4], "big") for k in range(words)]
            if header[0] != magic:
                raise DslProgramError(
                    f"MNIST file '{path}' has magic number {header[0]}, but an IDX {what} file starts with {magic}"
                )
            for count in header[1:]:
                if count >= 2**31:
                    raise DslProgramError(f"MNIST file '{path}' has an impossible count {count} in its header")
            size, described = math.prod(header[1:]), describe(header)
            if size > MAX_BYTES:
                raise DslProgramError(
                    f"MNIST file '{path}' promises {described} ({size} bytes), more than deepdsl reads ({MAX_BYTES})"
                )
            _check_size(path, 4 * words, size, described)
            data = bytearray()
            while len(data) < size:
                chunk = f.read(min(_CHUNK, size - len(data)))
                if not chunk:
                    break
                data += chunk
            if len(data) < size:
                raise DslProgramError(
                    f"MNIST file '{path}' is truncated: its header promises {described} ({size} bytes of data), "
                    f"but only {len(data)} bytes follow the header"
                )
            if f.read(1):
                extra = os.path.getsize(path) - 4 * words - size if not path.endswith(".gz") else None
                amount = f"{extra} bytes" if extra is not None else "more data"
                raise DslProgramError(f"MNIST file '{path}' has {amount} after the {described} its header describes")
            return header, bytes(data)
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise DslProgramError(f"cannot decompress MNIST file '{path}' (damaged or truncated gzip: {e})") from None
    except OSError as e:
        raise DslProgramError(f"cannot read MNIST file '{path}': {e.strerror or e}") from None


def _check_size(path: str, head: int, size: int, described: str) -> None:
    """Before reading: a plain file holds the bytes its header promises; a gzip file promises at most what
    deepdsl inflates from a file of its size (npzfile.inflate_limit: 16 times, at least 64 MiB)."""
    on_disk = os.path.getsize(path)
    if path.endswith(".gz"):
        if head + size > inflate_limit(on_disk):
            raise DslProgramError(
                f"MNIST file '{path}' promises {described} ({size} bytes), more than deepdsl inflates from a gzip "
                f"file of {on_disk} bytes ({MAX_INFLATE_RATIO} times its size, at least {MIN_INFLATE_LIMIT >> 20} MiB)"
            )
    elif on_disk - head < size:
        raise DslProgramError(
            f"MNIST file '{path}' is truncated: its header promises {described} ({size} bytes of data), "
            f"but only {on_disk - head} bytes follow the header"
        )


def read_idx_images(path: str) -> np.ndarray:
    """An IDX image file as float32 ``[n, 1, rows, cols]`` in [0, 1]."""
    (_, n, rows, cols), data = _read_idx(path, IMAGE_MAGIC, 4, "image", lambda h: f"{h[1]} images of {h[2]}x{h[3]}")
    pixels = np.frombuffer(data, dtype=np.uint8)
    return (pixels.astype(np.float32) / np.float32(255)).reshape(n, 1, rows, cols)


def read_idx_labels(path: str) -> np.ndarray:
    """An IDX label file as int64 ``[n]``."""
    _, data = _read_idx(path, LABEL_MAGIC, 2, "label", lambda h: f"{h[1]} labels")
    return np.frombuffer(data, dtype=np.uint8).astype(np.int64)


def _pair(directory: str, prefix: str, required: bool):  # noqa: ANN202
    names = (f"{prefix}-images-idx3-ubyte", f"{prefix}-labels-idx1-ubyte")
    paths = [_find(directory, name) for name in names]
    if not required and paths == [None, None]:
        return None, None
    for name, path in zip(names, paths):
        if path is None:
            looked = os.path.join(directory, name)
            raise DslProgramError(
                f"MNIST file not found: looked for '{looked}' and '{looked}.gz'; {get_it('mnist', directory)}"
            )
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
        raise DslProgramError(f"MNIST directory not found: '{directory}'; {get_it('mnist', directory)}")
    x, y = _pair(directory, "train", required=True)
    xt, yt = _pair(directory, "t10k", required=False)
    return x, y, xt, yt
