"""A head tied to a token embedding, `full(h, tied=tok)` (GPT-2's logits = h @ wte.T): the program reads the one
parameter `tok.W` in the embedding and in the head's GEMM, its gradient is the sum of both uses (float64 central
differences, and the gradients of an untied twin added up), it is counted and updated once, and the mistakes are
located (tests/backends/test_tied_head_backends.py: the Java program and the GPU runner)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import ROOT, compile_text, error_text

from deepdsl.autodiff import gradient_program
from deepdsl.backends.numpy_runner import run

EXAMPLE = ROOT / "networks" / "examples" / "tied_lm.ddsl"

N, T, V, D = 2, 3, 7, 4


def lm(head: str) -> str:
    """A tiny language model whose head is the layer `head` (applied to h [N, T, D] for the loss and predict)."""
    return (
        f"network Lm\nconst N = {N}\ninput ids : [N, {T}] int vocab {V}\nlabel y : [N, {T}] classes {V}\n"
        f"layer tok = embedding({V}, {D}, init=gaussian(0.5))\nlayer head = {head}\n"
        f"h = layer_norm(tanh(full(tok(ids), {D})))\n"
        "loss = softmax_cross_entropy(head(h), y)\npredict = head(h)\n"
    )


TIED = lm("full(tied=tok)")  # with a bias of its own
UNTIED = lm(f"full({V})")


def test_the_head_reads_the_embeddings_table_itself() -> None:
    g = compile_text(TIED).program.graph
    assert [p.value.name for p in g.trainable if p.value.name.startswith("tok")] == ["tok.W"]
    readers = [s.op for s in g.stmts if any(v.name == "tok.W" for v in s.inputs)]
    assert readers == ["embedding", "linear"]  # the loss's head and predict's are one statement (value numbering)
    assert g.parameter_count == compile_text(UNTIED).program.graph.parameter_count - V * D


def test_the_tables_gradient_is_the_sum_of_both_uses() -> None:
    tied = gradient_program(compile_text(TIED).program.graph)
    untied = gradient_program(compile_text(UNTIED).program.graph)
    rng = np.random.default_rng(3)
    params = {p.value.name: rng.standard_normal(p.value.type.shape) * 0.5 for p in tied.params if p.kind == "param"}
    feeds = {"ids": rng.integers(0, V, (N, T)), "y": rng.integers(0, V, (N, T))}
    out = run(tied, feeds, params, np.float64).outputs
    twin = {**params, "head.W": params["tok.W"]}
    theirs = run(untied, feeds, twin, np.float64).outputs
    assert out["loss"] == pytest.approx(theirs["loss"], rel=1e-12)
    np.testing.assert_allclose(out["grad:tok.W"], theirs["grad:tok.W"] + theirs["grad:head.W"], rtol=1e-10)
    table = params["tok.W"].reshape(-1)
    for idx in range(table.size):  # every element: central differences in float64
        h = 1e-6
        plus, minus = table.copy(), table.copy()
        plus[idx] += h
        minus[idx] -= h
        fp = run(tied, feeds, params | {"tok.W": plus.reshape(V, D)}, np.float64).outputs["loss"]
        fm = run(tied, feeds, params | {"tok.W": minus.reshape(V, D)}, np.float64).outputs["loss"]
        numeric = (fp - fm) / (2 * h)
        got = out["grad:tok.W"].reshape(-1)[idx]
        assert abs(got - numeric) <= 1e-7 * max(1.0, abs(numeric)), f"dtok.W[{idx}]: {got} vs {numeric}"


def test_the_table_is_updated_once_and_counted_once(cli) -> None:  # noqa: ANN001
    from deepdsl import api

    b = api.build(api.compile_file(EXAMPLE).program)
    assert [k for k, _ in b.train.updates if k.startswith("tok.W")] == ["tok.W"]
    r = cli("check", str(EXAMPLE), "--layers", "--json")
    assert r.exit_code == 0, r.output
    rows = {row["name"]: row for row in json.loads(r.stdout)["layers"]}
    assert rows["tok"]["parameters"] == 32 * 16 and rows["head"]["parameters"] == 0
    assert json.loads(r.stdout)["parameters"] == b.program.graph.parameter_count == 2896


@pytest.mark.parametrize(
    "head, message",
    [
        ("full(9, tied=tok)", "full(tied=tok): out=9, but the table tok.W has 7 rows (its vocab)"),
        ("full(tied=tok, init=he())", "full(tied=tok) takes no init=: its weight is the table tok.W"),
        (f"full(tied=embedding({V}, {D}))", "argument 'tied' of full must be an embedding layer bound by name"),
        ("full(tied=3)", "must be an embedding layer bound by name, as `layer tok = embedding(V, D)`, got an int"),
        ("full(bias=false)", "full needs its argument 'out'"),
    ],
)
def test_mistakes_are_located(head: str, message: str) -> None:
    rendered = error_text(lm(head))
    assert message in rendered and "t.ddsl:6:" in rendered and "^" in rendered, rendered
