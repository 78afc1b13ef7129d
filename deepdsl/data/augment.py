"""Data augmentation of the train block's `augment` on a batch of images ``[n, C, H, W]`` (docs/language.md).

    augment(x, steps, first, seed, train) -> x'

The steps run in the order written. On training batches (`train`): ``crop(size, pad=(ph, pw))`` pads the image with
zeros by ph rows above and below and pw columns left and right and cuts out an H x W window at a random offset
(dy, dx) in ``[0, 2ph] x [0, 2pw]`` (torchvision's ``RandomCrop(size, padding)``); ``flip(p)`` mirrors the image
left to right with probability p (``RandomHorizontalFlip``); ``normalize(mean, std)`` maps channel c to
``(x - mean[c]) / std[c]`` in float32 (``Normalize``). Test and prediction batches get the normalisation only.

The draws of the sample at position q of the run (``q = i·n + k`` for sample k of iteration i: a sample gets new
ones on each visit) come from the SplitMix64 stream seeded with ``seed XOR fnv1a64("augment/" + str(q))``
(deepdsl.initializers), in the order of the steps: crop takes ``dy = next() mod (2ph + 1)`` and then ``dx =
next() mod (2pw + 1)`` (unsigned), flip one ``u = (next() >>> 40) · 2^-24`` and mirrors when ``u < p``. The Java
runtime (Augment.java) does the same, so both give the same batches bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..initializers import splitmix64_array, stream_seed

__all__ = ["augment", "draws"]


def draws(steps: Sequence[tuple[str, Any]]) -> int:
    """How many draws one sample takes."""
    return sum(2 if k == "crop" else 1 if k == "flip" else 0 for k, _ in steps)


def augment(x: np.ndarray, steps: Sequence[tuple[str, Any]], first: int, seed: int, train: bool) -> np.ndarray:
    """`x` ``[n, C, H, W]`` float32 with the `steps` applied (a new array); sample k is at position ``first + k``."""
    if not steps:
        return x
    out = np.array(x, dtype=np.float32, copy=True)
    n, c, h, w = out.shape
    count = draws(steps)
    for k in range(n):
        raw = splitmix64_array(stream_seed(f"augment/{first + k}", seed), count) if train and count else None
        used = 0
        img = out[k]
        for kind, args in steps:
            a = dict(args)
            if kind == "normalize":
                mean = np.array(a["mean"], dtype=np.float32).reshape(c, 1, 1)
                std = np.array(a["std"], dtype=np.float32).reshape(c, 1, 1)
                img = (img - mean) / std
            elif not train:
                continue
            elif kind == "crop":
                assert raw is not None
                ph, pw = a["pad"]
                dy = int(raw[used] % np.uint64(2 * ph + 1))
                dx = int(raw[used + 1] % np.uint64(2 * pw + 1))
                used += 2
                padded = np.zeros((c, h + 2 * ph, w + 2 * pw), dtype=np.float32)
                padded[:, ph : ph + h, pw : pw + w] = img
                img = padded[:, dy : dy + h, dx : dx + w]
            elif kind == "flip":
                assert raw is not None
                u = int(raw[used] >> np.uint64(40)) * 2.0**-24
                used += 1
                if u < a["p"]:
                    img = img[:, :, ::-1]
        out[k] = img
    return out
