"""The plan checker (memory/check.py) rejects broken plans, and the NumPy runner, run inside a broken plan's arena,
computes wrong numbers: each promise of a plan is shown to be checked by both."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from helpers import ROOT, feeds_and_params

from deepdsl import api
from deepdsl.backends.numpy_runner import run, run_plan
from deepdsl.ir import GraphBuilder, Init, InputDef, ParamDef, TensorType, Value
from deepdsl.ir.groups import kernel_groups
from deepdsl.memory import ALIGN, Plan, plan
from deepdsl.memory.check import PlanInvariantError, check_plan, hazards
from deepdsl.memory.groups import planned_groups


@pytest.fixture(scope="module")
def lenet() -> Plan:
    return check_plan(plan(api.compile_file(ROOT / "networks" / "lenet.ddsl", {"N": 2}, stop_at="opt").opt))


def moved(p: Plan, b, offset: int) -> Plan:  # noqa: ANN001
    """`p` with buffer `b` at `offset` (the arena grown to hold it)."""
    buffers = tuple(dataclasses.replace(x, offset=offset) if x is b else x for x in p.buffers)
    return dataclasses.replace(p, buffers=buffers, arena_bytes=max(p.arena_bytes, offset + b.nbytes))


def differs(p: Plan, broken: Plan) -> bool:
    """Whether the runner, inside `broken`'s arena, computes other numbers than the unplanned run of `p`."""
    feeds, params = feeds_and_params(p.graph, np.random.default_rng(0))
    want, got = run(p.graph, feeds, params), run_plan(broken, feeds, params)
    return any(not np.allclose(got.updates[k], v, rtol=1e-5, atol=1e-6) for k, v in want.updates.items()) or any(
        not np.allclose(got.outputs[k], v, rtol=1e-5, atol=1e-6) for k, v in want.outputs.items()
    )


def test_two_live_buffers_in_the_same_bytes_are_caught_and_compute_wrong_numbers(lenet: Plan) -> None:
    assert not differs(lenet, lenet)
    # a buffer written while another is alive and read after it: put the second over the first
    a, b = next(
        (a, b) for a in lenet.buffers for b in lenet.buffers if a.start < b.start < a.end and b.nbytes <= a.nbytes
    )  # fmt: skip
    broken = moved(lenet, b, a.offset)
    with pytest.raises(PlanInvariantError, match="overlap while both are live") as err:
        check_plan(broken)
    assert f"%{a.values[0]} " in str(err.value) and f"%{b.values[0]} " in str(err.value)
    assert differs(lenet, broken)


def test_a_shrunk_arena_is_caught(lenet: Plan) -> None:
    with pytest.raises(PlanInvariantError, match="outside the arena"):
        check_plan(dataclasses.replace(lenet, arena_bytes=lenet.arena_bytes - ALIGN))
    ws = next(iter(lenet.workspace.values()))  # the workspace regions too
    with pytest.raises(PlanInvariantError, match="outside the arena"):
        check_plan(dataclasses.replace(lenet, workspace={**lenet.workspace, "x": ws}, arena_bytes=ws.offset))


def test_misalignment_is_caught(lenet: Plan) -> None:
    b = max(lenet.buffers, key=lambda b: b.offset)
    with pytest.raises(PlanInvariantError, match=f"%{b.values[0]} .* not aligned to {ALIGN} bytes"):
        check_plan(moved(lenet, b, b.offset + 4))


def test_a_lifetime_shorter_than_the_reads_is_caught(lenet: Plan) -> None:
    b = next(b for b in lenet.buffers if b.end > b.start)
    buffers = tuple(dataclasses.replace(x, end=x.start) if x is b else x for x in lenet.buffers)
    with pytest.raises(PlanInvariantError, match=f"%{b.values[0]} .* outside its lifetime"):
        check_plan(dataclasses.replace(lenet, buffers=buffers))


def test_a_value_without_a_buffer_is_caught(lenet: Plan) -> None:
    b = lenet.buffers[0]
    with pytest.raises(PlanInvariantError, match=f"%{b.values[0]} = .* has no buffer"):
        check_plan(dataclasses.replace(lenet, buffers=lenet.buffers[1:]))


def _graph(inplace_transposed: bool = False):  # noqa: ANN202
    """x [8, 8] -> e = exp(x) -> an in-place statement over e -> loss; e also read at the end when asked."""
    b = GraphBuilder("T")
    x = b.add_input(InputDef(Value("x", TensorType((8, 8))), "input"))
    e = b.emit("exp", x)
    if inplace_transposed:  # reads e at other elements than it writes
        t = b.emit("transpose", e, perm=(1, 0), inplace=0)
    else:
        t = b.emit("mul_scalar", e, value=3.0, inplace=0)
    u = b.emit("sub", t, x)
    b.output("loss", b.emit("sum", u))
    return b


