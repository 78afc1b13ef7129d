"""The built-in layers with parameters: the convolutions `conv`, `conv_transpose` and `conv1d`, `full` (also as a
head tied to an embedding's table, `full(tied=tok)`), `embedding`, and the normalisations `batch_norm`, `layer_norm`,
`group_norm` and `instance_norm`.

Each makes its parameters under the layer's path (`el.param`: NAME.W, NAME.b, NAME.gamma, ...) and emits registry
ops; the convolutions' asymmetric padding and the 1-D layers' views are composed in frontend/convs.py.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from deepdsl.errors import DslArgumentError, DslProgramError, DslShapeError, Note, Span
from deepdsl.frontend import convs
from deepdsl.frontend.builtins import HE, ONE, ZERO, Args, ArgSpec, builtin, need_rank, origin_notes, view
from deepdsl.frontend.values import Spec, TensorVal

if TYPE_CHECKING:
    from deepdsl.frontend.elaborate import Elaborator


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


@builtin("conv", *CONV_ARGS, params=True)
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


@builtin("conv_transpose", *CONV_ARGS, ArgSpec("output_padding", "pair", 0, low=0), params=True)
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
    ArgSpec("out", "int", None, low=1),  # required, but for a tied head (the table's rows)
    ArgSpec("bias", "bool", True),
    ArgSpec("init", "init", None),  # he() where left out; a tied head has the table's
    ArgSpec("bias_init", "init", ZERO),
    ArgSpec("tied", "table", None, keyword=True),  # by name only: full(tied=tok)
    params=True,
)
def full(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    # nn.Linear: over the last axis of any rank (issue 34), the leading axes viewed as rows and back (free views)
    (x,) = xs
    need_rank(x, (2, 3, 4, 5, 6), "full", span, "full works on [N, D] rows, or on the last axis of [N, ..., D]")
    d = x.shape[-1]
    if a["tied"] is not None:
        w = tied_table(el, a, x, span)
    elif a["out"] is None:
        hint = "full(out, bias=..., init=..., bias_init=...), or full(tied=EMBEDDING)"
        raise DslArgumentError("full needs its argument 'out'", span, hint=hint)
    else:
        w = el.param(path, "W", (a["out"], d), a["init"] or HE, span)
    out = w.shape[0]
    rows = view(el, x, (math.prod(x.shape[:-1]), d), span, path, "full")
    y = el.emit("linear", (rows, w), span, path, "full")
    if a["bias"]:
        b = el.param(path, "b", (out,), a["bias_init"], span)
        y = el.emit("bias_add", (y, b), span, path, "full")
    return view(el, y, (*x.shape[:-1], out), span, path, "full")


def tied_table(el: Elaborator, a: Args, x: TensorVal, span: Span) -> TensorVal:
    """The weight of a head tied to an embedding (`full(h, tied=tok)`, GPT-2's logits = h @ wte.T): the table
    `tok.W` [V, D] itself, the parameter that embedding made, so that the program reads one parameter twice and its
    gradient is the sum of both uses; the head's output is V wide. The embedding must be applied first (its table
    is made there)."""
    tok = a["tied"]
    table = el.params.made(f"{tok.path}.W")
    if table is None:
        raise DslProgramError(
            f"full(tied={tok.path}): the embedding '{tok.path}' is applied nowhere before this head, so it has no "
            "table yet", span, notes=[Note(f"'{tok.path}' is bound here", tok.span)],
            hint=f"apply the embedding first ({tok.path}(tokens)); the head reads its table",
        )  # fmt: skip
    v, dim = table.shape
    if a["init"] is not None:
        raise DslArgumentError(f"full(tied={tok.path}) takes no init=: its weight is the table {tok.path}.W", span)
    if a["out"] is not None and a["out"] != v:
        raise DslShapeError(
            f"full(tied={tok.path}): out={a['out']}, but the table {tok.path}.W has {v} rows (its vocab)",
            span,
            hint="leave out `out`: a tied head is as wide as the vocabulary",
        )
    if x.shape[-1] != dim:
        raise DslShapeError(
            f"full(tied={tok.path}): the input's last axis is {x.shape[-1]} ({x.value.type} from {x.origin}), but the "
            f"table {tok.path}.W is {table.value.type}: a tied head reads rows of width {dim}", span,
            notes=[*origin_notes(x), Note(f"'{tok.path}' is bound here", tok.span)],
        )  # fmt: skip
    return table


@builtin(
    "batch_norm",
    ArgSpec("eps", "float", 1e-5, low=1e-30),
    ArgSpec("momentum", "float", 0.1, low=0.0, high=1.0),  # PyTorch's: the weight of the batch's statistics
    ArgSpec("affine", "bool", True),
    params=True,
)
def batch_norm(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    # [N, C] (BatchNorm1d on features), [N, C, L] (BatchNorm1d on sequences: viewed as [N, C, L, 1], issue 34),
    # [N, C, H, W] (BatchNorm2d): the statistics of each channel over every other axis
    (x,) = xs
    need_rank(x, (2, 3, 4), "batch_norm", span)
    if len(x.shape) == 3:
        y = batch_norm(el, path, (view(el, x, (*x.shape, 1), span, path, "batch_norm"),), a, span)
        return view(el, y, tuple(x.shape), span, path, "batch_norm")
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
    params=True,
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


# ---- the 1-D convolution (issue 34): a view of conv on [N, C, 1, L] -------------------------------------------


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
    params=True,
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


# ---- layer, group and instance norm (shapes as in PyTorch; group and instance norm: issue 34) --------------------


@builtin("layer_norm", ArgSpec("eps", "float", 1e-5, low=1e-30), params=True)
def layer_norm(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    """nn.LayerNorm(last axis): each vector along the last axis normalised, then scaled by NAME.gamma and shifted
    by NAME.beta (both of the last axis' size)."""
    (x,) = xs
    need_rank(x, (2, 3, 4, 5, 6), "layer_norm", span)
    d = x.shape[-1]
    gamma = el.param(path, "gamma", (d,), ONE, span)
    beta = el.param(path, "beta", (d,), ZERO, span)
    rows = view(el, x, (math.prod(x.shape[:-1]), d), span, path, "layer_norm")
    out = el.emit("layer_norm", (rows, gamma, beta), span, path, "layer_norm", eps=a["eps"])
    return view(el, out, tuple(x.shape), span, path, "layer_norm")


def _group_rows(el: Elaborator, path: str, x: TensorVal, groups: int, eps: float, affine: bool, kind: str,
                span: Span) -> TensorVal:  # fmt: skip
    """x [N, C, ...] normalised over each of `groups` groups of channels of each sample (the rows of the view
    [N·groups, C/groups·S], layer norm's rows op), then, with `affine`, scaled by NAME.gamma [C] and shifted by
    NAME.beta [C] per channel."""
    n, ch = x.shape[0], x.shape[1]
    rows = view(el, x, (n * groups, math.prod(x.shape) // (n * groups)), span, path, kind)
    y = view(el, el.emit("layer_norm_rows", (rows,), span, path, kind, eps=eps), tuple(x.shape), span, path, kind)
    if affine:
        gamma = el.param(path, "gamma", (ch,), ONE, span)
        beta = el.param(path, "beta", (ch,), ZERO, span)
        scale = el.emit("broadcast_channel", (gamma,), span, path, kind, shape=tuple(x.shape))
        y = el.emit("bias_add", (el.emit("mul", (y, scale), span, path, kind), beta), span, path, kind)
    return y


@builtin("group_norm", ArgSpec("groups", "int", low=1), ArgSpec("eps", "float", 1e-5, low=1e-30),
         ArgSpec("affine", "bool", True), params=True)  # fmt: skip
def group_norm(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    """nn.GroupNorm(groups, C): the same in training and inference (no running statistics)."""
    (x,) = xs
    need_rank(x, (2, 3, 4, 5, 6), "group_norm", span, "group_norm works on [N, C, ...]")
    if x.shape[1] % a["groups"]:
        raise DslShapeError(f"group_norm: groups={a['groups']} does not divide the {x.shape[1]} channels of "
                            f"{x.value.type} from {x.origin}", span)  # fmt: skip
    return _group_rows(el, path, x, a["groups"], a["eps"], a["affine"], "group_norm", span)


@builtin("instance_norm", ArgSpec("eps", "float", 1e-5, low=1e-30), ArgSpec("affine", "bool", False), params=True)
def instance_norm(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    """nn.InstanceNorm1d/2d/3d (track_running_stats=False): each channel of each sample over its positions."""
    (x,) = xs
    need_rank(x, (3, 4, 5, 6), "instance_norm", span, "instance_norm works on [N, C, L] or [N, C, H, W]")
    if math.prod(x.shape[2:]) == 1:
        raise DslShapeError(f"instance_norm: {x.value.type} from {x.origin} has one position per channel, which "
                            "normalises to 0 (PyTorch refuses it too)", span)  # fmt: skip
    return _group_rows(el, path, x, x.shape[1], a["eps"], a["affine"], "instance_norm", span)
