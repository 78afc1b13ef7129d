"""Samples bound to a network's data by name: every `input` and `label` from the source.

    load_samples(kind, args, fields, seed) -> Samples

`fields` are the network's inputs and labels (`Field`: name, kind, per-sample shape, classes), in declaration
order. Every one must come from the source, or loading fails naming it — an input is never left at zeros:

- ``npz("file")``: an array named after each field (``x``, ``t``, ``y``, ...) and, for a test set, one named
  ``NAME_test`` for each (all of them, or none). An input holds floats ``[M, ...]`` (stored as float32), a label
  integers ``[M, ...]`` in ``[0, K)``; each has the field's per-sample shape (an input taking flat vectors ``[D]``
  also takes samples of D elements in another shape, flattened in C order). Any other array is an error.
- ``mnist(dir)``, ``cifar10(dir)``: images and class ids; they fill a network with one input and at most one label.
- ``synthetic()``: every field (see `data/synthetic.py`): the first input is class prototypes plus noise, with the
  classes of the first label (10 without labels); each label is that class id modulo its own classes; every other
  input is a fixed linear function of the first input (a regression target a network can learn).

Position p of an epoch is the same sample of every array, so a batch is row-aligned across them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import DslProgramError
from . import fit_shape, load_data, sample_indices, source_argument

if TYPE_CHECKING:
    from ..ir import Graph

__all__ = ["Field", "Samples", "batch_size", "fields_of", "load_samples"]


@dataclass(frozen=True)
class Field:
    """One `input` (float32) or `label` (int64 class ids in [0, classes)) of a network, its shape per sample."""

    name: str
    kind: str  # "input" or "label"
    shape: tuple[int, ...]
    classes: int | None = None  # a label's classes, or an integer input's vocabulary (`input t : [N, T] int vocab V`)
    ignore: int | None = None  # a label's ignored value (nll's ignore_index), which the data may hold too

    @property
    def tokens(self) -> bool:
        """An integer input: token ids in [0, classes)."""
        return self.kind == "input" and self.classes is not None

    def describe(self) -> str:
        dims = ", ".join(["N", *map(str, self.shape)])
        kind = (
            f" int vocab {self.classes}" if self.tokens else f" classes {self.classes}" if self.kind == "label" else ""
        )
        return f"{self.kind} {self.name} : [{dims}]" + kind


@dataclass(frozen=True, eq=False)
class Samples:
    """Named training (and optionally test) arrays, row-aligned: sample j of each is one sample."""

    train: Mapping[str, np.ndarray]
    test: Mapping[str, np.ndarray] | None = None
    _perms: dict[tuple[int, int], np.ndarray] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        for what, arrays in (("training", self.train), ("test", self.test)):
            if arrays is None:
                continue
            counts = {len(a) for a in arrays.values()}
            if len(counts) > 1:
                sizes = ", ".join(f"'{n}' {len(a)}" for n, a in arrays.items())
                raise DslProgramError(f"the {what} arrays hold different numbers of samples ({sizes})")
            if counts == {0}:
                raise DslProgramError(
                    "the training data holds no samples" if what == "training"
                    else "the test data holds no samples (leave the _test arrays out for none)"
                )  # fmt: skip

    @property
    def size(self) -> int:
        """M, the number of training samples."""
        return len(next(iter(self.train.values()))) if self.train else 0

    @property
    def test_size(self) -> int:
        return len(next(iter(self.test.values()))) if self.test else 0

    def batch(self, i: int, n: int, shuffle_seed: int | None = None) -> dict[str, np.ndarray]:
        """The training samples of iteration `i` (as `Dataset.batch`), every array at the same positions."""
        idx = sample_indices(i, n, self.size, shuffle_seed, self._perms)
        return {name: a[idx] for name, a in self.train.items()}

    def test_batch(self, b: int, n: int) -> dict[str, np.ndarray]:
        """Test samples ``[b·n, (b+1)·n)``, wrapping around the end of the test set."""
        assert self.test is not None
        return {name: np.take(a, range(b * n, b * n + n), axis=0, mode="wrap") for name, a in self.test.items()}


def load_samples(
    kind: str, args: Mapping[Any, Any], fields: tuple[Field, ...], seed: int, other_arrays: bool = False
) -> Samples:
    """Every field of the network from the data source `kind` (module docstring); with `other_arrays`, an npz file
    may hold arrays beyond them (`deepdsl predict` reads the inputs of a file that also holds labels)."""
    inputs = [f for f in fields if f.kind == "input"]
    labels = [f for f in fields if f.kind == "label"]
    if not inputs:
        raise DslProgramError("the network declares no `input`, so there is no data to train on")
    if kind == "npz":
        return _from_npz(source_argument(kind, args), fields, other_arrays)
    if kind == "text":
        return _from_text(source_argument(kind, args), fields)
    if kind == "csv":
        from .table import load_csv

        train, test = load_csv(source_argument(kind, args), fields, other_arrays)
        return Samples(train, test)
    if kind == "synthetic":
        from .synthetic import make_target

        classes = labels[0].classes if labels else 10
        assert classes is not None
        floats = [f for f in inputs if not f.tokens]
        ds = load_data(kind, args, floats[0].shape if floats else (1,), classes, seed)
        s = source_argument(kind, args)
        data_seed = seed if s is None else int(s)
        train = _synthetic_fields(ds.x_train, ds.y_train, fields, data_seed, make_target)
        if ds.x_test is None:
            return Samples(train)
        return Samples(train, _synthetic_fields(ds.x_test, ds.y_test, fields, data_seed, make_target))
    tokens = [f for f in inputs if f.tokens]
    if tokens:
        raise DslProgramError(
            f"{kind} data holds images, so it has nothing for the network's {tokens[0].describe()}; "
            "give token ids as --data text:FILE or as an array of --data npz:FILE"
        )
    if len(inputs) > 1 or len(labels) > 1:
        extra = (inputs[1:] + labels[1:])[0]
        raise DslProgramError(
            f"{kind} data holds one input (the images) and one label (the classes), so it has nothing for the "
            f"network's {extra.describe()}; give every input and label as an array of --data npz:FILE"
        )
    classes = labels[0].classes if labels else 10
    assert classes is not None
    if kind == "images":  # named after the network's own input and label in its errors
        from .images import load_images

        arg = source_argument(kind, args)
        if not isinstance(arg, str) or not arg:
            raise DslProgramError('images() needs a folder name as a string, e.g. images("data/pictures")')
        label = labels[0].describe() if labels else "classes (10 without a label)"
        x, y, xt, yt = load_images(arg, inputs[0].shape, classes, inputs[0].describe(), label)
        return Samples(_pair(x, y, inputs[0], labels), _pair(xt, yt, inputs[0], labels) if xt is not None else None)
    ds = load_data(kind, args, inputs[0].shape, classes, seed)
    return Samples(_pair(ds.x_train, ds.y_train, inputs[0], labels),
                   _pair(ds.x_test, ds.y_test, inputs[0], labels) if ds.x_test is not None else None)  # fmt: skip


def _pair(x: np.ndarray, y: np.ndarray | None, inp: Field, labels: list[Field]) -> dict[str, np.ndarray]:
    out = {inp.name: x}
    if labels:
        assert y is not None
        out[labels[0].name] = y
    return out


def _synthetic_fields(
    x: np.ndarray, y: np.ndarray | None, fields: tuple[Field, ...], seed: int, make_target: Any
) -> dict[str, np.ndarray]:
    assert y is not None
    first = next((f for f in fields if f.kind == "input" and not f.tokens), None)
    out: dict[str, np.ndarray] = {}
    for f in fields:
        if first is not None and f.name == first.name:
            out[f.name] = x
        elif f.tokens:  # token ids (y_j + t) mod V at flat position t of sample j: learnable from the class
            assert f.classes is not None
            size = math.prod(f.shape)
            ids = (y.reshape(-1, 1) + np.arange(size, dtype=np.int64)) % np.int64(f.classes)
            out[f.name] = ids.reshape((len(y), *f.shape))
        elif f.kind == "input":
            out[f.name] = make_target(x, f.name, f.shape, seed)
        else:
            assert f.classes is not None
            ids = y % np.int64(f.classes)
            out[f.name] = np.broadcast_to(ids.reshape((len(y),) + (1,) * len(f.shape)), (len(y), *f.shape)).copy()
    return out


def _from_npz(path: Any, fields: tuple[Field, ...], other_arrays: bool = False) -> Samples:
    import os

    from ..npzfile import read_npz

    if path is None or not isinstance(path, str) or not path:
        raise DslProgramError('npz() needs a file name as a string, e.g. npz("data/train.npz")')
    if not os.path.isfile(path):
        raise DslProgramError(f"npz data file not found: '{path}'")
    arrays = read_npz(path, "npz data file")
    names = [f.name for f in fields]
    known = set(names) | {n + "_test" for n in names}
    extra = [n for n in arrays if n not in known and not other_arrays]
    expected = ", ".join(names)
    if extra:
        raise DslProgramError(
            f"npz file '{path}' has an array '{extra[0]}' that names no input or label of the network "
            f"(it takes {expected}, and optionally {', '.join(n + '_test' for n in names)})"
        )
    for f in fields:
        if f.name not in arrays:
            raise DslProgramError(f"npz file '{path}' has no array '{f.name}' for the network's {f.describe()}")
    tests = [n + "_test" for n in names if n + "_test" in arrays]
    if tests and len(tests) != len(names):
        missing = next(n + "_test" for n in names if n + "_test" not in arrays)
        raise DslProgramError(f"npz file '{path}' has '{tests[0]}' but no '{missing}' (a test set needs every array)")
    train = {f.name: _checked(arrays[f.name], f, f.name, path) for f in fields}
    test = {f.name: _checked(arrays[f.name + "_test"], f, f.name + "_test", path) for f in fields} if tests else None
    return Samples(train, test)


def _checked(a: np.ndarray, f: Field, name: str, path: str) -> np.ndarray:
    where = f"npz file '{path}': '{name}'"
    if a.ndim < 1:
        raise DslProgramError(f"{where} must have a sample dimension [M, ...], found a scalar")
    if f.kind == "input" and not f.tokens:
        if a.dtype.kind != "f":
            found = "integers" if a.dtype.kind in "iu" else str(a.dtype)  # worded as the Java runtime words it
            raise DslProgramError(f"{where} must hold floats (float32) for the network's {f.describe()}, "
                                  f"found {found}")  # fmt: skip
        return fit_shape(np.ascontiguousarray(a, dtype=np.float32), f.shape, where)
    if a.dtype.kind not in "iu":
        found = "floats" if a.dtype.kind == "f" else str(a.dtype)
        what = "token ids" if f.tokens else "labels"
        raise DslProgramError(f"{where} must hold integer {what} for the network's {f.describe()}, found {found}")
    if tuple(a.shape[1:]) != f.shape:
        raise DslProgramError(
            f"{where} has per-sample shape {list(a.shape[1:])}, but the network's {f.describe()} takes "
            f"{list(f.shape)} per sample"
        )
    if a.dtype.kind == "u" and a.size and int(a.max()) > np.iinfo(np.int64).max:
        raise DslProgramError(f"{where} holds a label too large for int64")
    y = a.astype(np.int64)
    assert f.classes is not None
    outside = (y < 0) | (y >= f.classes)
    if f.ignore is not None:  # a loss's ignore_index, which the label may hold too
        outside &= y != f.ignore
    bad = np.flatnonzero(outside.reshape(len(y), math.prod(f.shape)).any(axis=1))
    if bad.size:
        k = int(bad[0])
        value = int(y[k].reshape(-1)[outside[k].reshape(-1)][0])
        raise DslProgramError(f"{where}: label {value} of sample {k} is outside [0, {f.classes}) (the network's "
                              f"{f.describe()})")  # fmt: skip
    return y


def _from_text(path: Any, fields: tuple[Field, ...]) -> Samples:
    """One token input and one label, both ``[T]`` per sample: the characters and their next ones (`data/text.py`)."""
    from .text import text_samples

    tokens = [f for f in fields if f.tokens]
    labels = [f for f in fields if f.kind == "label"]
    others = [f for f in fields if f not in tokens and f not in labels]
    if len(tokens) != 1 or len(labels) != 1 or others:
        extra = (others + tokens[1:] + labels[1:])[:1]
        what = f"; it has nothing for the network's {extra[0].describe()}" if extra else ""
        raise DslProgramError(
            "text data fills one token input (`input NAME : [N, T] int vocab V`) and one label of the same shape "
            f"(its next-token targets){what}"
        )
    inp, out = tokens[0], labels[0]
    if len(inp.shape) != 1 or out.shape != inp.shape:
        raise DslProgramError(
            f"text data takes [T] tokens per sample for both the {inp.describe()} and the {out.describe()}"
        )
    assert inp.classes is not None and out.classes is not None
    train, test = text_samples(path, inp.shape[0], min(inp.classes, out.classes),
                               inp.describe() if inp.classes <= out.classes else out.describe())  # fmt: skip
    return Samples({inp.name: train[0], out.name: train[1]},
                   {inp.name: test[0], out.name: test[1]} if test is not None else None)  # fmt: skip


def fields_of(inputs: Any) -> tuple[Field, ...]:
    """The fields of a graph's `InputDef`s (the `input` and `label` ones; the step counter is not data)."""
    return tuple(
        Field(d.value.name, d.kind, tuple(int(n) for n in d.value.type.shape[1:]), d.classes, d.ignore)
        for d in inputs
        if d.kind in ("input", "label")
    )


def batch_size(g: Graph) -> int:
    """N, the samples of one step: the leading dimension every input and label shares (a user error otherwise)."""
    data = [d for d in g.inputs if d.kind in ("input", "label")]
    if not data or not data[0].value.type.shape:
        raise DslProgramError("the network needs an `input` whose first dimension is the batch, e.g. [N, 784]")
    n = data[0].value.type.shape[0]
    for d in data[1:]:
        if not d.value.type.shape or d.value.type.shape[0] != n:
            first = data[0].value.name
            raise DslProgramError(
                f"{d.kind} '{d.value.name}' is {d.value.type}, but every input and label holds one row per sample "
                f"and '{first}' has a batch of {n}",
                d.span,
            )
    return n
