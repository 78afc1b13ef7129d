"""Validation of the `train { ... }` block into a TrainConfig."""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any

from deepdsl.errors import DslArgumentError, DslProgramError, Note, did_you_mean
from deepdsl.frontend import ast, calls
from deepdsl.frontend.builtins import FLOAT32_MAX, SPECS, ArgSpec
from deepdsl.frontend.program import Schedule, TrainConfig, param_matches, param_matches_any
from deepdsl.frontend.values import BuiltinFn, Spec, describe
from deepdsl.ir.types import INT_MAX, PRECISIONS

if TYPE_CHECKING:
    from deepdsl.frontend.elaborate import Elaborator

DEFAULT_DATA = ("synthetic", (("seed", 1),))
DEFAULT_OPTIMIZER = ("sgd", (("lr", 0.01), ("momentum", 0.0), ("weight_decay", 0.0), ("clip", 0.0)))

# key -> (kind, the smallest allowed value)
KEYS: dict[str, tuple[str, int]] = {
    "data": ("data", 0),
    "optimizer": ("optimizer", 0),
    "iterations": ("int", 0),
    "test_every": ("int", 0),
    "test_iterations": ("int", 1),
    "seed": ("int", 0),
    "shuffle": ("bool", 0),
    "save": ("str", 0),
    "save_every": ("int", 1),
    "lr": ("schedule", 0),
    "augment": ("augment", 0),  # data augmentation: augment_config below
    # [optim] parameters that do not train, and per-parameter learning-rate multipliers (checked by _names)
    "freeze": ("freeze", 0),
    "lr_mult": ("lr_mult", 0),
    "precision": ("precision", 0),  # fp32 | tf32 | bf16 (ir/types.py PRECISIONS)
    "sync_batch_norm": ("bool", 0),  # data-parallel: batch-norm statistics over the global batch
}


MAX_ITERATIONS = 10_000_000  # the most steps of one run (the Java program's MAX_ITERS; resume with --load for more)

# the data sources that read a path, and the name of that argument
PATH_SOURCES = {"mnist": "dir", "cifar10": "dir", "npz": "file", "text": "file", "images": "dir", "csv": "file"}


def relative_to_source(path: Any, source: str) -> Any:
    """A relative path of the train block, which is relative to the folder of the .ddsl file `source`, as the
    current directory sees it: relative below it, else absolute (so that `deepdsl run` and the program `compile`
    writes read the same place when run from where they were started). An absolute path, or a source that is
    no file, stays as it is."""
    if not isinstance(path, str) or not path or os.path.isabs(path) or not source or source.startswith("<"):
        return path
    full = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(source)), path))
    below = os.path.relpath(full)
    return full if below == os.pardir or below.startswith(os.pardir + os.sep) else below


