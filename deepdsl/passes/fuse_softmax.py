"""Attention's softmax fused with its scaling and causal mask: `softmax(mask(c * s))` → `masked_softmax(s)`.

Attention computes `softmax(q kᵀ · c)` over the keys, and a causal model masks the scores first with an indexed
condition (`j <= i ? s[b, h, i, j] : -inf`, a tensor function: no mask tensor exists). Unfused, the scaled
scores and the masked scores are each a tensor as large as the attention matrix. This rewrite points the
softmax at the unscaled, unmasked scores and folds the scale and the mask into one `masked_softmax` kernel
(ops/loss.py), so neither is stored; `dce` then drops them.

Legal because the chain from the scores to the softmax keeps every element at its flat position: `reshape`
views that keep the row length T, `mul_scalar` by a positive constant, and one mask over the last two axes
[..., i: Tq, j: T] of a tensor whose last axis is the softmax's row. Row r of the softmax is then query
i = r mod Tq (`period`), and the masked elements are exactly j > i. A mask constant of -inf gives them weight 0
exactly; one of -1e9 or below (scaled afterwards by at least 1e-3) gives a weight that underflows to 0 in float32
and float64 alike, so the fused kernel's exact 0 is the same number. The softmax's own gradient reads only its
output, and the mask's and the scale's gradients read only the incoming gradient, so the backward pass still
finds every value it reads.

Then the mask's gradient goes (`drop_mask_gradients`). Autodiff of `j <= i ? s : -inf` gives
`ds = dm · (j <= i ? 1 : 0)`, a kernel and a tensor as large as the attention matrix; when dm is
`softmax_backward(y, g) = y · (g − Σ g·y)` of the causal masked_softmax y, read through views that keep the row
length T, with the mask's rows Tq equal to the softmax's period, the masked elements of dm are exactly those where
y is 0, and there y · (g − Σ) is already ±0 (NaN where g or the row's sum is not finite, which the mask's
multiply by 0 keeps NaN). At the kept elements the mask multiplies by 1. So ds equals dm bit for bit in the
multiply form autodiff writes; in the select form (`j <= i ? dm : 0`, also accepted) a masked element may be −0
or NaN where the select gave +0, which no reader tells apart (a sum adds ±0 alike, and a NaN there means the
row's kept elements are NaN already). Every reader of ds reads dm instead. The NumPy, Java and CUDA kernels of
softmax_backward all compute y · (g − Σ), and
masked_softmax writes an exact 0 at every masked element.
"""

from __future__ import annotations

from deepdsl.ir import Graph, Stmt, Value
from deepdsl.ir.analysis import returned, uses
from deepdsl.ir.graph import make_attrs
from deepdsl.ir.indexexpr import IE, Apply, Const, Read, Var
from deepdsl.passes.rewrite import apply_rules

# a mask constant this negative, scaled by at least MIN_SCALE, leaves exp() nothing but 0 (see the docstring)
MASK_LIMIT = -1e9
MIN_SCALE = 1e-3


def fuse_softmax(g: Graph) -> Graph:
    return drop_mask_gradients(fold_into_softmax(g))


def fold_into_softmax(g: Graph) -> Graph:
    """softmax(mask(c * s)) -> masked_softmax(s), the scale and the mask as its attributes."""
    defs = {s.out.name: s for s in g.stmts}
    count, pinned = uses(g), returned(g)
    changed: dict[str, Stmt] = {}  # result name -> its rewritten statement
    for s in g.stmts:
        if s.op != "softmax":
            continue
        rewrite = _fused(s, defs, count, pinned)
        if rewrite is not None:
            for new in rewrite:
                changed[new.out.name] = new
    if not changed:
        return g
    return g.replace(stmts=tuple(changed.get(s.out.name, s) for s in g.stmts))


def _fused(s: Stmt, defs: dict[str, Stmt], count: dict[str, int], pinned: set[str]) -> list[Stmt] | None:
    """The softmax `s` as a masked_softmax (and the rows view it then reads), or None when nothing folds in."""
    rows, cols = s.out.type.shape
    view = defs.get(s.inputs[0].name)
    if view is not None and view.op == "reshape" and count.get(view.out.name) == 1 and view.out.name not in pinned:
        v = view.inputs[0]  # the view of the scores as rows, which the fused softmax will read the scores through
    else:
        view, v = None, s.inputs[0]
    scale, after_mask, causal, period = 1.0, 1.0, False, 1
    while (p := defs.get(v.name)) is not None and p.out.type.shape[-1:] == (cols,):
        if p.op == "reshape" and p.inputs[0].type.shape[-1:] == (cols,):
            v = p.inputs[0]
        elif p.op == "mul_scalar" and p.a["value"] > 0:
            scale *= p.a["value"]
            after_mask *= 1.0 if causal else p.a["value"]
            v = p.inputs[0]
        elif not causal and (mask := _causal_mask(p)) is not None and mask * after_mask <= MASK_LIMIT * MIN_SCALE:
            causal, period = True, p.out.type.shape[-2]
            v = p.inputs[0]
        else:
            break
    if v.name == s.inputs[0].name or (view is not None and v.name == view.inputs[0].name):
        return None  # nothing folded in
    attrs = make_attrs(scale=scale, causal=causal, period=period)
    if v.type.shape == (rows, cols):
        return [s.replace(op="masked_softmax", inputs=(v,), attrs=attrs)]
    if view is None:
        return None  # the scores would need a view of their own
    return [view.replace(inputs=(v,)), s.replace(op="masked_softmax", inputs=(view.out,), attrs=attrs)]


