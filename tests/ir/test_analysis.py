"""The shared analyses of deepdsl/ir/analysis.py on small programs whose answers can be read off by hand."""

from __future__ import annotations

import dataclasses

import pytest

import deepdsl.ops  # noqa: F401 — fills the registry
from deepdsl.ir import Graph, GraphBuilder, InputDef, TensorType, Value
from deepdsl.ir.analysis import (
    IndexForm,
    composable_form,
    has_reduce,
    index_form,
    last_reads,
    last_uses,
    own_index,
    readers,
    reads_pointwise,
    returned,
    uses,
)
from deepdsl.ir.indexexpr import Affine, Apply, Const, Read, Reduce
from deepdsl.passes.fuse import fuse


def program() -> Graph:
    """%c = x + b (b per channel), %s = sum(c), %y = c * s, %z = relu(y); outputs z and s."""
    b = GraphBuilder("A")
    x = b.add_input(InputDef(Value("x", TensorType((2, 3, 4, 4))), "input"))
    bias = b.add_input(InputDef(Value("b", TensorType((3,))), "input"))
    c = b.emit("bias_add", x, bias)
    s = b.emit("sum", c)
    y = b.emit("scale_by", c, s)
    b.output("z", b.emit("relu", y))
    b.output("s", s)
    return b.build()


def test_an_op_with_a_registry_form_reads_its_input_at_its_own_index_and_per_channel() -> None:
    g = program()
    form = index_form(g.stmts[0])
    assert form is not None and form.ops == ("bias_add",) and form.inputs == g.stmts[0].inputs
    assert form.out == (("i0", 2), ("i1", 3), ("i2", 4), ("i3", 4))
    assert form.body == Apply("+", (Read(0, own_index(form.out)), Read(1, (Affine.var("i1"),))))
    with pytest.raises(dataclasses.FrozenInstanceError):
        form.body = Const(0.0)  # type: ignore[misc]


def test_library_ops_views_and_epilogues_have_no_form_and_tensor_functions_are_not_composed() -> None:
    b = GraphBuilder("L")
    x = b.add_input(InputDef(Value("x", TensorType((4, 5))), "input"))
    w = b.add_input(InputDef(Value("w", TensorType((5, 6))), "input"))
    m = b.emit("matmul", x, w)
    f = b.emit("reshape", m, shape=(24,))
    t = b.emit("indexed", x, out=(("i", 5), ("j", 4)), body=Read(0, (Affine.var("j"), Affine.var("i"))))
    b.output("f", f)
    b.output("t", t)
    g = b.build()
    matmul, flatten, indexed = g.stmts
    assert index_form(matmul) is None and index_form(flatten) is None
    assert index_form(matmul.replace(op="add", attrs=(("epilogue", Read(0, ())),))) is None
    assert index_form(indexed) == IndexForm((("i", 5), ("j", 4)), indexed.a["body"], (x,), ("indexed",))
    assert composable_form(indexed) is None


def test_a_fused_statement_carries_its_form_and_the_ops_it_composes() -> None:
    b = GraphBuilder("F")
    x = b.add_input(InputDef(Value("x", TensorType((2, 3))), "input"))
    b.output("y", b.emit("relu", b.emit("exp", x)))
    (s,) = fuse(b.build()).stmts
    form = index_form(s)
    assert s.op == "fused" and form is not None and form.ops == ("exp", "relu") and form.inputs == (x,)
    assert form.body == Apply("max", (Apply("exp", (Read(0, own_index(form.out)),)), Const(0.0)))


def test_has_reduce_finds_a_reduction_anywhere() -> None:
    r = Reduce("sum", (("k", 3),), Read(0, (Affine.var("k"),)))
    assert has_reduce(r) and has_reduce(Apply("+", (Const(1.0), Apply("exp", (r,)))))
    assert not has_reduce(Apply("*", (Read(0, ()), Const(2.0))))


def test_reads_pointwise_is_false_for_a_broadcast_a_reduction_and_true_for_an_unread_value() -> None:
    g = program()
    add, total, scale, relu = g.stmts
    assert reads_pointwise(add, "x") and not reads_pointwise(add, "b")  # b is read per channel
    assert not reads_pointwise(total, add.out.name)  # every element feeds the one sum
    assert reads_pointwise(scale, add.out.name) and not reads_pointwise(scale, total.out.name)
    assert reads_pointwise(relu, "x")  # not read at all


def test_uses_readers_and_last_use_count_outputs_and_updates() -> None:
    g = program()
    c, s, y, z = (st.out.name for st in g.stmts)
    assert uses(g) == {"x": 1, "b": 1, c: 2, s: 2, y: 1, z: 1}
    assert readers(g.stmts) == {"x": [0], "b": [0], c: [1, 2], s: [2], y: [3]}
    assert last_reads(g.stmts) == {"x": 0, "b": 0, c: 2, s: 2, y: 3}
    assert last_uses(g) == {"x": 0, "b": 0, c: 2, s: 4, y: 3, z: 4}
    assert returned(g) == {s, z}


def test_a_value_read_twice_by_one_statement_is_one_reader_and_two_uses() -> None:
    b = GraphBuilder("T")
    x = b.add_input(InputDef(Value("x", TensorType((3,))), "input"))
    b.output("y", b.emit("mul", x, x))
    g = b.build()
    assert readers(g.stmts) == {"x": [0]} and uses(g)["x"] == 2