def train_config(block: ast.Train | None, el: Elaborator) -> TrainConfig:
    if block is None:
        return TrainConfig(DEFAULT_DATA, DEFAULT_OPTIMIZER)
    values: dict[str, Any] = {}
    seen: dict[str, ast.TrainEntry] = {}
    for entry in block.entries:
        if entry.key not in KEYS:
            raise DslArgumentError(
                f"unknown train setting '{entry.key}'", entry.key_span,
                hint=did_you_mean(entry.key, KEYS) or f"the settings are: {', '.join(KEYS)}",
            )  # fmt: skip
        if entry.key in seen:
            raise DslProgramError(
                f"train setting '{entry.key}' is given twice",
                entry.span,
                notes=[Note("first here", seen[entry.key].span)],
            )
        seen[entry.key] = entry
        kind, low = KEYS[entry.key]
        if kind == "augment":  # its steps are names of the train block only (augment_config)
            values["augment"], values["augment_input"] = augment_config(entry, el)
            continue
        if kind == "precision":  # a bare name (bf16) or a string ("bf16"), never a value of the program
            values["precision"] = _precision(entry)
            continue
        v = el.eval(entry.value, el.globals)
        if isinstance(v, BuiltinFn) and v.name in SPECS:  # `optimizer = sgd` without parentheses
            v = calls.call(el, v, (), entry.value.span)
        if kind == "schedule":
            if (
                isinstance(v, bool)
                or not isinstance(v, (int, float, Spec))
                or (isinstance(v, Spec) and v.family != "schedule")
            ):
                raise DslArgumentError(
                    f"'lr' must be a learning rate or a schedule (step(...), cosine(...), warmup(...)), got "
                    f"{describe(v)}", entry.value.span,
                )  # fmt: skip
            if not isinstance(v, Spec) and (not math.isfinite(v) or v < 0 or v > FLOAT32_MAX):
                raise DslArgumentError(f"'lr' must be a number in [0, {FLOAT32_MAX:.2g}], got {v!r}", entry.value.span)
            values[entry.key] = v
        elif kind in ("freeze", "lr_mult"):  # [optim]
            values[entry.key] = _names(entry, v, el)
        elif kind in ("data", "optimizer"):
            if not (isinstance(v, Spec) and v.family == kind):
                choices = [n for n, (fam, _) in SPECS.items() if fam == kind]
                raise DslArgumentError(
                    f"'{entry.key}' must be one of {', '.join(c + '(...)' for c in choices)}, got {describe(v)}",
                    entry.value.span,
                )
            args = v.args
            if kind == "data" and v.name in PATH_SOURCES:  # read from the .ddsl file's folder, as include is
                args = tuple((k, relative_to_source(a, el.module.file) if k == PATH_SOURCES[v.name] else a)
                             for k, a in args)  # fmt: skip
            values[entry.key] = (v.name, args)
            if kind == "optimizer":  # [optim]
                _check_optimizer(entry, v)
        elif kind == "int":
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                raise DslArgumentError(
                    f"'{entry.key}' must be an integer of at least {low}, got {v!r}", entry.value.span
                )
            if entry.key == "iterations" and v > MAX_ITERATIONS:
                raise DslArgumentError(
                    f"'iterations' must be at most {MAX_ITERATIONS:,} (a longer run: resume with --load)",
                    entry.value.span,
                )
            if v > INT_MAX and entry.key != "seed":  # counts of the Java program's ints (its seed is a long)
                raise DslArgumentError(f"'{entry.key}' must be at most {INT_MAX:,} (2^31 - 1), got {v:,}",
                                       entry.value.span)  # fmt: skip
            values[entry.key] = v
        elif kind == "bool":
            if not isinstance(v, bool):
                raise DslArgumentError(f"'{entry.key}' must be true or false, got {describe(v)}", entry.value.span)
            values[entry.key] = v
        else:
            if not isinstance(v, str):
                raise DslArgumentError(f"'{entry.key}' must be a string, got {describe(v)}", entry.value.span)
            values[entry.key] = v
    values.setdefault("data", DEFAULT_DATA)
    values.setdefault("optimizer", DEFAULT_OPTIMIZER)
    if "lr" in values:
        optimizer = seen.get("optimizer")
        if optimizer is not None and _gives_lr(optimizer.value):
            raise DslProgramError(
                "the learning rate is given twice: by the optimizer and by `lr`", seen["lr"].span,
                notes=[Note("the optimizer's", optimizer.value.span)],
                hint="leave lr out of the optimizer; `lr` gives it for every iteration",
            )  # fmt: skip
        values["lr"] = schedule(values["lr"], values.get("iterations", TrainConfig.iterations))
    _check_freeze(values, seen, el)  # [optim]
    if "sync_batch_norm" in seen:
        values["sync_batch_norm_at"] = seen["sync_batch_norm"].span
    if "save_every" in values and "save" not in values:
        raise DslProgramError("`save_every` needs `save`, the file to write", seen["save_every"].span)
    return TrainConfig(**values)


def _precision(entry: ast.TrainEntry) -> str:
    e = entry.value
    name = e.name if isinstance(e, ast.Name) else e.value if isinstance(e, ast.StrLit) else None
    if name not in PRECISIONS:
        got = f"'{name}'" if name is not None else "an expression"
        raise DslArgumentError(f"'precision' must be one of {', '.join(PRECISIONS)}, got {got}", e.span,
                               hint=did_you_mean(name, PRECISIONS) if name else None)  # fmt: skip
    return name


def _gives_lr(e: ast.Expr) -> bool:
    """Whether an optimizer expression names its learning rate (`sgd(0.1)`, `adam(lr=...)`)."""
    return isinstance(e, ast.Call) and any(a.name in (None, "lr") for a in e.args)


def schedule(v: Any, iterations: int) -> Schedule:
    """The Schedule of an `lr` value: a number (constant) or a schedule spec; a `cosine` without `total` runs over
    the train block's `iterations` (`total=0` is refused where the call is checked)."""
    if not isinstance(v, Spec):
        return Schedule("constant", value=float(v))
    a = dict(v.args)
    base = schedule(a["lr"], iterations)
    if v.name == "step":
        return Schedule("step", base, every=a["every"], gamma=a["gamma"])
    if v.name == "cosine":
        return Schedule(
            "cosine", base, total=a["total"] if a["total"] is not None else max(1, iterations), min=a["min"]
        )
    return Schedule("warmup", base, steps=a["steps"])