def drop_mask_gradients(g: Graph) -> Graph:
    """Every reader of the causal mask's gradient reads the masked softmax's gradient instead (see the docstring)."""
    return apply_rules(g, [_masked_already], max_rounds=1)


def _masked_already(s: Stmt, defs: dict[str, Stmt]) -> Value | None:
    """`s`'s input when `s` is `x · (j <= i ? 1 : 0)` over x's shape [..., Tq, T] and x is, through views that keep
    the row length T, softmax_backward of a causal masked_softmax whose period is Tq; else None."""
    if s.op not in ("indexed", "fused") or len(s.inputs) != 1 or s.inputs[0].type != s.out.type or s.out.type.rank < 2:
        return None
    names = tuple(name for name, _ in s.a["out"])
    if not _keeps_where_causal(s.a["body"], names):
        return None
    tq, cols = s.out.type.shape[-2:]
    grad = _through_views(s.inputs[0], defs, cols)
    if grad is None or grad.op != "softmax_backward":
        return None
    y = _through_views(grad.inputs[0], defs, cols)
    if y is None or y.op != "masked_softmax" or not y.a["causal"] or y.a["period"] != tq:
        return None
    return s.inputs[0]


def _through_views(v: Value, defs: dict[str, Stmt], cols: int) -> Stmt | None:
    """The statement that computes `v`, past reshapes whose input keeps the last axis `cols`."""
    p = defs.get(v.name)
    while p is not None and p.op == "reshape" and p.inputs[0].type.shape[-1:] == (cols,):
        p = defs.get(p.inputs[0].name)
    return p if p is not None and p.out.type.shape[-1:] == (cols,) else None


def _keeps_where_causal(body: IE, names: tuple[str, ...]) -> bool:
    """Whether `body` is x[...] · (j <= i ? 1 : 0) (either order, or j <= i ? x[...] : 0, or the conditions
    `_causal_condition` takes), x read in place, i and j the last two indices."""
    zero, one = Const(0.0), Const(1.0)
    if isinstance(body, Apply) and body.fn == "*":
        for x, m in (body.args, body.args[::-1]):
            if _reads_in_place(x, names) and isinstance(m, Apply) and m.fn == "select":
                cond, then, other = m.args
                if (keep := _causal_condition(cond, names)) is not None:
                    return (then, other) == ((one, zero) if keep else (zero, one))
        return False
    if isinstance(body, Apply) and body.fn == "select":
        cond, then, other = body.args
        keep = _causal_condition(cond, names)
        if keep is not None and not keep:
            then, other = other, then
        return keep is not None and _reads_in_place(then, names) and other == zero
    return False


def _causal_condition(cond: IE, names: tuple[str, ...]) -> bool | None:
    """True for j <= i (or i >= j), False for its negation j > i (or i < j), None otherwise; i, j the last two
    of `names`."""
    i, j = Var(names[-2]), Var(names[-1])
    if cond in (Apply("<=", (j, i)), Apply(">=", (i, j))):
        return True
    if cond in (Apply(">", (j, i)), Apply("<", (i, j))):
        return False
    return None


def _causal_mask(p: Stmt) -> float | None:
    """The constant of the masked elements when `p` is `j <= i ? x[.., i, j] : c` over its own shape, with i and j
    its last two indices (also written `i >= j`, or `j > i ? c : x[...]`, `i < j ? c : x[...]`); else None."""
    if p.op not in ("indexed", "fused") or len(p.inputs) != 1 or p.inputs[0].type != p.out.type or p.out.type.rank < 2:
        return None
    names = tuple(name for name, _ in p.a["out"])
    body: IE = p.a["body"]
    if not (isinstance(body, Apply) and body.fn == "select"):
        return None
    cond, then, other = body.args
    keep = _causal_condition(cond, names)
    if keep is False:
        then, other = other, then
    if keep is None or not _reads_in_place(then, names):
        return None
    value = _constant(other)
    return value if value is not None and value <= MASK_LIMIT else None


def _reads_in_place(e: IE, names: tuple[str, ...]) -> bool:
    return isinstance(e, Read) and e.input == 0 and tuple(a.plain_var for a in e.index) == names


def _constant(e: IE) -> float | None:
    if isinstance(e, Const):
        return e.value
    if isinstance(e, Apply) and e.fn == "neg" and isinstance(e.args[0], Const):
        return -e.args[0].value
    return None
