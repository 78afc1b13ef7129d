"""``npz("file")``: samples in a NumPy ``.npz`` archive.

The archive holds ``x`` (floats ``[M, ...]``, stored as float32; other float types are converted)
and ``y`` (integers ``[M]``, converted to int64), and optionally both ``x_test`` and ``y_test`` of the
same kinds. Any other entry is an error (it is most likely a misspelt name). Inputs are used as
stored: scale them to [0, 1] before saving.
"""

from __future__ import annotations

import os

import numpy as np

from ..errors import DslProgramError
from ..npzfile import read_npz

__all__ = ["NAMES", "load_npz_data"]

NAMES = ("x", "y", "x_test", "y_test")


def _xy(arrays: dict[str, np.ndarray], xn: str, yn: str, path: str) -> tuple[np.ndarray, np.ndarray]:
    x, y = arrays[xn], arrays[yn]
    if x.dtype.kind != "f":
        raise DslProgramError(
            f"npz file '{path}': '{xn}' must hold floats (float32), found {x.dtype}; "
            "scale inputs to [0, 1] and save as float32"
        )
    if x.ndim < 1:
        raise DslProgramError(f"npz file '{path}': '{xn}' must have a sample dimension [M, ...], found a scalar")
    if y.dtype.kind not in "iu":
        raise DslProgramError(f"npz file '{path}': '{yn}' must hold integer labels, found {y.dtype}")
    if y.ndim != 1:
        raise DslProgramError(f"npz file '{path}': '{yn}' must be one-dimensional [M], found shape {list(y.shape)}")
    if len(x) != len(y):
        raise DslProgramError(f"npz file '{path}': '{xn}' holds {len(x)} samples but '{yn}' holds {len(y)} labels")
    if y.dtype.kind == "u" and y.size and int(y.max()) > np.iinfo(np.int64).max:
        raise DslProgramError(f"npz file '{path}': '{yn}' holds a label too large for int64")
    return np.ascontiguousarray(x, dtype=np.float32), y.astype(np.int64)


def load_npz_data(path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """``(x_train, y_train, x_test, y_test)`` from FILE; the test pair is None when absent."""
    if not os.path.isfile(path):
        raise DslProgramError(f"npz data file not found: '{path}'")
    arrays = read_npz(path, "npz data file")
    extra = [n for n in arrays if n not in NAMES]
    if extra:
        raise DslProgramError(
            f"npz file '{path}' has an unexpected array '{extra[0]}' (expected x, y, and optionally x_test, y_test)"
        )
    for name in ("x", "y"):
        if name not in arrays:
            raise DslProgramError(f"npz file '{path}' has no array '{name}' (it needs x and y)")
    if ("x_test" in arrays) != ("y_test" in arrays):
        have, miss = ("x_test", "y_test") if "x_test" in arrays else ("y_test", "x_test")
        raise DslProgramError(f"npz file '{path}' has '{have}' but no '{miss}'")
    x, y = _xy(arrays, "x", "y", path)
    if "x_test" in arrays:
        xt, yt = _xy(arrays, "x_test", "y_test", path)
        if xt.shape[1:] != x.shape[1:]:
            raise DslProgramError(
                f"npz file '{path}': 'x_test' has per-sample shape {list(xt.shape[1:])} but 'x' has {list(x.shape[1:])}"
            )
        return x, y, xt, yt
    return x, y, None, None