# ---- data augmentation: `augment = (crop(32, pad=4), flip(), normalize((0.49, 0.48, 0.45), (0.25, 0.24, 0.26)))` --

# the steps, as calls of the train block's `augment` only: crop, flip and normalize stay free names everywhere else
AUGMENTS: dict[str, tuple[ArgSpec, ...]] = {
    "crop": (ArgSpec("size", "pair", low=1), ArgSpec("pad", "pair", 0, low=0)),
    "flip": (ArgSpec("p", "float", 0.5, low=0.0, high=1.0),),
    "normalize": (ArgSpec("mean", "floats"), ArgSpec("std", "floats", low=0.0)),
}


def augment_config(entry: ast.TrainEntry, el: Elaborator) -> tuple[tuple[Any, ...], str]:
    """The steps of `augment` (one step or a tuple of them, each at most once, applied in the order written) and the
    network's image input they apply to: its first float input [N, C, H, W]. crop's size must be the input's H and W
    and its pad at most them; normalize gives one mean and one positive std per channel (or one for all). The steps
    are read from the entry's text: `crop`, `flip` and `normalize` name them here and nowhere else."""
    span = entry.value.span
    exprs = entry.value.items if isinstance(entry.value, ast.TupleLit) else (entry.value,)
    steps: list[tuple[str, tuple[tuple[str, Any], ...], Any]] = []  # (name, arguments, the step's span)
    for e in exprs:
        if isinstance(e, ast.Name) and e.name in AUGMENTS:  # `flip` without parentheses
            name, args = e.name, ()
        elif isinstance(e, ast.Call) and isinstance(e.func, ast.Name) and e.func.name in AUGMENTS:
            name = e.func.name
            args = tuple(calls.CallArg(a.name, el.eval(a.value, el.globals), a.span) for a in e.args)
        else:
            raise DslArgumentError(
                "'augment' takes crop(size, pad=...), flip(p=0.5) and normalize(mean, std), one or a tuple of them",
                e.span,
            )
        if any(name == n for n, _, _ in steps):
            raise DslArgumentError(f"'augment' gives {name}() twice", e.span)
        steps.append((name, tuple(calls.bind_args(el, name, AUGMENTS[name], args, e.span).items()), e.span))
    image = next((d for d in el.b.inputs if d.kind == "input" and d.classes is None and d.value.type.rank == 4), None)
    if image is None:
        raise DslArgumentError("'augment' needs an image input [N, C, H, W] (floats), and the network has none", span)
    _, c, h, w = image.value.type.shape
    name = image.value.name
    out: list[tuple[str, tuple[tuple[str, Any], ...]]] = []
    for kind, args, span in steps:  # each error at its step
        a = dict(args)
        if kind == "crop":
            if tuple(a["size"]) != (h, w):
                raise DslArgumentError(
                    f"crop's size {tuple(a['size'])} must be the image input {name}'s (H, W) = ({h}, {w}): a crop "
                    "pads the image and cuts out one of its own size", span,
                )  # fmt: skip
            if a["pad"][0] > h or a["pad"][1] > w:
                raise DslArgumentError(f"crop's pad {tuple(a['pad'])} must be at most the image's (H, W) = ({h}, "
                                       f"{w})", span)  # fmt: skip
        if kind == "normalize":
            for key in ("mean", "std"):
                if len(a[key]) == 1:
                    a[key] = a[key] * c
                if len(a[key]) != c:
                    raise DslArgumentError(
                        f"normalize's {key} has {len(a[key])} values, but the image input {name} has {c} channels",
                        span,
                    )
            if any(s <= 0 or s > FLOAT32_MAX for s in a["std"]) or any(abs(m) > FLOAT32_MAX for m in a["mean"]):
                raise DslArgumentError("normalize's std values must be positive (and every value a float32)", span)
        out.append((kind, tuple(a.items())))
    return tuple(out), name


# ---- [optim] the optimizer's own checks, freeze and lr_mult ----------------------------------------------------


def _check_optimizer(entry: ast.TrainEntry, v: Spec) -> None:
    """sgd's nesterov needs a momentum (torch.optim.SGD refuses nesterov=True with momentum 0)."""
    a = dict(v.args)
    if v.name == "sgd" and a.get("nesterov") and a["momentum"] == 0.0:
        at = entry.value
        if isinstance(at, ast.Call):
            at = next((x for x in at.args if x.name == "nesterov"), at)  # type: ignore[assignment]
        raise DslArgumentError(
            "sgd: nesterov=true needs a momentum above 0 (as torch.optim.SGD)", at.span,
            hint="give it, e.g. sgd(lr=0.1, momentum=0.9, nesterov=true)",
        )  # fmt: skip


