"""Training data: the four sources of DESIGN.md 2.4 and the `--data` flag of DESIGN.md 9.

    load_data(kind, args, x_shape, y_classes, seed) -> Dataset
    parse_data_flag("mnist:DIR" | "cifar10:DIR" | "npz:FILE" | "text:FILE" | "synthetic[:SEED]") -> (kind, args)

`args` holds the source's arguments as the train block gives them: ``synthetic(seed=1)`` ->
``{"seed": 1}``, ``mnist("dir")`` -> ``{"dir": "dir"}``, ``cifar10("dir")`` -> ``{"dir": ...}``,
``npz("file")`` -> ``{"file": ...}`` (a positional argument may also come under the key ``0``). Here an npz
file holds the arrays ``x`` and ``y`` (``x_test``, ``y_test``); `named.load_samples` binds a network's inputs and
labels by their own names. Relative paths are used as given (relative to the working directory; the front end has
already made a train block's relative to its .ddsl file).

`x_shape` is the network input's *per-sample* shape (its shape without the leading batch
dimension), `y_classes` the number of classes K. Every sample must have exactly that shape, with
one allowance: when the network takes flat vectors ``[D]`` and the samples have D elements in
another shape (an MLP on MNIST), they are flattened in C order. Labels must lie in [0, K).
`seed` is the program's seed; ``synthetic`` uses it when its own ``seed`` argument is absent.

Every failure (missing file, bad header, truncated file, shape or label disagreement) raises
`DslProgramError` with a message that names the file and the numbers involved.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import DslProgramError, did_you_mean
from ..initializers import MASK64, splitmix64_array, stream_seed

__all__ = [
    "KINDS", "Dataset", "fit_shape", "load_data", "parse_data_flag", "sample_indices", "shuffle_permutation",
    "source_argument",
]  # fmt: skip

#: data source -> the name of its one argument
KINDS = {"synthetic": "seed", "mnist": "dir", "cifar10": "dir", "npz": "file", "text": "file", "images": "dir",
         "csv": "file"}  # fmt: skip
SOURCES = "synthetic, mnist:DIR, cifar10:DIR, npz:FILE, text:FILE, images:DIR or csv:FILE"


def shuffle_permutation(m: int, epoch: int, shuffle_seed: int) -> np.ndarray:
    """The sample order of `epoch` (0, 1, ...) under shuffling: a Fisher–Yates permutation of 0..m-1.

    The draws come from the SplitMix64 stream seeded with
    ``shuffle_seed XOR fnv1a64("shuffle/" + str(epoch))`` (see `deepdsl.initializers`). Starting
    from the identity, for ``j = m-1`` down to ``1`` (draw number ``k = m-1-j``):
    ``r = next() mod (j+1)`` (unsigned), then swap ``perm[j]`` and ``perm[r]``. The modulo bias
    (below m / 2^64) is ignored, as every implementation must do the same.
    """
    perm = list(range(m))
    if m > 1:
        raw = splitmix64_array(stream_seed(f"shuffle/{epoch}", shuffle_seed), m - 1)
        rs = (raw % np.arange(m, 1, -1, dtype=np.uint64)).tolist()
        for k, r in enumerate(rs):
            j = m - 1 - k
            perm[j], perm[r] = perm[r], perm[j]
    return np.array(perm, dtype=np.int64)


@dataclass(frozen=True, eq=False)
class Dataset:
    """Training (and optionally test) samples: x float32 ``[M, ...]``, y int64 ``[M]``."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray | None = None
    y_test: np.ndarray | None = None
    _perms: dict[tuple[int, int], np.ndarray] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        pairs = [("train", self.x_train, self.y_train)]
        if self.x_test is not None or self.y_test is not None:
            if self.x_test is None or self.y_test is None:
                raise DslProgramError("test data needs both inputs and labels")
            pairs.append(("test", self.x_test, self.y_test))
        for what, x, y in pairs:
            if x.dtype != np.float32 or y.dtype != np.int64 or y.ndim != 1 or len(x) != len(y):
                raise DslProgramError(
                    f"{what} data must be x float32 [M, ...] and y int64 [M]; "
                    f"got x {x.dtype} {list(x.shape)} and y {y.dtype} {list(y.shape)}"
                )
        if len(self.x_train) == 0:
            raise DslProgramError("the training data holds no samples")
        if self.x_test is not None and len(self.x_test) == 0:
            raise DslProgramError("the test data holds no samples (leave x_test and y_test out for none)")

    @property
    def size(self) -> int:
        """M, the number of training samples."""
        return len(self.x_train)

    def batch(self, i: int, n: int, shuffle_seed: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The training samples of iteration `i` with batch size `n`: positions ``[i·n, (i+1)·n)``.

        Position p is sample ``p mod M`` in file order, wrapping around the end. With a
        `shuffle_seed`, position p falls in epoch ``e = p div M`` and is sample
        ``shuffle_permutation(M, e, shuffle_seed)[p mod M]``: every epoch visits each sample once,
        in its own order. Returns copies ``(x [n, ...], y [n])``.
        """
        idx = sample_indices(i, n, self.size, shuffle_seed, self._perms)
        return self.x_train[idx], self.y_train[idx]


def sample_indices(
    i: int, n: int, m: int, shuffle_seed: int | None, perms: dict[tuple[int, int], np.ndarray]
) -> np.ndarray:
    """The sample numbers of positions ``[i·n, (i+1)·n)`` over `m` samples (see `Dataset.batch`); `perms` caches
    the permutations of recent epochs."""
    if n <= 0:
        raise DslProgramError(f"the batch size must be positive, got {n}")
    if i < 0:
        raise DslProgramError(f"the iteration number must not be negative, got {i}")
    pos = np.arange(i * n, (i + 1) * n, dtype=np.int64)
    idx = pos % m
    if shuffle_seed is not None:
        epochs = pos // m
        for e in range(int(epochs[0]), int(epochs[-1]) + 1):
            sel = epochs == e
            key = (e, shuffle_seed & MASK64)
            perm = perms.get(key)
            if perm is None:
                if len(perms) >= 4:
                    perms.clear()
                perm = perms[key] = shuffle_permutation(m, e, shuffle_seed)
            idx[sel] = perm[idx[sel]]
    return idx


def parse_data_flag(text: str) -> tuple[str, dict[str, Any]]:
    """Parse ``--data``: ``synthetic``, ``synthetic:SEED``, ``mnist:DIR``, ``cifar10:DIR``, ``npz:FILE``,
    ``text:FILE``."""
    kind, sep, value = text.partition(":")
    kind = kind.strip()
    if kind not in KINDS:
        hint = did_you_mean(kind, KINDS)
        raise DslProgramError(
            f"unknown data source '{kind}' in --data {text!r} (expected {SOURCES})" + (f"; {hint}" if hint else "")
        )
    if kind == "synthetic":
        if not sep:
            return kind, {}
        try:
            seed = int(value, 0)
        except ValueError:
            raise DslProgramError(f"--data synthetic:SEED needs an integer seed, got {value!r}") from None
        if seed < 0:
            raise DslProgramError(f"--data synthetic:SEED needs a seed of at least 0, got {value!r}")
        return kind, {"seed": seed}
    if not value:
        what = KINDS[kind].upper()
        raise DslProgramError(f"--data {kind} needs a {KINDS[kind]}: write --data {kind}:{what}")
    return kind, {KINDS[kind]: value}


def source_argument(kind: str, args: Mapping[Any, Any]) -> Any:
    name = KINDS[kind]
    unknown = [k for k in args if k not in (name, 0)]
    if unknown:
        raise DslProgramError(f"{kind}() takes only the argument '{name}', not {unknown[0]!r}")
    if name in args and 0 in args:
        raise DslProgramError(f"{kind}() got its argument '{name}' twice")
    return args.get(name, args.get(0))


def load_data(kind: str, args: Mapping[Any, Any], x_shape: tuple[int, ...], y_classes: int, seed: int) -> Dataset:
    """Load (or make) the data set `kind` for a network taking `x_shape` per sample and `y_classes` classes."""
    if kind not in KINDS:
        hint = did_you_mean(kind, KINDS)
        raise DslProgramError(
            f"unknown data source '{kind}' (expected synthetic, mnist, cifar10, npz, text, images or csv)"
            + (f"; {hint}" if hint else "")
        )
    x_shape = tuple(int(d) for d in x_shape)
    if y_classes < 1:
        raise DslProgramError(f"the network must have at least one class, got {y_classes}")
    arg = source_argument(kind, args)
    if kind == "synthetic":
        from .synthetic import make_synthetic

        s = seed if arg is None else arg
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)):
            raise DslProgramError(f"synthetic(seed=...) needs an integer seed, got {s!r}")
        return make_synthetic(x_shape, y_classes, int(s))
    if kind == "text":
        raise DslProgramError("text data holds token ids and next-token targets, not images and classes")
    if arg is None or not isinstance(arg, str) or not arg:
        raise DslProgramError(f'{kind}() needs a {KINDS[kind]} name as a string, e.g. {kind}("data/{kind}")')
    if kind in ("npz", "csv"):  # the network's input and label under the names x and y
        from .named import Field, load_samples

        fields = (Field("x", "input", x_shape), Field("y", "label", (), y_classes))
        samples = load_samples(kind, {"file": arg}, fields, seed)
        test = samples.test
        return Dataset(samples.train["x"], samples.train["y"], *((test["x"], test["y"]) if test else (None, None)))
    if kind == "images":
        from .images import load_images
        from .named import Field

        x, y, xt, yt = load_images(arg, x_shape, y_classes, Field("x", "input", x_shape).describe(),
                                   Field("y", "label", (), y_classes).describe())  # fmt: skip
    else:
        if kind == "mnist":
            from .mnist import load_mnist as loader
        else:
            from .cifar10 import load_cifar10 as loader
        x, y, xt, yt = loader(arg)
    where = f"{kind} data in '{arg}'"
    x = fit_shape(x, x_shape, where)
    _check_labels(y, y_classes, where, "training")
    if xt is not None:
        xt = fit_shape(xt, x_shape, where + " (test set)")
        _check_labels(yt, y_classes, where, "test")
    return Dataset(x, y, xt, yt)


def fit_shape(x: np.ndarray, x_shape: tuple[int, ...], where: str) -> np.ndarray:
    sample = tuple(x.shape[1:])
    if sample == x_shape:
        return x
    if len(x_shape) == 1 and math.prod(sample) == x_shape[0]:
        return x.reshape(len(x), x_shape[0])
    raise DslProgramError(
        f"{where} has per-sample shape {list(sample)}, but the network's input takes {list(x_shape)} per sample"
    )


def _check_labels(y: np.ndarray, classes: int, where: str, what: str) -> None:
    bad = np.flatnonzero((y < 0) | (y >= classes))
    if bad.size:
        k = int(bad[0])
        raise DslProgramError(
            f"{where}: {what} label {int(y[k])} of sample {k} is outside [0, {classes}) "
            f"(the network has {classes} classes)"
        )
