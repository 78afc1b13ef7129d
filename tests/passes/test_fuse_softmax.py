"""Attention's softmax fused with its scaling and causal mask (passes/fuse_softmax.py): the optimised program of
a causal attention holds one masked_softmax and no tensor of scaled or masked scores, and computes the same
numbers; a mask or scale the rewrite cannot prove equal is left alone. The mask's gradient goes after a causal
masked_softmax (its backward is already 0 there), with the same numbers bit for bit, and stays elsewhere."""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import ROOT, feeds_and_params
from transformer_nets import ATTENTION, CAUSAL

from deepdsl import api
from deepdsl.backends.numpy_runner import run
from deepdsl.ir import Graph
from deepdsl.ir.indexexpr import Apply, Const, Reduce
from deepdsl.passes.fuse_softmax import drop_mask_gradients, fold_into_softmax, fuse_softmax


def _program(mask: str = CAUSAL, scale: str = "0.5") -> str:
    return ATTENTION.format(mask=mask, scale=scale)


def compile_text(text: str, stop_at: str) -> api.Compilation:
    return api.compile_source(text, "causal.ddsl", None, stop_at)


def _constants(e: object) -> list[float]:
    if isinstance(e, Const):
        return [e.value]
    if isinstance(e, Apply):
        return [c for a in e.args for c in _constants(a)]
    if isinstance(e, Reduce):
        return _constants(e.body)
    return []


def test_the_optimised_program_holds_one_masked_softmax_and_no_masked_scores() -> None:
    opt = compile_text(_program(), stop_at="opt").opt
    fused = [s for s in opt.stmts if s.op == "masked_softmax"]
    assert len(fused) == 1 and fused[0].a == {"scale": 0.5, "causal": True, "period": 5}
    assert not any(s.op == "softmax" for s in opt.stmts)
    # the mask costs no tensor: no statement computes -inf scores, none stores the scaled ones
    assert not any(-math.inf in _constants(s.a.get("body")) for s in opt.stmts if "body" in s.a)
    # the fused kernel reads the product q k^T itself, through the view of its rows, which nothing else reads
    view = next(s for s in opt.stmts if s.out.name == fused[0].inputs[0].name)
    scores = next(s for s in opt.stmts if s.out.name == view.inputs[0].name)
    assert (view.op, scores.op) == ("reshape", "batch_matmul")
    assert [s.op for s in opt.stmts if scores.out in s.inputs] == ["reshape"]


@pytest.mark.parametrize("mask", [CAUSAL, "i >= j ? s[b, i, j] : -1e9", "j > i ? -inf : s[b, i, j]"])
def test_fusing_keeps_the_numbers(mask: str) -> None:
    train = compile_text(_program(mask), stop_at="train").train
    fused = fuse_softmax(train)
    assert fused is not train and sum(s.op == "masked_softmax" for s in fused.stmts) == 1
    _same_numbers(train, fused)


def _same_numbers(train: object, fused: object) -> None:
    feeds, params = feeds_and_params(train, np.random.default_rng(3))
    before = run(train, feeds, params, dtype=np.float64).outputs
    after = run(fused, feeds, params, dtype=np.float64).outputs
    assert before.keys() == after.keys()
    for name in before:
        np.testing.assert_allclose(after[name], before[name], rtol=1e-12, atol=1e-14, err_msg=name)


@pytest.mark.parametrize(
    "mask, scale, folded",
    [
        ("j <= i ? s[b, i, j] : 0", "0.5", None),  # a zero is a real score, not a mask: and the scale is below it
        ("j < i ? s[b, i, j] : -inf", "0.5", None),  # not the causal condition
        ("j <= i ? s[b, j, i] : -inf", "0.5", None),  # transposed scores
        # a negative scale would turn -inf into +inf: it stays a statement, the mask above it folds in
        (CAUSAL, "-0.5", {"scale": 1.0, "causal": True, "period": 5}),
    ],
)
def test_only_what_is_provably_attentions_mask_and_scale_folds_in(mask: str, scale: str, folded: dict | None) -> None:
    train = compile_text(_program(mask, scale), stop_at="train").train
    fused = fuse_softmax(train)
    (stmt,) = [s for s in fused.stmts if s.op in ("softmax", "masked_softmax")]
    assert (stmt.op, stmt.a if folded else None) == ("masked_softmax" if folded else "softmax", folded)
    _same_numbers(train, fused)


