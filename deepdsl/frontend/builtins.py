"""The built-in layers and functions of DESIGN §2.4: their signatures and how each lowers to IR ops.

A built-in layer is the user's vocabulary (`conv`, `full`, `batch_norm`); it makes its parameters and
emits one or more registry ops (`conv2d` + `bias_add`). Signatures are data, so argument checking,
defaults and error messages are shared by every entry.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from deepdsl.errors import DslArgumentError, DslShapeError, Note, Span
from deepdsl.frontend import convs
from deepdsl.frontend.values import Spec, TensorVal

if TYPE_CHECKING:
    from deepdsl.frontend.elaborate import Elaborator

REQUIRED = object()
# the largest float32: an optimizer's hyperparameter is read as a float32 and must stay finite there (the same
# bound as the run options and the Java program's flags, deepdsl/running.py SETTING_RANGES)
FLOAT32_MAX = 3.4028234663852886e38


@dataclass(frozen=True)
class ArgSpec:
    name: str
    kind: str  # int, pair, ints, float, floats, bool, init, str, schedule
    default: Any = REQUIRED
    low: float | None = None  # smallest allowed value (ints, pairs, floats)
    below: float | None = None  # values must be strictly less than this
    high: float | None = None  # largest allowed value
    keyword: bool = False  # given by name only (the cross-entropies' label_smoothing= and weight=)


Args = dict[str, Any]
Apply = Callable[["Elaborator", str, tuple[TensorVal, ...], Args, Span], TensorVal]


@dataclass(frozen=True)
class Builtin:
    name: str
    inputs: int  # leading tensor inputs; -1 for any number (concat)
    args: tuple[ArgSpec, ...]
    apply: Apply
    layer: bool = True  # a layer gets a naming scope and a row in `check --layers`


HE = Spec("init", "he", ())
ZERO = Spec("init", "constant", (("v", 0.0),))
ONE = Spec("init", "constant", (("v", 1.0),))

BUILTINS: dict[str, Builtin] = {}


def builtin(name: str, *args: ArgSpec, inputs: int = 1, layer: bool = True) -> Callable[[Apply], Apply]:
    def register(fn: Apply) -> Apply:
        BUILTINS[name] = Builtin(name, inputs, args, fn, layer)
        return fn

    return register


def need_rank(x: TensorVal, ranks: tuple[int, ...], what: str, span: Span, hint: str | None = None) -> None:
    if len(x.shape) not in ranks:
        want = " or ".join(f"{r}-D" for r in ranks)
        raise DslShapeError(f"{what} expects a {want} input, got {x.value.type} from {x.origin}", span, hint=hint)


# ---- layers with parameters ---------------------------------------------------------------------

# conv and its adjoint conv_transpose take the same arguments (conv's pad may also be (top, left, bottom, right),
# conv_transpose adds output_padding); dilation is the gap between the kernel's taps, as PyTorch's
CONV_ARGS = (
    ArgSpec("out", "int", low=1),
    ArgSpec("kernel", "pair", low=1),
    ArgSpec("stride", "pair", 1, low=1),
    ArgSpec("pad", "ints", 0, low=0),
    ArgSpec("groups", "int", 1, low=1),
    ArgSpec("bias", "bool", True),
    ArgSpec("init", "init", HE),
    ArgSpec("bias_init", "init", ZERO),
    ArgSpec("dilation", "pair", 1, low=1),
)


def _dilated(a: Args) -> dict[str, Any]:
    """The conv ops' dilation attribute, where there is one (a statement without it has none)."""
    return {"dilation": a["dilation"]} if tuple(a["dilation"]) != (1, 1) else {}


