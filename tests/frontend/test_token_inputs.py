"""Integer inputs (`input t : [N, T] int vocab V`), the `embedding` layer over them, and the per-position loss."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import compile_text, error_text

from deepdsl.backends.numpy_runner import run
from deepdsl.ir.types import DType

LM = """network Lm
const N = 2
const T = 5
const V = 7
input tok : [N, T] int vocab V
label nxt : [N, T] classes V
layer emb = embedding(V, 4)
h = emb(tok)
loss = softmax_cross_entropy(full_per_token(h), nxt)
tensor full_per_token(x[B, S, D]) -> [n, t, v: V] {
  param W[V, D] = gaussian(0.5)
  return sum[d] x[n, t, d] * W[v, d]
}
"""


def test_an_integer_input_is_an_int64_input_with_its_vocabulary() -> None:
    g = compile_text(LM).program.graph
    tok = next(d for d in g.inputs if d.value.name == "tok")
    assert (tok.kind, tok.classes, tok.value.type.dtype, tok.value.type.shape) == ("input", 7, DType.I64, (2, 5))
    assert [p.value.name for p in g.trainable][:1] == ["emb.W"]
    assert dict((p.value.name, p.value.type.shape) for p in g.trainable)["emb.W"] == (7, 4)
    assert "embedding" in [s.op for s in g.stmts]


def test_the_embedding_is_a_row_lookup_and_the_loss_a_mean_over_positions() -> None:
    g = compile_text(LM).program.graph
    rng = np.random.default_rng(1)
    tok = rng.integers(0, 7, (2, 5))
    nxt = rng.integers(0, 7, (2, 5))
    w = rng.standard_normal((7, 4))
    head = rng.standard_normal((7, 4))
    params = {p.value.name: a for p, a in zip(g.trainable, (w, head), strict=True)}
    out = run(g, {"tok": tok, "nxt": nxt}, params, np.float64)
    logits = w[tok] @ head.T  # [2, 5, 7]
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    want = -np.mean([logp[n, t, nxt[n, t]] for n in range(2) for t in range(5)])
    assert float(out.outputs["loss"]) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize(
    "change, message",
    [
        ("layer emb = embedding(V, 4)", "token input 'tok' holds ids in [0, 7), more than the table's vocab=5"),
        ("label nxt : [N, T] classes V", "gives 7 scores per position, but the labels 'nxt' have 9 classes"),
        ("input tok : [N, T] int vocab V", "the vocabulary size must be"),
    ],
)
def test_mismatched_vocabularies_are_errors(change: str, message: str) -> None:
    broken = {
        "layer emb = embedding(V, 4)": "layer emb = embedding(5, 4)",
        "label nxt : [N, T] classes V": "label nxt : [N, T] classes 9",
        "input tok : [N, T] int vocab V": "input tok : [N, T] int vocab 0",
    }[change]
    assert message in error_text(LM.replace(change, broken))


def test_a_label_of_the_wrong_shape_for_per_position_scores_is_an_error() -> None:
    text = LM.replace("label nxt : [N, T] classes V", "label nxt : [N] classes V")
    assert "labels must be int [2, 5] for scores f32[2,5,7], got i64[2]" in error_text(text)


def test_int_and_vocab_stay_usable_as_names() -> None:
    text = LM.replace("h = emb(tok)", "vocab = 3\nint = vocab\nh = emb(tok)")
    compile_text(text)