def test_a_scaled_softmax_without_mask_is_fused() -> None:
    text = _program().replace("p = softmax(causal(s), axis=-1)", "p = softmax(s, axis=-1)")
    opt = compile_text(text, stop_at="opt").opt
    (fused,) = [s for s in opt.stmts if s.op == "masked_softmax"]
    assert fused.a == {"scale": 0.5, "causal": False, "period": 1}


# ---- the mask's gradient after a causal masked_softmax ----


def _mask_gradients(g: Graph) -> list[str]:
    """The statements computing x * (cond ? 1 : 0) over a comparison (autodiff's gradient of the causal mask; the
    forward masks select between a score and a constant instead)."""

    def indicator(e: object) -> bool:
        if isinstance(e, Apply) and e.fn == "select" and {e.args[1], e.args[2]} == {Const(0.0), Const(1.0)}:
            return isinstance(e.args[0], Apply) and e.args[0].fn in ("<", "<=", ">", ">=")
        return isinstance(e, Apply) and any(indicator(a) for a in e.args)

    return [s.out.name for s in g.stmts if s.op in ("indexed", "fused") and indicator(s.a.get("body"))]


def _gradient_numbers(before: Graph, after: Graph, dtype: type) -> None:
    feeds, params = feeds_and_params(before, np.random.default_rng(5))
    a = run(before, feeds, params, dtype=dtype).outputs
    b = run(after, feeds, params, dtype=dtype).outputs
    assert a.keys() == b.keys()
    for name in a:
        assert np.array_equal(a[name], b[name], equal_nan=True), name  # bit for bit: the mask multiplied by 1 or 0


@pytest.mark.parametrize("mask", [CAUSAL, "i >= j ? s[b, i, j] : -1e9", "j > i ? -inf : s[b, i, j]"])
def test_the_mask_gradient_goes_with_the_same_numbers(mask: str) -> None:
    train = compile_text(_program(mask), stop_at="train").train
    folded = fold_into_softmax(train)
    assert len(_mask_gradients(folded)) == 1  # autodiff's ds = dm * (j <= i ? 1 : 0)
    dropped = drop_mask_gradients(folded)
    assert _mask_gradients(dropped) == [] and len(dropped.stmts) == len(folded.stmts) - 1
    for dtype in (np.float32, np.float64):
        _gradient_numbers(folded, dropped, dtype)


@pytest.mark.parametrize(
    "mask, scale",
    [
        ("j <= i ? s[b, i, j] : 0", "0.5"),  # no masked_softmax: the softmax's backward is not 0 above the diagonal
        ("j < i ? s[b, i, j] : -inf", "0.5"),  # not the causal condition
    ],
)
def test_the_mask_gradient_stays_without_a_causal_masked_softmax(mask: str, scale: str) -> None:
    train = compile_text(_program(mask, scale), stop_at="train").train
    folded = fold_into_softmax(train)
    assert len(_mask_gradients(folded)) == 1
    assert drop_mask_gradients(folded) is folded


def test_the_mask_gradient_stays_when_the_period_differs() -> None:
    """A causal masked_softmax of period T masks j > i of [.., T, T]; a mask over another row count is not its."""
    train = compile_text(_program(), stop_at="train").train
    folded = fold_into_softmax(train)
    (ms,) = [s for s in folded.stmts if s.op == "masked_softmax"]
    other = folded.replace(stmts=tuple(s.replace(attrs=(("causal", True), ("period", 1), ("scale", 0.5)))
                                       if s is ms else s for s in folded.stmts))  # fmt: skip
    assert drop_mask_gradients(other) is other


def test_gpt_tiny_train_program_has_no_mask_gradient() -> None:
    c = api.compile_file(ROOT / "networks" / "gpt_tiny.ddsl", {"N": 2, "T": 8}, stop_at="opt")
    assert _mask_gradients(c.opt) == []
    assert sum(s.op == "softmax_backward" for s in c.opt.stmts) == 4
    folded = fold_into_softmax(c.train)
    assert len(_mask_gradients(folded)) == 4
    _gradient_numbers(folded, drop_mask_gradients(folded), np.float32)