@builtin("conv", *CONV_ARGS)
def conv(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    (x,) = xs
    need_rank(x, (4,), "conv", span, "conv works on [N, C, H, W] images")
    c, g = x.shape[1], a["groups"]
    if c % g:
        raise DslShapeError(f"conv: groups={g} does not divide the {c} input channels of {x.origin}", span)
    w = el.param(path, "W", (a["out"], c // g, *a["kernel"]), a["init"], span)
    return _conv_with(el, path, x, w, a, span, "conv")


def _conv_with(el: Elaborator, path: str, x: TensorVal, w: TensorVal, a: Args, span: Span, what: str) -> TensorVal:
    """conv2d (+ bias_add) of x by w: the padding both sides share is the op's, any more an explicit zero pad."""
    t, lft, b, r = convs.pads(what, a["pad"], span, rank=1 if what == "conv1d" else 2)
    pad = (min(t, b), min(lft, r))
    x = convs.pad_explicitly(el, x, (t - pad[0], lft - pad[1]), (b - pad[0], r - pad[1]), 0.0, span, path, what)
    y = el.emit("conv2d", (x, w), span, path, what, stride=a["stride"], pad=pad, groups=a["groups"], **_dilated(a))
    if a["bias"]:
        bias = el.param(path, "b", (a["out"],), a["bias_init"], span)
        y = el.emit("bias_add", (y, bias), span, path, what)
    return y


@builtin("conv_transpose", *CONV_ARGS, ArgSpec("output_padding", "pair", 0, low=0))
def conv_transpose(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    # the adjoint of conv: its data gradient (conv2d_backward_data) with x in the place of the output gradient;
    # weight [C, out/groups, kh, kw] as PyTorch's ConvTranspose2d, output (H - 1)·stride - 2·pad +
    # dilation·(kernel - 1) + output_padding + 1
    (x,) = xs
    need_rank(x, (4,), "conv_transpose", span, "conv_transpose works on [N, C, H, W] images")
    n, c, h, w = x.shape
    g = a["groups"]
    if c % g or a["out"] % g:
        raise DslShapeError(
            f"conv_transpose: groups={g} must divide the {c} input channels of {x.origin} and out={a['out']}", span
        )
    if len(a["pad"]) not in (1, 2):
        raise DslArgumentError(f"conv_transpose: pad must be an integer or a pair (h, w), got {a['pad']}", span)
    pad = (a["pad"][0], a["pad"][-1])
    for op, s, d in zip(a["output_padding"], a["stride"], a["dilation"]):
        if op >= s and op >= d:
            raise DslArgumentError(
                f"conv_transpose: output_padding {a['output_padding']} must be less than the stride {a['stride']} or "
                f"the dilation {a['dilation']} along each axis", span,
            )  # fmt: skip
    dims = zip((h, w), a["stride"], pad, a["kernel"], a["dilation"])
    size = tuple((d - 1) * s - 2 * p + dil * (k - 1) + 1 for d, s, p, k, dil in dims)
    if min(size) < 1:
        raise DslShapeError(f"conv_transpose: padding {pad} leaves no output for {x.origin} (size {list(size)})", span)
    # an output padding below the stride is the data gradient of a convolution of the larger image (its last rows
    # get nothing); one from the stride up (below the dilation) is zero rows added after
    inner = tuple(size[i] + (op if op < s else 0) for i, (op, s) in enumerate(zip(a["output_padding"], a["stride"])))
    wt = el.param(path, "W", (c, a["out"] // g, *a["kernel"]), a["init"], span)
    y = el.emit("conv2d_backward_data", (x, wt), span, path, "conv_transpose", stride=a["stride"], pad=pad,
                groups=g, in_shape=(n, a["out"], *inner), **_dilated(a))  # fmt: skip
    after = tuple(op if op >= s else 0 for op, s in zip(a["output_padding"], a["stride"]))
    y = convs.pad_explicitly(el, y, (0, 0), after, 0.0, span, path, "conv_transpose")  # type: ignore[arg-type]
    if a["bias"]:
        b = el.param(path, "b", (a["out"],), a["bias_init"], span)
        y = el.emit("bias_add", (y, b), span, path, "conv_transpose")
    return y


@builtin(
    "full",
    ArgSpec("out", "int", low=1),
    ArgSpec("bias", "bool", True),
    ArgSpec("init", "init", HE),
    ArgSpec("bias_init", "init", ZERO),
)
def full(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    # nn.Linear: over the last axis of any rank (issue 34), the leading axes viewed as rows and back (free views)
    (x,) = xs
    need_rank(x, (2, 3, 4, 5, 6), "full", span, "full works on [N, D] rows, or on the last axis of [N, ..., D]")
    d = x.shape[-1]
    w = el.param(path, "W", (a["out"], d), a["init"], span)
    rows = _view(el, x, (math.prod(x.shape[:-1]), d), span, path, "full")
    y = el.emit("linear", (rows, w), span, path, "full")
    if a["bias"]:
        b = el.param(path, "b", (a["out"],), a["bias_init"], span)
        y = el.emit("bias_add", (y, b), span, path, "full")
    return _view(el, y, (*x.shape[:-1], a["out"]), span, path, "full")


@builtin(
    "batch_norm",
    ArgSpec("eps", "float", 1e-5, low=1e-30),
    ArgSpec("momentum", "float", 0.1, low=0.0, high=1.0),  # PyTorch's: the weight of the batch's statistics
    ArgSpec("affine", "bool", True),
)
def batch_norm(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    # [N, C] (BatchNorm1d on features), [N, C, L] (BatchNorm1d on sequences: viewed as [N, C, L, 1], issue 34),
    # [N, C, H, W] (BatchNorm2d): the statistics of each channel over every other axis
    (x,) = xs
    need_rank(x, (2, 3, 4), "batch_norm", span)
    if len(x.shape) == 3:
        y = batch_norm(el, path, (_view(el, x, (*x.shape, 1), span, path, "batch_norm"),), a, span)
        return _view(el, y, tuple(x.shape), span, path, "batch_norm")
    c = (x.shape[1],)
    ins = [
        x,
        el.param(path, "running_mean", c, ZERO, span, "state"),
        el.param(path, "running_var", c, ONE, span, "state"),
    ]
    if a["affine"]:
        ins += [el.param(path, "gamma", c, ONE, span), el.param(path, "beta", c, ZERO, span)]
    return el.emit(
        "batch_norm", tuple(ins), span, path, "batch_norm", eps=a["eps"], momentum=a["momentum"], affine=a["affine"]
    )


@builtin(
    "embedding",
    ArgSpec("vocab", "int", low=1),
    ArgSpec("dim", "int", low=1),
    ArgSpec("init", "init", Spec("init", "gaussian", (("std", 1.0),))),  # PyTorch's nn.Embedding: N(0, 1)
)
def embedding(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    (tokens,) = xs
    if tokens.value.type.dtype.value != "i64":
        raise DslShapeError(
            f"embedding expects integer token ids, got float data {tokens.value.type} from {tokens.origin}", span,
            hint="declare the tokens as `input NAME : [N, T] int vocab V`",
        )  # fmt: skip
    if tokens.classes is not None and tokens.classes > a["vocab"]:
        raise DslShapeError(
            f"embedding: {tokens.origin} holds ids in [0, {tokens.classes}), more than the table's vocab={a['vocab']}",
            span,
        )
    w = el.param(path, "W", (a["vocab"], a["dim"]), a["init"], span)
    return el.emit("embedding", (tokens, w), span, path, "embedding")


# ---- layers without parameters ------------------------------------------------------------------


def _pool(op: str, what: str) -> Apply:
    def apply(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
        (x,) = xs
        one_d = what.endswith("1d")
        hint = f"{what} works on " + ("[N, C, L] sequences" if one_d else "[N, C, H, W] images")
        need_rank(x, (3,) if one_d else (4,), what, span, hint)
        stride = a["stride"] if a["stride"] is not None else a["kernel"]
        p = convs.pads(what, a["pad"], span, rank=1 if one_d else 2)
        if one_d:  # a view of the 2-D pooling on [N, C, 1, L] with (1, k) windows
            kernel, stride = (1, a["kernel"]), (1, stride)
            y = convs.pool(el, op, what, convs.as_image(el, x, span, path, what), kernel, stride, p,
                           a["ceil_mode"], span, path)  # fmt: skip
            return convs.as_sequence(el, y, span, path, what)
        if p[:2] == p[2:] and not a["ceil_mode"]:
            return el.emit(op, (x,), span, path, what, kernel=a["kernel"], stride=stride, pad=p[:2])
        return convs.pool(el, op, what, x, a["kernel"], stride, p, a["ceil_mode"], span, path)

    return apply


for _op, _what in (("max_pool2d", "max_pool"), ("avg_pool2d", "avg_pool")):
    builtin(
        _what,
        ArgSpec("kernel", "pair", low=1),
        ArgSpec("stride", "pair", None, low=1),
        ArgSpec("pad", "ints", 0, low=0),
        ArgSpec("ceil_mode", "bool", False),
    )(_pool(_op, _what))


@builtin("global_avg_pool")
def global_avg_pool(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    # [N, C, H, W] -> [N, C, 1, 1]; [N, C, L] -> [N, C, 1] (PyTorch's AdaptiveAvgPool1d(1)), a view of the 2-D one
    need_rank(xs[0], (3, 4), "global_avg_pool", span)
    if len(xs[0].shape) == 3:
        y = el.emit("global_avg_pool", (convs.as_image(el, xs[0], span, path, "global_avg_pool"),), span, path,
                    "global_avg_pool")  # fmt: skip
        return convs.as_sequence(el, y, span, path, "global_avg_pool")
    return el.emit("global_avg_pool", xs, span, path, "global_avg_pool")


@builtin("upsample", ArgSpec("factor", "int", low=1), ArgSpec("mode", "str", "nearest"))
def upsample(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    # [N, C, H, W] -> [N, C, f·H, f·W] (PyTorch's F.interpolate(scale_factor=f), align_corners=False): along H,
    # then along W (ops/resize.py)
    (x,) = xs
    need_rank(x, (4,), "upsample", span, "upsample works on [N, C, H, W] images")
    if a["mode"] not in ("nearest", "bilinear"):
        raise DslArgumentError(f'upsample: mode must be "nearest" or "bilinear", got {a["mode"]!r}', span)
    for axis in (2, 3):
        x = el.emit("resize_axis", (x,), span, path, "upsample", axis=axis, factor=a["factor"], mode=a["mode"])
    return x


@builtin("flatten")
def flatten(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    (x,) = xs
    need_rank(x, (2, 3, 4, 5, 6), "flatten", span)
    shape = (x.shape[0], math.prod(x.shape[1:]))
    return el.emit("reshape", xs, span, path, "flatten", shape=shape)


def _simple(op: str, *args: ArgSpec) -> None:
    def apply(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
        return el.emit(op, xs, span, path, op, **a)

    builtin(op, *args)(apply)


for _name in ("relu", "sigmoid", "tanh", "exp", "log", "sqrt", "abs", "gelu"):
    _simple(_name)
_simple("leaky_relu", ArgSpec("slope", "float", 0.01))
_simple("lrn", ArgSpec("size", "int", 5, low=1), ArgSpec("alpha", "float", 1e-4, low=0.0),
        ArgSpec("beta", "float", 0.75, low=0.0), ArgSpec("k", "float", 1.0, low=1e-30))  # fmt: skip


@builtin("dropout", ArgSpec("p", "float", 0.5, low=0.0, below=1.0))
def dropout(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    return el.emit("dropout", xs, span, path, "dropout", p=a["p"], site=path)


# ---- functions of several tensors -----------------------------------------------------------------


@builtin("concat", ArgSpec("axis", "int", 1, low=0), inputs=-1, layer=False)
def concat(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    if len(xs) < 2:
        raise DslArgumentError("concat needs at least two tensors", span)
    return el.emit("concat", xs, span, path, "concat", axis=a["axis"])


def _class_loss(op: str) -> None:
    def apply(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
        scores, labels = xs
        if len(scores.shape) >= 4 and len(labels.shape) == 1:  # issue 34: `full` on images keeps [N, C, H]
            raise DslShapeError(
                f"{op}: one label per sample needs [N, K] scores, got {scores.value.type} from {scores.origin}",
                span, notes=_notes(labels),
                hint="`full` works on the last axis (as nn.Linear): use `flatten` first to turn [N, C, H, W] into "
                "[N, C*H*W]",
            )  # fmt: skip
        per_position = op == "softmax_cross_entropy" and len(scores.shape) > 2
        if (
            labels.classes is not None
            and (len(scores.shape) == 2 or per_position)
            and scores.shape[-1] != labels.classes
        ):
            raise DslShapeError(
                f"{op}: {scores.origin} gives {scores.shape[-1]} scores per "
                f"{'position' if per_position else 'sample'}, "
                f"but the labels '{labels.origin.split(chr(39))[1]}' have {labels.classes} classes",
                span,
            )
        return el.emit(op, xs, span, path, op)

    builtin(op, inputs=2, layer=False)(apply)


for _name in ("softmax_cross_entropy", "cross_entropy", "accuracy"):
    _class_loss(_name)


@builtin("mse", inputs=2, layer=False)
def mse(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    return el.emit("mse", xs, span, path, "mse")


@builtin("argmax", layer=False)
def argmax(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    return el.emit("argmax", xs, span, path, "argmax")


# ---- specs: initialisers, data sources, optimizers ---------------------------------------------------

SPECS: dict[str, tuple[str, tuple[ArgSpec, ...]]] = {
    "he": ("init", ()),
    "xavier": ("init", ()),
    "gaussian": ("init", (ArgSpec("std", "float", low=0.0),)),
    "uniform": ("init", (ArgSpec("a", "float", low=0.0),)),
    "constant": ("init", (ArgSpec("v", "float"),)),
    "synthetic": ("data", (ArgSpec("seed", "int", 1),)),
    "mnist": ("data", (ArgSpec("dir", "str"),)),
    "cifar10": ("data", (ArgSpec("dir", "str"),)),
    "npz": ("data", (ArgSpec("file", "str"),)),
    "text": ("data", (ArgSpec("file", "str"),)),
    "sgd": (
        "optimizer",
        (
            ArgSpec("lr", "float", 0.01, low=0.0, high=FLOAT32_MAX),
            ArgSpec("momentum", "float", 0.0, low=0.0, below=1.0),
            ArgSpec("weight_decay", "float", 0.0, low=0.0, high=FLOAT32_MAX),
            ArgSpec("clip", "float", 0.0, low=0.0, high=FLOAT32_MAX),
            ArgSpec("nesterov", "bool", False),  # [optim] torch's nesterov=True: needs momentum > 0
        ),
    ),  # fmt: skip
    # learning-rate schedules (frontend/program.py Schedule); `lr` is a number or another schedule
    "step": (
        "schedule",
        (
            ArgSpec("lr", "schedule", high=FLOAT32_MAX),
            ArgSpec("every", "int", low=1),
            ArgSpec("gamma", "float", 0.1, low=0.0, high=FLOAT32_MAX),
        ),
    ),  # fmt: skip
    "cosine": (
        "schedule",
        # total left out: the train block's iterations (an explicit 0 is an error, not "all of them")
        (
            ArgSpec("lr", "schedule", high=FLOAT32_MAX),
            ArgSpec("total", "int", None, low=1),
            ArgSpec("min", "float", 0.0, low=0.0, high=FLOAT32_MAX),
        ),
    ),  # fmt: skip
    "warmup": ("schedule", (ArgSpec("lr", "schedule", high=FLOAT32_MAX), ArgSpec("steps", "int", low=1))),
    "adam": (
        "optimizer",
        (
            ArgSpec("lr", "float", 0.001, low=0.0, high=FLOAT32_MAX),
            ArgSpec("beta1", "float", 0.9, low=0.0, below=1.0),
            ArgSpec("beta2", "float", 0.999, low=0.0, below=1.0),
            ArgSpec("eps", "float", 1e-8, low=0.0, high=FLOAT32_MAX),
        ),
    ),  # fmt: skip
    # data sources: a folder of class folders of images, a numeric CSV file (data/images.py, data/table.py)
    "images": ("data", (ArgSpec("dir", "str"),)),
    "csv": ("data", (ArgSpec("file", "str"),)),
    # [optim] torch.optim.AdamW (decoupled weight decay) and RMSprop (centered=False, eps outside the sqrt)
    "adamw": (
        "optimizer",
        (
            ArgSpec("lr", "float", 0.001, low=0.0, high=FLOAT32_MAX),
            ArgSpec("beta1", "float", 0.9, low=0.0, below=1.0),
            ArgSpec("beta2", "float", 0.999, low=0.0, below=1.0),
            ArgSpec("eps", "float", 1e-8, low=0.0, high=FLOAT32_MAX),
            ArgSpec("weight_decay", "float", 0.01, low=0.0, high=FLOAT32_MAX),
            ArgSpec("clip", "float", 0.0, low=0.0, high=FLOAT32_MAX),
        ),
    ),  # fmt: skip
    "rmsprop": (
        "optimizer",
        (
            ArgSpec("lr", "float", 0.01, low=0.0, high=FLOAT32_MAX),
            ArgSpec("alpha", "float", 0.99, low=0.0, below=1.0),
            ArgSpec("eps", "float", 1e-8, low=0.0, high=FLOAT32_MAX),
            ArgSpec("momentum", "float", 0.0, low=0.0, below=1.0),
            ArgSpec("weight_decay", "float", 0.0, low=0.0, high=FLOAT32_MAX),
            ArgSpec("clip", "float", 0.0, low=0.0, high=FLOAT32_MAX),
        ),
    ),  # fmt: skip
}

# compile-time shape queries: name -> number of arguments after the tensor
QUERIES = {"dim": 1, "channels": 0, "rank": 0}


# ---- Transformer vocabulary: products, axes, shapes, row normalisation (shapes as in PyTorch) ----------


def _notes(*xs: TensorVal) -> list[Note]:
    return [Note(f"{x.value.type} comes from {x.origin}", x.span) for x in xs if "parameter" not in x.origin]


def _axis(x: TensorVal, axis: int, what: str, span: Span) -> int:
    """`axis` of x, counted from the end when negative (-1 is the last)."""
    rank = len(x.shape)
    if not -rank <= axis < rank:
        raise DslShapeError(f"{what}: axis {axis} is out of range for {x.value.type} from {x.origin}", span)
    return axis % rank


def _view(el: Elaborator, x: TensorVal, shape: tuple[int, ...], span: Span, path: str, kind: str) -> TensorVal:
    return x if tuple(x.shape) == shape else el.emit("reshape", (x,), span, path, kind, shape=shape)


@builtin("matmul", ArgSpec("transpose_a", "bool", False), ArgSpec("transpose_b", "bool", False), inputs=2,
         layer=False)  # fmt: skip
def matmul(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    """op(a) @ op(b) over the last two axes; leading axes are batches (equal in both, or b 2-D: a weight)."""
    x, y = xs
    ta, tb = a["transpose_a"], a["transpose_b"]
    if len(x.shape) < 2 or len(y.shape) < 2:
        raise DslShapeError("matmul needs operands of at least 2 axes", span, notes=_notes(x, y))
    m, k = (x.shape[-1], x.shape[-2]) if ta else x.shape[-2:]
    k2, n = (y.shape[-1], y.shape[-2]) if tb else y.shape[-2:]
    if k != k2:
        sides = f"{'op(a)' if ta else 'a'} is [{m}, {k}], {'op(b)' if tb else 'b'} is [{k2}, {n}]"
        raise DslShapeError(f"matmul: inner sizes differ ({k} vs {k2}): {sides}", span, notes=_notes(x, y),
                            hint="transpose_a=true / transpose_b=true multiply by a transposed operand")  # fmt: skip
    attrs = {"transpose_a": ta, "transpose_b": tb}
    if len(x.shape) == 2 and len(y.shape) == 2:
        return el.emit("matmul", xs, span, path, "matmul", **attrs)
    lead = tuple(x.shape[:-2])
    if len(y.shape) == 2 and not ta:  # a batch of rows times one matrix: one GEMM over every row
        rows = _view(el, x, (math.prod(x.shape[:-1]), k), span, path, "matmul")
        out = el.emit("matmul", (rows, y), span, path, "matmul", **attrs)
        return _view(el, out, (*x.shape[:-1], n), span, path, "matmul")
    if tuple(y.shape[:-2]) != lead:
        raise DslShapeError(f"matmul: the batch axes differ ({x.value.type} and {y.value.type})", span,
                            notes=_notes(x, y))  # fmt: skip
    batch = math.prod(lead)
    x3 = _view(el, x, (batch, *x.shape[-2:]), span, path, "matmul")
    y3 = _view(el, y, (batch, *y.shape[-2:]), span, path, "matmul")
    out = el.emit("batch_matmul", (x3, y3), span, path, "matmul", **attrs)
    return _view(el, out, (*lead, m, n), span, path, "matmul")


def _permute(el: Elaborator, x: TensorVal, perm: tuple[int, ...], span: Span, path: str, kind: str) -> TensorVal:
    if perm == tuple(range(len(perm))):
        return x
    return el.emit("transpose", (x,), span, path, kind, perm=perm)


@builtin("transpose", ArgSpec("a", "int", -2), ArgSpec("b", "int", -1))
def transpose(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    """Axes a and b swapped (torch.transpose); by default the last two."""
    (x,) = xs
    need_rank(x, (2, 3, 4, 5, 6), "transpose", span)
    i, j = _axis(x, a["a"], "transpose", span), _axis(x, a["b"], "transpose", span)
    perm = list(range(len(x.shape)))
    perm[i], perm[j] = j, i
    return _permute(el, x, tuple(perm), span, path, "transpose")


@builtin("permute", ArgSpec("axes", "ints"))
def permute(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    """Output axis i is input axis axes[i] (torch.permute)."""
    (x,) = xs
    axes = tuple(_axis(x, k, "permute", span) for k in a["axes"])
    if len(axes) != len(x.shape) or sorted(axes) != list(range(len(x.shape))):
        raise DslShapeError(f"permute: {a['axes']} is not a permutation of the {len(x.shape)} axes of "
                            f"{x.value.type} from {x.origin}", span)  # fmt: skip
    return _permute(el, x, axes, span, path, "permute")


@builtin("reshape", ArgSpec("shape", "ints", low=-1))
def reshape(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    """The same elements in another shape, a view; one size may be -1, inferred from the others."""
    (x,) = xs
    shape, total = list(a["shape"]), math.prod(x.shape)
    if 0 in shape or shape.count(-1) > 1:
        raise DslArgumentError("reshape: every size must be at least 1, and at most one may be -1", span)
    known = math.prod(s for s in shape if s != -1)
    if -1 in shape and total % known == 0:
        shape[shape.index(-1)] = total // known
    if math.prod(shape) != total:
        want = ", ".join(map(str, a["shape"]))
        holds = f"no size for -1 fits (not a multiple of {known:,})" if -1 in a["shape"] else f"holds {known:,}"
        raise DslShapeError(f"reshape: {x.value.type} from {x.origin} has {total:,} elements; [{want}] {holds}",
                            span, hint="the sizes of a reshape must multiply to the input's element count")  # fmt: skip
    return _view(el, x, tuple(shape), span, path, "reshape")


def _softmax(op: str) -> Apply:
    def apply(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
        # the registry op works on the rows of [R, K]: move the axis last (a transpose unless it is), view the
        # rest as rows (free), and undo both
        (x,) = xs
        need_rank(x, (2, 3, 4, 5, 6), op, span)
        axis, rank = _axis(x, a["axis"], op, span), len(x.shape)
        perm = tuple(k for k in range(rank) if k != axis) + (axis,)
        moved = _permute(el, x, perm, span, path, op)
        rows = _view(el, moved, (math.prod(moved.shape[:-1]), moved.shape[-1]), span, path, op)
        out = _view(el, el.emit(op, (rows,), span, path, op), tuple(moved.shape), span, path, op)
        return _permute(el, out, tuple(perm.index(k) for k in range(rank)), span, path, op)

    return apply


for _name in ("softmax", "log_softmax"):
    builtin(_name, ArgSpec("axis", "int", 1))(_softmax(_name))


@builtin("layer_norm", ArgSpec("eps", "float", 1e-5, low=1e-30))
def layer_norm(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    """nn.LayerNorm(last axis): each vector along the last axis normalised, then scaled by NAME.gamma and shifted
    by NAME.beta (both of the last axis' size)."""
    (x,) = xs
    need_rank(x, (2, 3, 4, 5, 6), "layer_norm", span)
    d = x.shape[-1]
    gamma = el.param(path, "gamma", (d,), ONE, span)
    beta = el.param(path, "beta", (d,), ZERO, span)
    rows = _view(el, x, (math.prod(x.shape[:-1]), d), span, path, "layer_norm")
    out = el.emit("layer_norm", (rows, gamma, beta), span, path, "layer_norm", eps=a["eps"])
    return _view(el, out, tuple(x.shape), span, path, "layer_norm")


# ---- slicing, reductions along axes and explicit broadcasting (issue 34) -----------------------------------


def _float_input(x: TensorVal, what: str, span: Span) -> None:
    if x.value.type.dtype.value != "f32":
        raise DslShapeError(f"{what} expects float data, got {x.value.type} from {x.origin}", span)


def _slice_along(el: Elaborator, x: TensorVal, axis: int, start: int, stop: int, span: Span, kind: str) -> TensorVal:
    if start == 0 and stop == x.shape[axis]:
        return x
    return el.emit("slice", (x,), span, "", kind, axis=axis, start=start, stop=stop)


@builtin("slice", ArgSpec("start", "int"), ArgSpec("end", "int"), ArgSpec("axis", "int", 1), layer=False)
def slice_(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    """x[start:end] along axis; negative positions and axes count from the end (Python's), nothing is clipped."""
    (x,) = xs
    _float_input(x, "slice", span)
    axis = _axis(x, a["axis"], "slice", span)
    size = x.shape[axis]
    at = {}
    for key in ("start", "end"):
        v = a[key]
        at[key] = v + size if v < 0 else v
        if not 0 <= at[key] <= size:
            raise DslShapeError(f"slice: {key} {v} is out of range for axis {axis} of size {size} "
                                f"({x.value.type} from {x.origin})", span)  # fmt: skip
    if at["start"] >= at["end"]:
        shape = ", ".join(map(str, x.shape))
        raise DslShapeError(f"slice: {a['start']}:{a['end']} along axis {axis} of [{shape}] is empty", span,
                            hint="start must come before end (negative positions count from the end)")  # fmt: skip
    return _slice_along(el, x, axis, at["start"], at["end"], span, "slice")


@builtin("chunk", ArgSpec("i", "int", low=0), ArgSpec("parts", "int", low=1), ArgSpec("axis", "int", 1), layer=False)
def chunk(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    """Part i (from 0) of `parts` equal parts along axis (the language has no tuples of tensors to return all)."""
    (x,) = xs
    _float_input(x, "chunk", span)
    axis = _axis(x, a["axis"], "chunk", span)
    size, parts, i = x.shape[axis], a["parts"], a["i"]
    if size % parts:
        raise DslShapeError(f"chunk: axis {axis} of size {size} does not split into {parts} equal parts "
                            f"({x.value.type} from {x.origin})", span,
                            hint="slice(x, start, end, axis=...) takes any part")  # fmt: skip
    if i >= parts:
        raise DslArgumentError(f"chunk: part {i} of {parts} does not exist (parts count from 0)", span)
    step = size // parts
    return _slice_along(el, x, axis, i * step, (i + 1) * step, span, "chunk")


def _reduce_axes(x: TensorVal, axis: tuple[int, ...] | None, what: str, span: Span) -> tuple[int, ...]:
    """The axes a reduction runs over, each counted from the end when negative; all of them when left out."""
    if axis is None:
        return tuple(range(len(x.shape)))
    out: list[int] = []
    for k in axis:
        j = _axis(x, k, what, span)
        if j in out:
            raise DslArgumentError(f"{what}: axis {j} is given twice (as {k})", span)
        out.append(j)
    return tuple(sorted(out))


def _along_axes(what: str) -> Apply:
    def apply(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
        (x,) = xs
        _float_input(x, what, span)
        axes = _reduce_axes(x, a["axis"], what, span)
        if not axes:  # a scalar reduced over all (no) axes is itself
            return x
        if what == "max":
            y = el.emit("max_axes", (x,), span, "", what, axes=axes)
        elif len(axes) == len(x.shape):
            y = el.emit("sum", (x,), span, "", what)
        else:
            y = el.emit("sum_axes", (x,), span, "", what, axes=axes)
        if what == "mean":
            y = el.emit("mul_scalar", (y,), span, "", what, value=1.0 / math.prod(x.shape[k] for k in axes))
        if a["keepdim"]:
            y = _view(el, y, tuple(1 if k in axes else n for k, n in enumerate(x.shape)), span, "", what)
        return y

    return apply


for _name in ("sum", "mean", "max"):
    builtin(_name, ArgSpec("axis", "ints", None), ArgSpec("keepdim", "bool", False), layer=False)(_along_axes(_name))


@builtin("expand", ArgSpec("shape", "ints"), layer=False)
def expand(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    """Explicit broadcasting: the size-1 axes of x repeated to `shape` (same rank; -1 keeps an axis' size)."""
    (x,) = xs
    _float_input(x, "expand", span)
    want, have = a["shape"], x.shape
    if len(want) != len(have):
        hint = "expand keeps the rank: reshape first to add size-1 axes"
        raise DslShapeError(f"expand: {x.value.type} has {len(have)} axes, the shape {want} has {len(want)}", span,
                            notes=_notes(x), hint=hint)  # fmt: skip
    shape = []
    for k, (n, m) in enumerate(zip(have, want)):
        if m == -1:
            m = n
        if m < 1:
            raise DslArgumentError(f"expand: size {m} for axis {k}; a size is at least 1, or -1 (keep it)", span)
        if n != m and n != 1:
            raise DslShapeError(f"expand: axis {k} of {x.value.type} has size {n}, not 1, so it cannot grow to {m}",
                                span, notes=_notes(x))  # fmt: skip
        shape.append(m)
    if tuple(shape) == tuple(have):
        return x
    return el.emit("expand", (x,), span, "", "expand", shape=tuple(shape))


# ---- the 1-D convolution family (issue 34): views of the 2-D layers on [N, C, 1, L] ----------------------------


@builtin(
    "conv1d",
    ArgSpec("out", "int", low=1),
    ArgSpec("kernel", "int", low=1),
    ArgSpec("stride", "int", 1, low=1),
    ArgSpec("pad", "ints", 0, low=0),
    ArgSpec("dilation", "int", 1, low=1),
    ArgSpec("groups", "int", 1, low=1),
    ArgSpec("bias", "bool", True),
    ArgSpec("init", "init", HE),
    ArgSpec("bias_init", "init", ZERO),
)
def conv1d(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    # [N, C, L] -> [N, out, L'], weight NAME.W [out, C/groups, k] (nn.Conv1d's layout), as conv2d on [N, C, 1, L]
    # with the weight viewed as [out, C/groups, 1, k]
    (x,) = xs
    need_rank(x, (3,), "conv1d", span, "conv1d works on [N, C, L] sequences")
    c, g = x.shape[1], a["groups"]
    if c % g:
        raise DslShapeError(f"conv1d: groups={g} does not divide the {c} input channels of {x.origin}", span)
    w = el.param(path, "W", (a["out"], c // g, a["kernel"]), a["init"], span)
    w4 = el.emit("reshape", (w,), span, path, "conv1d", shape=(a["out"], c // g, 1, a["kernel"]))
    two_d = dict(a, stride=(1, a["stride"]), dilation=(1, a["dilation"]))
    y = _conv_with(el, path, convs.as_image(el, x, span, path, "conv1d"), w4, two_d, span, "conv1d")
    return convs.as_sequence(el, y, span, path, "conv1d")


for _op, _what in (("max_pool2d", "max_pool1d"), ("avg_pool2d", "avg_pool1d")):
    builtin(
        _what,
        ArgSpec("kernel", "int", low=1),
        ArgSpec("stride", "int", None, low=1),
        ArgSpec("pad", "ints", 0, low=0),
        ArgSpec("ceil_mode", "bool", False),
    )(_pool(_op, _what))


# ---- losses, class weights and label smoothing, sampling (issue 34) -----------------------------------------------
# Each loss is one `indexed` statement (frontend/losses.py: an index expression reduced to a scalar), so its NumPy,
# Java and CUDA code and its gradient come from the index form; `normal` and `uniform` are lowered to draws from the
# seeded stream in training and to their mean in inference (ops/random.py).


def _loss_pair(what: str, xs: tuple[TensorVal, ...], span: Span, target_kind: str = "target") -> None:
    pred, target = xs
    for v, role in ((pred, "prediction"), (target, target_kind)):
        if v.value.type.dtype.value != "f32":
            raise DslShapeError(f"{what}: the {role} must be float, got {v.value.type} from {v.origin}", span,
                                notes=_notes(pred, target))  # fmt: skip
    if pred.shape != target.shape:
        raise DslShapeError(f"{what}: prediction {pred.value.type} and target {target.value.type} differ in shape",
                            span, notes=_notes(pred, target))  # fmt: skip


def _indexed_loss(el: Elaborator, what: str, xs: tuple[TensorVal, ...], body: Any, span: Span, path: str) -> TensorVal:
    out, expr = body
    return el.emit("indexed", xs, span, path, what, out=out, body=expr)


@builtin("l1", inputs=2, layer=False)
def l1(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    from deepdsl.frontend import losses

    _loss_pair("l1", xs, span)
    return _indexed_loss(el, "l1", xs, losses.l1(tuple(xs[0].shape)), span, path)


@builtin("huber", ArgSpec("delta", "float", 1.0, low=1e-30), inputs=2, layer=False)
def huber(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    from deepdsl.frontend import losses

    _loss_pair("huber", xs, span)
    return _indexed_loss(el, "huber", xs, losses.huber(tuple(xs[0].shape), a["delta"]), span, path)


@builtin("bce_with_logits", inputs=2, layer=False)
def bce_with_logits(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    from deepdsl.frontend import losses

    _loss_pair("bce_with_logits", xs, span)
    return _indexed_loss(el, "bce_with_logits", xs, losses.bce_with_logits(tuple(xs[0].shape)), span, path)


def _rows_and_labels(what: str, scores: TensorVal, labels: TensorVal, span: Span, per_position: bool) -> int:
    """Check scores [N, K] (or [N, T, K] with per_position) against int labels [N] ([N, T]); returns K."""
    ranks = (2, 3) if per_position else (2,)
    if scores.value.type.dtype.value != "f32" or len(scores.shape) not in ranks:
        want = "[N, K] (or [N, T, K])" if per_position else "[N, K]"
        raise DslShapeError(f"{what} expects float {want} scores, got {scores.value.type} from {scores.origin}", span)
    if labels.value.type.dtype.value != "i64" or tuple(labels.shape) != tuple(scores.shape[:-1]):
        want = ", ".join(map(str, scores.shape[:-1]))
        raise DslShapeError(f"{what}: labels must be int [{want}] for scores {scores.value.type}, got "
                            f"{labels.value.type} from {labels.origin}", span,
                            notes=_notes(scores, labels))  # fmt: skip
    k = scores.shape[-1]
    if labels.classes is not None and labels.classes != k:
        raise DslShapeError(f"{what}: {scores.origin} gives {k} scores, but {labels.origin} has {labels.classes} "
                            "classes", span)  # fmt: skip
    return k


def _weighted_nll(el: Elaborator, what: str, lp: TensorVal, labels: TensorVal, a: Args, span: Span,
                  path: str) -> TensorVal:  # fmt: skip
    """The weighted, smoothed negative log-likelihood of log-probabilities lp [..., K] and labels [...]."""
    from deepdsl.frontend import losses

    k = lp.shape[-1]
    weight = a.get("weight")
    if weight is not None and len(weight) != k:
        raise DslShapeError(f"{what}: weight= gives {len(weight)} class weights, but there are {k} classes", span)
    rows = math.prod(lp.shape[:-1])
    lp2 = _view(el, lp, (rows, k), span, path, what)
    y2 = _view(el, labels, (rows,), span, path, what)
    body = losses.nll(rows, k, weight, a.get("ignore_index", -100), a.get("label_smoothing", 0.0))
    return _indexed_loss(el, what, (lp2, y2), body, span, path)


_WEIGHT = ArgSpec("weight", "floats", None, low=0.0, keyword=True)


def _accept_ignored(el: Elaborator, labels: TensorVal, ignore: int, span: Span) -> None:
    """Let the data of label `labels` hold `ignore` besides its class ids (a value in [0, K) already is one): the
    label's InputDef records it, and the data checks (Python and the Java program) accept it. One label read with
    two different ignored values is an error."""
    k = next((i for i, d in enumerate(el.b.inputs) if d.value == labels.value and d.kind == "label"), None)
    if k is None or (labels.classes is not None and 0 <= ignore < labels.classes):
        return
    d = el.b.inputs[k]
    if d.ignore is not None and d.ignore != ignore:
        raise DslArgumentError(f"nll: label '{d.value.name}' is read with ignore_index={d.ignore} already; one label "
                               f"has one ignored value, not also {ignore}", span)  # fmt: skip
    el.b.inputs[k] = dataclasses.replace(d, ignore=ignore)


_SMOOTHING = ArgSpec("label_smoothing", "float", 0.0, low=0.0, high=1.0, keyword=True)


@builtin("nll", ArgSpec("ignore_index", "int", -100), _WEIGHT, inputs=2, layer=False)
def nll(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    lp, labels = xs
    _rows_and_labels("nll", lp, labels, span, per_position=False)
    _accept_ignored(el, labels, a["ignore_index"], span)
    return _weighted_nll(el, "nll", lp, labels, a, span, path)


def _with_options(op: str, plain: Apply) -> Apply:
    """softmax_cross_entropy / cross_entropy with label_smoothing= and weight=: without them the one library op
    they always were; with them log_softmax (or log) and the weighted, smoothed negative log-likelihood."""

    def apply(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
        if a["label_smoothing"] == 0.0 and a["weight"] is None:
            return plain(el, path, xs, {}, span)
        scores, labels = xs
        _rows_and_labels(op, scores, labels, span, per_position=op == "softmax_cross_entropy")
        k = scores.shape[-1]
        rows = _view(el, scores, (math.prod(scores.shape[:-1]), k), span, path, op)
        lp = el.emit("log_softmax" if op == "softmax_cross_entropy" else "log", (rows,), span, path, op)
        return _weighted_nll(el, op, lp, labels, a, span, path)

    return apply


for _name in ("softmax_cross_entropy", "cross_entropy"):  # the cross-entropies again, with the options
    builtin(_name, _SMOOTHING, _WEIGHT, inputs=2, layer=False)(_with_options(_name, BUILTINS[_name].apply))


def _sample_shape(what: str, a: Args, span: Span) -> tuple[int, ...]:
    shape = tuple(a["shape"])
    if math.prod(shape) > 2**31 - 2**24:
        raise DslShapeError(f"{what}: the shape {list(shape)} has more elements than a tensor may hold", span)
    return shape


@builtin("normal", ArgSpec("shape", "ints", low=1), inputs=0)
def normal(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    """Standard normal samples of `shape`, drawn each training step from the seeded stream of the call's path;
    in inference their mean, 0 (ops/random.py)."""
    return el.emit("sample_normal", (), span, path, "normal", shape=_sample_shape("normal", a, span), site=path)


@builtin("uniform", ArgSpec("shape", "ints", low=1), ArgSpec("low", "float", 0.0), ArgSpec("high", "float", 1.0),
         inputs=0)  # fmt: skip
def uniform(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    """Samples uniform in [low, high) of `shape`, each training step; in inference their mean (low + high) / 2."""
    if not a["low"] < a["high"]:
        raise DslArgumentError(f"uniform: low={a['low']:g} must be below high={a['high']:g}", span)
    shape = _sample_shape("uniform", a, span)
    return el.emit("sample_uniform", (), span, path, "uniform", shape=shape, site=path, low=a["low"], high=a["high"])


# ---- activations, group and instance norm, adaptive pooling (issue 34) ------------------------------------------

_simple("hard_swish")
_simple("silu")


@builtin(
    "clip",
    ArgSpec("low", "float", low=-FLOAT32_MAX, high=FLOAT32_MAX),
    ArgSpec("high", "float", low=-FLOAT32_MAX, high=FLOAT32_MAX),
)
def clip(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    """torch.clamp(x, low, high), ONNX Clip; no gradient at the bounds (torch 2.15's, ops/elementwise.py)."""
    if a["low"] > a["high"]:
        raise DslArgumentError(f"clip: low={a['low']} is above high={a['high']}", span)
    return el.emit("clip", xs, span, path, "clip", low=a["low"], high=a["high"])


@builtin("relu6")
def relu6(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    """F.relu6, F.hardtanh(x, 0, 6): no gradient at 0 and 6."""
    return el.emit("clip", xs, span, path, "relu6", low=0.0, high=6.0)


@builtin(
    "hard_sigmoid",
    ArgSpec("alpha", "float", 1 / 6, low=1e-6, high=1e6),
    ArgSpec("beta", "float", 0.5, low=-1e6, high=1e6),
)
def hard_sigmoid(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    """max(0, min(1, alpha x + beta)), written alpha clip(x + beta / alpha, 0, 1 / alpha): with PyTorch's alpha 1/6
    and beta 1/2, F.hardsigmoid's min(max(x + 3, 0), 6) / 6, its bounds -3 and 3 exact, where no gradient passes
    (hardsigmoid_backward)."""
    alpha, beta = a["alpha"], a["beta"]
    y = xs[0]
    if beta != 0:
        y = el.emit("add_scalar", (y,), span, path, "hard_sigmoid", value=beta / alpha)
    y = el.emit("clip", (y,), span, path, "hard_sigmoid", low=0.0, high=1 / alpha)
    return el.emit("mul_scalar", (y,), span, path, "hard_sigmoid", value=alpha)


def _group_rows(el: Elaborator, path: str, x: TensorVal, groups: int, eps: float, affine: bool, kind: str,
                span: Span) -> TensorVal:  # fmt: skip
    """x [N, C, ...] normalised over each of `groups` groups of channels of each sample (the rows of the view
    [N·groups, C/groups·S], layer norm's rows op), then, with `affine`, scaled by NAME.gamma [C] and shifted by
    NAME.beta [C] per channel."""
    n, ch = x.shape[0], x.shape[1]
    rows = _view(el, x, (n * groups, math.prod(x.shape) // (n * groups)), span, path, kind)
    y = _view(el, el.emit("layer_norm_rows", (rows,), span, path, kind, eps=eps), tuple(x.shape), span, path, kind)
    if affine:
        gamma = el.param(path, "gamma", (ch,), ONE, span)
        beta = el.param(path, "beta", (ch,), ZERO, span)
        scale = el.emit("broadcast_channel", (gamma,), span, path, kind, shape=tuple(x.shape))
        y = el.emit("bias_add", (el.emit("mul", (y, scale), span, path, kind), beta), span, path, kind)
    return y


@builtin("group_norm", ArgSpec("groups", "int", low=1), ArgSpec("eps", "float", 1e-5, low=1e-30),
         ArgSpec("affine", "bool", True))  # fmt: skip
def group_norm(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    """nn.GroupNorm(groups, C): the same in training and inference (no running statistics)."""
    (x,) = xs
    need_rank(x, (2, 3, 4, 5, 6), "group_norm", span, "group_norm works on [N, C, ...]")
    if x.shape[1] % a["groups"]:
        raise DslShapeError(f"group_norm: groups={a['groups']} does not divide the {x.shape[1]} channels of "
                            f"{x.value.type} from {x.origin}", span)  # fmt: skip
    return _group_rows(el, path, x, a["groups"], a["eps"], a["affine"], "group_norm", span)


@builtin("instance_norm", ArgSpec("eps", "float", 1e-5, low=1e-30), ArgSpec("affine", "bool", False))
def instance_norm(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    """nn.InstanceNorm1d/2d/3d (track_running_stats=False): each channel of each sample over its positions."""
    (x,) = xs
    need_rank(x, (3, 4, 5, 6), "instance_norm", span, "instance_norm works on [N, C, L] or [N, C, H, W]")
    if math.prod(x.shape[2:]) == 1:
        raise DslShapeError(f"instance_norm: {x.value.type} from {x.origin} has one position per channel, which "
                            "normalises to 0 (PyTorch refuses it too)", span)  # fmt: skip
    return _group_rows(el, path, x, x.shape[1], a["eps"], a["affine"], "instance_norm", span)


@builtin("adaptive_avg_pool", ArgSpec("size", "pair", low=1))
def adaptive_avg_pool(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    """nn.AdaptiveAvgPool2d(size): output (i, j) averages rows ⌊i·H/oh⌋ .. ⌈(i+1)·H/oh⌉ - 1 and the same of the
    columns. Where oh divides H and ow divides W, avg_pool2d (global_avg_pool to 1x1); else the separable map along
    each axis (ops/adaptive_pool.py), whose windows differ in length and may overlap."""
    (x,) = xs
    need_rank(x, (4,), "adaptive_avg_pool", span, "adaptive_avg_pool works on [N, C, H, W] images")
    (h, w), (oh, ow) = x.shape[2:], a["size"]
    if (oh, ow) == (1, 1):
        return el.emit("global_avg_pool", xs, span, path, "adaptive_avg_pool")
    if h % oh == 0 and w % ow == 0:
        k = (h // oh, w // ow)
        return el.emit("avg_pool2d", xs, span, path, "adaptive_avg_pool", kernel=k, stride=k, pad=(0, 0))
    for axis, size in ((2, oh), (3, ow)):
        if x.shape[axis] != size:
            x = el.emit("adaptive_pool_axis", (x,), span, path, "adaptive_avg_pool", axis=axis, size=size)
    return x


# ---- recurrent layers: lstm, gru (deepdsl/frontend/recurrent.py registers them here) ------------------
import deepdsl.frontend.recurrent  # noqa: E402, F401  (the module registers its built-ins in BUILTINS)
