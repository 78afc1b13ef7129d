"""The losses written as index expressions (issue 34): `l1`, `huber`, `bce_with_logits`, and the negative
log-likelihood with class weights, an ignored label and label smoothing that `nll`, and `softmax_cross_entropy` /
`cross_entropy` with `weight=` or `label_smoothing=`, compile to.

Each loss is one `indexed` statement (the op of tensor functions, ops/indexed.py) whose output is a scalar: a sum
over every index of its inputs divided by a count. So it has what a tensor function has without a line of its own
in any backend: the NumPy runner evaluates it, its gradient is derived symbolically (ir/index_grad.py), the Java
program and the CUDA kernels are printed from it, fusion and the memory plan treat it like any other statement.
Each function returns the statement's `out` (empty: a scalar) and `body`; its inputs are read as Read(0), Read(1).
PyTorch's definitions (mean reduction) are the reference; scripts/pytorch_losses.py compares the two.
"""

from __future__ import annotations

from deepdsl.ir.indexexpr import IE, Affine, Apply, Const, Read, Reduce, Var

Body = tuple[tuple[tuple[str, int], ...], IE]


def _ap(fn: str, *args: IE) -> IE:
    return Apply(fn, tuple(args))


def _c(v: float) -> IE:
    return Const(float(v))


def _mean_over(shape: tuple[int, ...], element: IE) -> Body:
    """The mean of `element` (an expression over the index variables e0, e1, ...) over every index of `shape`."""
    count = 1
    for n in shape:
        count *= n
    total = Reduce("sum", tuple((f"e{k}", n) for k, n in enumerate(shape)), element)
    return (), _ap("/", total, _c(count))


def _at(k: int, rank: int) -> IE:
    return Read(k, tuple(Affine.var(f"e{j}") for j in range(rank)))


def l1(shape: tuple[int, ...]) -> Body:
    """mean |pred - target| (F.l1_loss); its gradient at pred = target is 0, as PyTorch's sign(0)."""
    d = _ap("-", _at(0, len(shape)), _at(1, len(shape)))
    return _mean_over(shape, _ap("abs", d))


def huber(shape: tuple[int, ...], delta: float) -> Body:
    """mean of 0.5 d² where |d| < delta, else delta · (|d| − delta / 2), d = pred − target (F.huber_loss)."""
    d = _ap("-", _at(0, len(shape)), _at(1, len(shape)))
    a = _ap("abs", d)
    inside = _ap("*", _c(0.5), _ap("*", d, d))
    outside = _ap("*", _c(delta), _ap("-", a, _c(0.5 * delta)))
    return _mean_over(shape, _ap("select", _ap("<", a, _c(delta)), inside, outside))


def bce_with_logits(shape: tuple[int, ...]) -> Body:
    """mean of softplus(x) − x·t (F.binary_cross_entropy_with_logits), softplus(x) = max(x, 0) + log(1 + exp(−|x|))
    with −|x| written min(−x, x): exp never overflows, in the value or in its gradient (no branch holds an infinity
    that a zero factor would turn into a NaN), and at x = 0 the two ties give slopes 1 and −1/2, so the gradient
    is σ(x) − t there too."""
    x, t = _at(0, len(shape)), _at(1, len(shape))
    softplus = _ap("+", _ap("max", x, _c(0)), _ap("log", _ap("+", _c(1), _ap("exp", _ap("min", _ap("neg", x), x)))))
    return _mean_over(shape, _ap("-", softplus, _ap("*", x, t)))


def _class_weight(k: IE, weight: tuple[float, ...], ignore: int, lo: int = 0, hi: int | None = None) -> IE:
    """The weight of class k (an index variable) as a balanced tree of selects on k; the ignored class weighs 0."""
    hi = len(weight) if hi is None else hi
    if hi - lo == 1:
        return _c(0.0 if lo == ignore else weight[lo])
    mid = (lo + hi) // 2
    left, right = _class_weight(k, weight, ignore, lo, mid), _class_weight(k, weight, ignore, mid, hi)
    return left if left == right else _ap("select", _ap("<", k, _c(mid)), left, right)


def nll(rows: int, classes: int, weight: tuple[float, ...] | None, ignore: int, smoothing: float) -> Body:
    """PyTorch's F.nll_loss (and F.cross_entropy after log_softmax) of log-probabilities lp [R, K] (Read 0) and
    int labels y [R] (Read 1), mean reduction:

        ((1 − ε) Σ_n w[y_n] · (−lp[n, y_n]) + ε/K Σ_n Σ_k w[k] · (−lp[n, k])) / Σ_n w[y_n]

    over the rows whose label is not `ignore` (w = 1 without weights; ε = `smoothing`). Every row ignored is 0 / 0,
    a NaN, as in PyTorch. The label is compared with each class (a one-hot reduction, as embedding's index form)."""
    w = _class_weight(Var("k"), weight or (1.0,) * classes, ignore)
    y = Read(1, (Affine.var("n"),))
    lp = Read(0, (Affine.var("n"), Affine.var("k")))
    hit = _ap("==", y, Var("k"))
    picked = _ap("select", hit, _ap("*", w, _ap("neg", lp)), _c(0))
    count = _ap("select", hit, w, _c(0))
    grid = (("n", rows), ("k", classes))
    top = _ap("*", _c(1.0 - smoothing), Reduce("sum", grid, picked)) if smoothing < 1.0 else None
    if smoothing > 0.0:
        kept = _ap("!=", y, _c(ignore))
        # every class takes its share of a kept row's smoothing, the ignored class too (its weight is not zeroed)
        share = _ap("neg", lp) if weight is None else _ap("*", _class_weight(Var("k"), weight, -1), _ap("neg", lp))
        spread = _ap("select", kept, share, _c(0))
        smooth = _ap("*", _c(smoothing / classes), Reduce("sum", grid, spread))
        top = smooth if top is None else _ap("+", top, smooth)
    assert top is not None
    return (), _ap("/", top, Reduce("sum", grid, count))