def _trainable(el: Elaborator) -> list[str]:
    return [p.value.name for p in el.b.params if p.kind == "param"]


def _known_names(params: list[str]) -> list[str]:
    """What freeze and lr_mult may name: each trainable parameter and each prefix of it up to a `.` (its layer)."""
    out: dict[str, None] = {}
    for p in params:
        parts = p.split(".")
        for k in range(1, len(parts) + 1):
            out[".".join(parts[:k])] = None
    return list(out)


def _names(entry: ast.TrainEntry, v: Any, el: Elaborator) -> Any:
    """`freeze`: a name or a tuple of names -> tuple[str, ...]; `lr_mult`: a pair (name, multiplier) or a tuple of
    such pairs -> tuple[tuple[str, float], ...]. Each name must name a trainable parameter or a prefix of one up
    to a `.` (a layer); an error at the name otherwise, with the nearest as a hint."""
    params = _trainable(el)
    e = entry.value
    items = [(x, e.items[k] if isinstance(e, ast.TupleLit) else e) for k, x in enumerate(v)] \
        if isinstance(v, tuple) and not (entry.key == "lr_mult" and _is_pair(v)) else [(v, e)]  # fmt: skip
    seen: dict[str, ast.Expr] = {}
    out = []
    for x, at in items:
        if entry.key == "freeze":
            name, mult = x, None
            if not isinstance(name, str):
                raise DslArgumentError(
                    f"'freeze' takes a layer or parameter name or a tuple of them, got {describe(name)}", at.span,
                    hint='e.g. freeze = ("cv1", "cv2") or freeze = "cv1.W"',
                )  # fmt: skip
        else:
            if not _is_pair(x):
                raise DslArgumentError(
                    f"'lr_mult' takes pairs (name, multiplier), got {describe(x)}", at.span,
                    hint='e.g. lr_mult = (("fc", 10), ("cv1", 0.1)), or one pair: lr_mult = ("fc", 10)',
                )  # fmt: skip
            name, mult = x
            num = at.items[1] if isinstance(at, ast.TupleLit) and len(at.items) == 2 else at
            if not math.isfinite(mult) or mult < 0 or mult > FLOAT32_MAX:
                raise DslArgumentError(f"lr_mult: the multiplier of '{name}' must be a number in [0, "
                                       f"{FLOAT32_MAX:.2g}], got {mult!r}", num.span)  # fmt: skip
        where = at.items[0] if isinstance(at, ast.TupleLit) and entry.key == "lr_mult" and at.items else at
        if name in seen:
            raise DslProgramError(f"{entry.key}: '{name}' is given twice", where.span,
                                  notes=[Note("first here", seen[name].span)])  # fmt: skip
        seen[name] = where
        if not any(param_matches(p, name) for p in params):
            known = _known_names(params)
            raise DslArgumentError(
                f"{entry.key}: '{name}' names no trainable parameter or layer of the network", where.span,
                hint=did_you_mean(name, known) or f"the layers are: {', '.join(k for k in known if '.' not in k)}",
            )  # fmt: skip
        out.append(name if mult is None else (name, float(mult)))
    return tuple(out)


def _is_pair(x: Any) -> bool:
    return (isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str) and isinstance(x[1], (int, float))
            and not isinstance(x[1], bool))  # fmt: skip


def _check_freeze(values: dict[str, Any], seen: dict[str, ast.TrainEntry], el: Elaborator) -> None:
    """Freezing every trainable parameter leaves nothing to train; a multiplier of only frozen parameters has no
    effect: both errors."""
    frozen = values.get("freeze", ())
    if not frozen:
        return
    params = _trainable(el)
    if params and all(param_matches_any(p, frozen) for p in params):
        raise DslProgramError("`freeze` names every trainable parameter: training would change nothing",
                              seen["freeze"].value.span)  # fmt: skip
    for name, _ in values.get("lr_mult", ()):
        if all(param_matches_any(p, frozen) for p in params if param_matches(p, name)):
            raise DslProgramError(
                f"lr_mult: every parameter '{name}' names is frozen, so its multiplier has no effect",
                seen["lr_mult"].value.span, notes=[Note("frozen here", seen["freeze"].value.span)],
            )  # fmt: skip
