"""Attention's softmax fused with its scaling and causal mask (passes/fuse_softmax.py): the optimised program of
a causal attention holds one masked_softmax and no tensor of scaled or masked scores, and computes the same
numbers; a mask or scale the rewrite cannot prove equal is left alone."""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import feeds_and_params
from transformer_nets import ATTENTION, CAUSAL

from deepdsl import api
from deepdsl.backends.numpy_runner import run
from deepdsl.ir.indexexpr import Apply, Const, Reduce
from deepdsl.passes.fuse_softmax import fuse_softmax


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
