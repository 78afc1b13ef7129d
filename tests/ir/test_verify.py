"""The graph checker (ir/verify.py) rejects broken graphs, and `--verify` runs it after every pass and after
rematerialisation, and the plan checker on every plan: a broken stage is an internal error (exit 3) naming it."""

from __future__ import annotations

import dataclasses

import pytest
from helpers import ROOT

from deepdsl import api
from deepdsl.ir import Graph, GraphBuilder, Init, InputDef, ParamDef, TensorType, Value
from deepdsl.ir.verify import GraphInvariantError, check_graph

MLP = str(ROOT / "networks" / "mlp.ddsl")


def small() -> Graph:
    b = GraphBuilder("T")
    x = b.add_input(InputDef(Value("x", TensorType((4, 3))), "input"))
    w = b.add_param(ParamDef(Value("w", TensorType((4, 3))), Init("constant", (0.5,))))
    h = b.emit("mul", x, w)
    b.update("w", b.emit("sub", w, h))
    b.output("loss", b.emit("sum", h))
    return b.build()


def test_a_well_formed_graph_passes() -> None:
    assert check_graph(small()) is not None


def first(g: Graph, **changes) -> Graph:  # noqa: ANN003
    """`g` with its first statement changed."""
    return dataclasses.replace(g, stmts=(g.stmts[0].replace(**changes), *g.stmts[1:]))


@pytest.mark.parametrize(
    ("broken", "message"),
    [
        (lambda g: dataclasses.replace(g, stmts=g.stmts[1:]), "%1 used before its definition"),
        (lambda g: dataclasses.replace(g, stmts=(*g.stmts, g.stmts[0])), "assigned twice"),
        (lambda g: first(g, op="frobnicate"), "unknown op"),
        (lambda g: first(g, out=Value("1", TensorType((4, 4)))), r"shape rule gives f32\[4,3\]"),
        (lambda g: first(g, inputs=g.stmts[0].inputs[:1]), "mul takes 2 inputs"),
        (lambda g: dataclasses.replace(g, updates=(("v", g.updates[0][1]),)), "no parameter or state of that name"),
        (lambda g: dataclasses.replace(g, outputs=(("loss", Value("99", TensorType(()))),)), "output loss .* not"),
    ],
)
def test_a_broken_graph_is_rejected_with_the_statement_shown(broken, message: str) -> None:  # noqa: ANN001
    with pytest.raises(GraphInvariantError, match=message) as err:
        check_graph(broken(small()))
    assert str(err.value).startswith("T: statement ") and "\n" in str(err.value)  # the statements around it


def swap_first_two(g: Graph) -> Graph:
    """A broken pass: the first two statements swap places."""
    return dataclasses.replace(g, stmts=(g.stmts[1], g.stmts[0], *g.stmts[2:]))


def test_verify_checks_the_graph_after_every_pass(monkeypatch: pytest.MonkeyPatch, cli) -> None:  # noqa: ANN001
    from deepdsl.passes import pipeline

    monkeypatch.setattr(pipeline, "PIPELINE", (*pipeline.PIPELINE, ("broken", swap_first_two, 0)))
    # off, the broken program goes through unseen
    api.compile_file(MLP, {"N": 4}, stop_at="opt", options=api.Options(verify=False))
    with pytest.raises(GraphInvariantError, match="used before its definition"):
        api.compile_file(MLP, {"N": 4}, stop_at="opt", options=api.Options(verify=True))
    monkeypatch.delenv("DEEPDSL_VERIFY")
    r = cli("ir", MLP, "--set", "N=4", "--verify")
    assert r.exit_code == 3
    assert "internal error: GraphInvariantError: MLP: statement 0: " in r.stderr and "used before" in r.stderr


def test_verify_checks_the_graph_after_rematerialisation(monkeypatch: pytest.MonkeyPatch) -> None:
    # the driver calls the name it imported (api.rematerialise), so that is the one to replace
    monkeypatch.setattr(api, "rematerialise", lambda g, level, small=0: swap_first_two(g))
    api.compile_file(MLP, {"N": 4}, stop_at="plan", options=api.Options(verify=False, remat="cheap"))
    with pytest.raises(GraphInvariantError, match="used before its definition"):
        api.compile_file(MLP, {"N": 4}, stop_at="plan", options=api.Options(verify=True, remat="cheap"))


def test_verify_checks_every_plan(monkeypatch: pytest.MonkeyPatch, cli) -> None:  # noqa: ANN001
    real = api.plan

    def shrunk(g, workspace_limit=None):  # noqa: ANN001, ANN202
        p = real(g, workspace_limit)
        return dataclasses.replace(p, arena_bytes=p.arena_bytes - 256)

    monkeypatch.setattr(api, "plan", shrunk)
    monkeypatch.delenv("DEEPDSL_VERIFY")
    assert cli("memcheck", MLP, "--set", "N=4").exit_code == 0
    r = cli("memcheck", MLP, "--set", "N=4", "--verify")
    assert r.exit_code == 3
    assert "internal error: PlanInvariantError: plan of MLP: buffer %" in r.stderr and "outside the arena" in r.stderr
    r = cli("run", MLP, "--set", "N=4", "--iters", "1", "--data", "synthetic", "--verify")  # the trainer's plans
    assert r.exit_code == 3 and "PlanInvariantError" in r.stderr