def test_an_in_place_write_over_a_value_still_read_is_caught_and_computes_wrong_numbers() -> None:
    b = _graph()
    e = b.stmts[0].out
    good = b.build()
    assert not differs(check_plan(plan(good)), plan(good))
    b.output("e", e)  # e is now read at the end of the step, after %2 was written over it
    broken = plan(b.build())
    with pytest.raises(PlanInvariantError, match=r"%2 = mul_scalar\(...\) \(statement 1\) overwrites %1, which is "
                       "still read at the end of the step"):  # fmt: skip
        check_plan(broken)
    feeds = {"x": np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8)}
    np.testing.assert_allclose(run_plan(broken, feeds, {}).outputs["e"], 3 * np.exp(feeds["x"]), rtol=1e-6)


def test_an_in_place_write_reading_other_elements_is_caught_and_computes_wrong_numbers() -> None:
    broken = plan(_graph(inplace_transposed=True).build())
    with pytest.raises(PlanInvariantError, match="overwrites %1 while reading it other than element for element"):
        check_plan(broken)
    assert [(h.writer, h.value) for h in hazards(broken)] == [("2", "1")]
    assert differs(broken, broken)  # the runner poisons what the kernel reads and writes at once


def _shared_loop() -> tuple[Plan, Plan]:
    """t = exp(x); a = t * w; b = w * x in a's loop (same_loop). The plan puts b in t's bytes (t dies at a): legal,
    element for element. Moving b half a buffer up makes the loop write b over t where a still reads it."""
    bld = GraphBuilder("L")
    x = bld.add_input(InputDef(Value("x", TensorType((1024,))), "input"))
    w = bld.add_param(ParamDef(Value("w", TensorType((1024,))), Init("constant", (0.5,))))
    t = bld.emit("exp", x)
    a = bld.emit("mul", t, w)
    b = bld.emit("mul", w, x, same_loop=True)
    bld.output("a", a)
    bld.output("b", b)
    bld.output("loss", bld.emit("sum", b))
    p = check_plan(plan(bld.build()))
    assert [tuple(s.out.name for s in k) for k in planned_groups(p)][:2] == [("1",), ("2", "3")]
    assert p.buffer_of(t.name).offset == p.buffer_of(b.name).offset
    tb, ab, bb = (p.buffer_of(v.name) for v in (t, a, b))
    buffers = tuple(
        dataclasses.replace(x, offset=tb.offset + tb.nbytes // 2) if x is bb
        else dataclasses.replace(x, offset=p.arena_bytes) if x is ab else x
        for x in p.buffers
    )  # fmt: skip
    return p, dataclasses.replace(p, buffers=buffers, arena_bytes=p.arena_bytes + ab.nbytes)


def test_a_loop_writing_what_an_earlier_member_still_reads_is_caught() -> None:
    good, broken = _shared_loop()
    # with b moved, the backends no longer join b to a's loop (can_join reads the plan): legal
    assert [len(k) for k in planned_groups(broken)][:3] == [1, 1, 1]
    check_plan(broken)
    # the loop of the legal plan (or a grouping that ignores the plan) over the moved buffer writes b over t
    for groups in (planned_groups(good), kernel_groups(good.graph.stmts)):
        with pytest.raises(PlanInvariantError, match="%3 is written in the loop it shares with %2 over bytes "
                           r"2,048..4,096 of %1 \(arena\), which %2 reads at other elements"):  # fmt: skip
            check_plan(broken, groups)


def test_updates_written_over_their_parameters_must_be_their_last_readers(lenet: Plan) -> None:
    g = lenet.graph
    value, target = next(iter(lenet.in_state.items()))
    other = next(v.name for t, v in g.updates if t != target)
    with pytest.raises(PlanInvariantError, match=f"%{other} is written over %{target}, but it is not the update"):
        check_plan(dataclasses.replace(lenet, in_state={**lenet.in_state, other: target}))


def test_the_plan_cannot_be_changed_after_it_is_made(lenet: Plan) -> None:
    with pytest.raises(TypeError):
        lenet.in_state["x"] = "y"  # type: ignore[index]
    with pytest.raises(TypeError):
        lenet.workspace["x"] = lenet.buffers[0]  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        lenet.arena_bytes = 0  # type: ignore[misc]
    assert lenet.buffer_of(lenet.buffers[3].values[0]) is lenet.buffers[3]


def test_an_update_written_over_its_parameter_before_the_last_read_is_caught_and_computes_wrong_numbers() -> None:
    b = GraphBuilder("U")
    x = b.add_input(InputDef(Value("x", TensorType((64,))), "input"))
    w = b.add_param(ParamDef(Value("w", TensorType((64,))), Init("constant", (0.5,))))
    h = b.emit("mul", x, w)
    new = b.emit("sub", w, h)
    b.update("w", new)
    b.output("loss", b.emit("sum", b.emit("mul", h, w)))  # w read again after its update
    p = check_plan(plan(b.build()))
    assert dict(p.in_state) == {}  # the planner keeps the update apart
    broken = dataclasses.replace(p, in_state={new.name: "w"})
    with pytest.raises(PlanInvariantError, match=r"%2 = sub\(...\) \(statement 1\) overwrites %w, which is still "
                       "read by statement 2"):  # fmt: skip
        check_plan(broken)
    assert differs(p, broken)
