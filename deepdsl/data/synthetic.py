"""``synthetic(seed)``: deterministic random inputs whose labels a network can learn.

Each class k has a fixed random pattern (its prototype); a sample of class k is its prototype
plus as much uniform noise, so the label is a learnable function of the input, and one that
generalises to the test samples: a linear classifier, a LeNet or an MLP reaches a high test
accuracy after a few hundred steps. With D elements per sample and K classes, all exact
integer steps that any language reproduces bit for bit:

- Sizes: 1024 training and 256 test samples, or 256 and 64 when D > 65536 (ImageNet-sized
  inputs); when those would take more than 512 MiB (2^29 bytes) of float32, M = max(2, 2^29 // (4·D))
  samples, ``M // 5`` (at least 1) of them test samples, the rest training samples. Samples are numbered 0, 1, ... over
  the training samples and then the test samples.
- Labels: ``y_j = next() mod K`` (unsigned) for sample j, from the SplitMix64 stream seeded with
  ``seed XOR fnv1a64("synthetic/y")`` (see `deepdsl.initializers`).
- Prototypes: ``P[k, t] = next() >>> 40`` (24 bits) is draw ``k·D + t`` of the stream seeded with
  ``seed XOR fnv1a64("synthetic/prototype")``, for element t (flat C index) of class k.
- Noise: ``N[j, t] = next() >>> 40`` is draw ``j·D + t`` of the stream seeded with
  ``seed XOR fnv1a64("synthetic/x")``.
- Input: ``x[j, t] = ((N[j, t] >>> 1) + (P[y_j, t] >>> 1) - 2^23) · 2^-24``, a float32 in [-0.5, 0.5) (exact):
  centred, as normalised images are, so that the reference networks train with their own learning rates.

A network's further inputs are regression targets, each a fixed linear function of the first (`make_target`).
"""

from __future__ import annotations

import math

import numpy as np

from ..initializers import splitmix64_array, stream_seed

__all__ = ["make_synthetic", "make_target", "synthetic_sizes"]

_BIG = 65536
MAX_BYTES = 2**29  # the data set's float32 samples, training and test together (at least one of each)


def synthetic_sizes(d: int) -> tuple[int, int]:
    """(training, test) sample counts for D elements per sample, at most MAX_BYTES of them together."""
    n_train, n_test = (1024, 256) if d <= _BIG else (256, 64)
    most = max(2, MAX_BYTES // (4 * max(d, 1)))
    if n_train + n_test > most:
        n_test = max(1, most // 5)
        n_train = most - n_test
    return n_train, n_test


def _bits24(seed: int, count: int, start: int) -> np.ndarray:
    return (splitmix64_array(seed, count, start) >> np.uint64(40)).astype(np.int64)


def make_synthetic(x_shape: tuple[int, ...], classes: int, seed: int):  # noqa: ANN201 — a Dataset
    """The synthetic data set for `x_shape` per sample and `classes` classes (see the module docstring)."""
    from . import Dataset

    d = math.prod(x_shape)
    n_train, n_test = synthetic_sizes(d)
    total = n_train + n_test
    y = (splitmix64_array(stream_seed("synthetic/y", seed), total) % np.uint64(classes)).astype(np.int64)
    noise_seed = stream_seed("synthetic/x", seed)
    proto_seed = stream_seed("synthetic/prototype", seed)
    x = np.empty((total, d), dtype=np.float32)
    chunk = max(1, (1 << 21) // max(d, 1))
    for lo in range(0, total, chunk):
        hi = min(total, lo + chunk)
        m = _bits24(noise_seed, (hi - lo) * d, lo * d).reshape(hi - lo, d) >> 1
        for k in np.unique(y[lo:hi]).tolist():
            rows = np.flatnonzero(y[lo:hi] == k)
            m[rows] += _bits24(proto_seed, d, k * d) >> 1
        x[lo:hi] = (m - (1 << 23)) * 2.0**-24
    x = x.reshape((total, *x_shape))
    return Dataset(x[:n_train], y[:n_train], x[n_train:], y[n_train:])


def make_target(x: np.ndarray, name: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """A regression target `name` of per-sample `shape` for synthetic inputs `x` ``[M, ...]``: a fixed linear
    function of each sample, so a network with a linear layer can learn it exactly, reproducible bit for bit.

    With the input's D elements as the exact integers ``X[j, t] = x[j, t] · 2^24`` and U elements per target,
    ``S[u, t] = 1 - 2·(next() >>> 63)`` (a sign) is draw ``u·D + t`` of the stream seeded with
    ``seed XOR fnv1a64("synthetic/target/" + name)``, and ``target[j, u] = float32((Σ_t X[j, t]·S[u, t]) ·
    2^-(24 + k))`` with ``k = bit_length(D) // 2`` (about 1/√D, so targets are of the inputs' size); the sum is an
    exact integer (below 2^53), rounded to float32 once.
    """
    m = len(x)
    d = math.prod(x.shape[1:])
    u = math.prod(shape)
    xs = x.reshape(m, d).astype(np.float64) * 2.0**24
    stream = stream_seed(f"synthetic/target/{name}", seed)
    scale = 2.0 ** -(24 + d.bit_length() // 2)
    out = np.empty((m, u), dtype=np.float32)
    chunk = max(1, (1 << 21) // max(d, 1))
    for lo in range(0, u, chunk):
        hi = min(u, lo + chunk)
        signs = 1.0 - 2.0 * (splitmix64_array(stream, (hi - lo) * d, lo * d) >> np.uint64(63)).astype(np.float64)
        out[:, lo:hi] = (xs @ signs.reshape(hi - lo, d).T) * scale  # every partial sum an integer below 2^53: exact
    return out.reshape((m, *shape))
