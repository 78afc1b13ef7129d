"""``text("file")`` / ``--data text:FILE``: a text file as character tokens with next-token targets.

The file is read as UTF-8 (a byte order mark at the start is dropped; a file that is not UTF-8 is an error). Its
vocabulary is the set of distinct characters (Unicode code points), sorted by code point; a character's id is its
rank there, so the ids depend only on the file and lie in ``[0, V_file)``. The first ``L - L // 10`` characters of
the L are the training text, the last ``L // 10`` the test text (no test set when that holds no full sample).

With T tokens per sample, a text of S characters gives ``(S - 1) // T`` samples, sample j being the ids of the
characters ``[j·T, j·T + T)`` (the input) and of ``[j·T + 1, j·T + T + 1)`` (the target: each position's next
character), without overlap, in file order.

The network takes it through one integer input ``input tokens : [N, T] int vocab V`` and one label
``label next : [N, T] classes V`` (any names; per-sample shape ``[T]`` for both); the file's vocabulary must fit
both (``V_file <= V``). The Java runtime (``DataFiles.text``) reads the same file the same way.
"""

from __future__ import annotations

import os

import numpy as np

from ..errors import DslProgramError

__all__ = ["MAX_BYTES", "read_text_ids", "text_samples"]

MAX_BYTES = 2**28  # 256 MiB: a larger text file is refused before it is read (reading takes ~12 bytes a byte)


def read_text_ids(path: str) -> tuple[np.ndarray, int]:
    """The characters of `path` as ids (int64) and the size of the file's vocabulary."""
    if not isinstance(path, str) or not path:
        raise DslProgramError('text() needs a file name as a string, e.g. text("data/input.txt")')
    if not os.path.isfile(path):
        raise DslProgramError(f"text data file not found: '{path}'")
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_BYTES:
                raise DslProgramError(f"text data file '{path}' is {size} bytes, more than deepdsl reads ({MAX_BYTES})")
            raw = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise DslProgramError(f"cannot read text data file '{path}': {e.strerror or e}") from None
    if len(raw) > MAX_BYTES:  # (a file that grew while it was read)
        raise DslProgramError(f"text data file '{path}' is more than deepdsl reads ({MAX_BYTES} bytes)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise DslProgramError(f"text data file '{path}' is not UTF-8 text") from None
    del raw
    if text.startswith("\ufeff"):
        text = text[1:]
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    del text
    vocab = np.unique(codes)  # (a rank by searchsorted: some 12 bytes a character at the peak, not 50)
    return np.searchsorted(vocab, codes).astype(np.int64, copy=False), len(vocab)


def _windows(ids: np.ndarray, t: int) -> tuple[np.ndarray, np.ndarray]:
    m = (len(ids) - 1) // t
    return ids[: m * t].reshape(m, t), ids[1 : m * t + 1].reshape(m, t)


def text_samples(path: str, t: int, vocab: int, describe: str) -> tuple[tuple[np.ndarray, np.ndarray], tuple | None]:
    """((inputs, targets) of training, (inputs, targets) of test or None), each int64 ``[M, T]``."""
    ids, v_file = read_text_ids(path)
    if v_file > vocab:
        raise DslProgramError(
            f"text data file '{path}' has {v_file} distinct characters, more than the {vocab} of the network's "
            f"{describe}"
        )
    test_len = len(ids) // 10
    train = ids[: len(ids) - test_len]
    if len(train) < t + 1:
        raise DslProgramError(
            f"text data file '{path}' has {len(ids)} characters: its training part ({len(train)}) is too short for "
            f"one sample of {t} tokens and its target (at least {t + 1} characters)"
        )
    test = _windows(ids[len(train) :], t) if test_len >= t + 1 else None
    return _windows(train, t), test
