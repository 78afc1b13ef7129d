"""The memory plan: one arena, fixed offsets, exact peak; execution inside a poisoned arena equals unplanned
execution, and holds the bytes memcheck reports."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import REDUCED, ROOT, feeds_and_params, with_slow

from deepdsl import api
from deepdsl.backends.numpy_runner import run, run_plan
from deepdsl.memory import ALIGN, plan
from deepdsl.memory.check import check_plan
from deepdsl.memory.plan import aligned
from deepdsl.memory.remat import LEVELS, rematerialise
from deepdsl.memory.report import total_peak
from deepdsl.memory.schedule import schedule


@pytest.mark.parametrize("remat", LEVELS)
@pytest.mark.parametrize("name", with_slow(sorted(REDUCED)))
def test_a_run_inside_the_poisoned_arena_equals_the_unplanned_run(name: str, remat: str, compiled) -> None:  # noqa: ANN001
    sets, _ = REDUCED[name]
    g = compiled(name, sets, stop_at="opt").opt
    p = check_plan(plan(rematerialise(g, remat, small=0)))  # small=0: at reduced size, recompute the smallest too
    if remat == "full" or (remat == "cheap" and name in ("resnet50", "small")):
        assert any("~" in s.out.name for s in p.graph.stmts), "nothing was recomputed"
    feeds, params = feeds_and_params(g, np.random.default_rng(0))
    plain = run(g, feeds, params)
    # the arena NaN before the step, each region NaN again after its last reader: a read of bytes the plan gave to
    # another value shows in the results
    planned = run_plan(p, feeds, params, poison=True)
    # what the run held (its arena and every input and parameter array, measured) is what memcheck reports
    assert (planned.peak_bytes, planned.arena_bytes) == (total_peak(p), p.arena_bytes)
    for k, v in plain.outputs.items():
        np.testing.assert_allclose(planned.outputs[k], v, rtol=1e-6)
    for k, v in plain.updates.items():
        np.testing.assert_allclose(planned.updates[k], v, rtol=1e-6, atol=1e-7)
        assert np.all(np.isfinite(planned.updates[k]))


@pytest.mark.parametrize("name", ["lenet", "resnet50"])
def test_buffers_alive_together_never_overlap(name: str, compiled) -> None:  # noqa: ANN001
    p = compiled(name, {"N": 2}, stop_at="plan").plan
    assert p.arena_bytes >= p.live_peak_bytes
    spans = sorted(p.buffers, key=lambda b: b.offset)
    for b in p.buffers:
        assert b.offset % ALIGN == 0 and b.nbytes % ALIGN == 0 and b.offset + b.nbytes <= p.arena_bytes
    for i, a in enumerate(spans):
        for b in spans[i + 1 :]:
            if b.offset >= a.offset + a.nbytes:
                break
            assert a.end < b.start or b.end < a.start, f"{a.values[0]} and {b.values[0]} share memory while alive"


def test_views_and_inplace_results_share_their_buffer(compiled) -> None:  # noqa: ANN001
    g = compiled("lenet", {"N": 2}, stop_at="opt", options=api.Options(disabled=("fuse",))).opt
    p = plan(g)
    for s in g.stmts:
        if s.op == "reshape":
            assert p.buffer_of(s.out.name) is p.buffer_of(s.inputs[0].name)
        if "inplace" in s.a and s.out.name not in p.in_state:
            assert p.buffer_of(s.out.name) is p.buffer_of(s.inputs[s.a["inplace"]].name)


@pytest.mark.parametrize("name", ["lenet", "resnet50"])
def test_updates_go_into_their_parameters_right_after_the_last_read(name: str, compiled) -> None:  # noqa: ANN001
    """Without the multi-tensor launch (passes/multi_tensor.py), the schedule runs each update when its gradient is
    complete; written in place, it takes no arena space."""
    p = compiled(name, {"N": 2}, stop_at="plan", options=api.Options(disabled=("multi_tensor",))).plan
    g = p.graph
    producer = {s.out.name: s for s in g.stmts}
    # every update computed element for element goes in place (a GEMM with a momentum epilogue cannot: its
    # epilogue reads the old momentum after the product was written)
    assert {v.name for _, v in g.updates if "epilogue" not in producer[v.name].a} == set(p.in_state)
    position = {s.out.name: i for i, s in enumerate(g.stmts)}
    for value, target in p.in_state.items():
        i = position[value]
        assert all(target not in {v.name for v in s.inputs} for s in g.stmts[i + 1 :]), f"{target} read after update"
        with pytest.raises(KeyError):
            p.buffer_of(value)
    scheduled = schedule(p.graph)  # the plan keeps the program's order where that happens to pack better
    position = {s.out.name: i for i, s in enumerate(scheduled.stmts)}
    momentum = [s for s in scheduled.stmts if s.out.name in p.in_state and s.op == "sgd_momentum"]
    assert momentum
    for s in momentum:  # the update runs right after its gradient's last statement (or that of another parameter
        # with the same gradient: batch-norm shifts summed into one residual add), or after the gradient's last
        # other reader (a batch norm's dx reads its scale's and shift's gradients)
        done = max(position[r.out.name] for r in scheduled.stmts
                   if position[r.out.name] < position[s.out.name] and s.inputs[1] in r.inputs + (r.out,))  # fmt: skip
        assert position[s.out.name] - done <= 8


def test_run_json_reports_the_peak_memcheck_reports_and_ir_prints_the_plan(cli) -> None:  # noqa: ANN001
    net = str(ROOT / "networks" / "lenet.ddsl")
    got = json.loads(cli("run", net, "--set", "N=8", "--iters", "1", "--data", "synthetic", "--json").stdout)
    want = json.loads(cli("memcheck", net, "--set", "N=8", "--json").stdout)
    assert got["peak_bytes"] == want["peak_bytes"] == (
        want["parameter_bytes"] + want["state_bytes"] + want["optimizer_state_bytes"] + want["input_bytes"]
        + want["constant_bytes"] + want["arena_bytes"]
    )  # fmt: skip
    assert got["arena_bytes"] == want["arena_bytes"] < got["peak_bytes"]
    c = api.compile_file(net, {"N": 8}, stop_at="plan")
    r = cli("ir", net, "--stage", "plan", "--set", "N=8")
    assert r.stdout.startswith(f"plan LeNet: arena {c.plan.arena_bytes:,} bytes")


@pytest.mark.parametrize("name", with_slow(sorted(REDUCED)))
def test_the_optimiser_does_not_raise_the_planned_peak(name: str, compiled) -> None:  # noqa: ANN001
    """Every pass but multi_tensor never raises the planned peak; multi_tensor (one launch for every update, at the end
    of the step) keeps the gradients alive until then: at most their bytes more."""
    sets, _ = REDUCED[name]
    unoptimised = compiled(name, sets, stop_at="plan", options=api.Options(level=0)).plan
    optimised = compiled(name, sets, stop_at="plan", options=api.Options(disabled=("multi_tensor",))).plan
    # within 2%: the motion pass orders the weight gradients without knowing that the plan writes updates in
    # place (the MLP at batch 4 plans 1.1% larger at -O2); every other network plans smaller
    assert optimised.arena_bytes <= unoptimised.arena_bytes * (1.02 if name == "mlp" else 1.0)
    multi = compiled(name, sets, stop_at="plan").plan
    gradients = sum(aligned(p.value.type.nbytes) for p in multi.graph.trainable)
    assert multi.arena_bytes <= optimised.arena_bytes + gradients


def test_convolutions_get_their_declared_workspace_under_the_limit(compiled) -> None:  # noqa: ANN001
    """The registry declares each convolution's im2col scratch; the plan places it in the arena for its one
    statement where it fits the limit, and the runner does its work there."""
    from deepdsl.ir import REGISTRY
    from deepdsl.memory.plan import workspace_need

    assert all(op.numpy_ws is not None for op in REGISTRY.values() if op.workspace is not None)
    g = compiled("lenet", {"N": 4}, stop_at="opt").opt
    feeds, params = feeds_and_params(g, np.random.default_rng(0))
    plain = run(g, feeds, params)
    needs = {s.out.name: workspace_need(s) for s in g.stmts}
    assert {"conv2d", "conv2d_backward_data", "conv2d_backward_filter"} <= {s.op for s in g.stmts if needs[s.out.name]}
    limit = sorted(n for n in needs.values() if n)[0]  # only the smallest scratch fits
    for workspace_limit in (None, limit, 0):
        p = plan(g, workspace_limit)
        expected = {k for k, n in needs.items() if n and (workspace_limit is None or n <= workspace_limit)}
        assert set(p.workspace) == expected
        for name, b in p.workspace.items():
            assert b.nbytes >= needs[name] and b.start == b.end
        planned = run_plan(check_plan(p), feeds, params, poison=True)
        # the unplanned run uses the im2col kernels; a convolution over the limit sums in another order
        tol = 1e-6 if workspace_limit is None else 1e-5
        for k, v in plain.updates.items():
            np.testing.assert_allclose(planned.updates[k], v, rtol=tol, atol=tol * np.abs(v).max())


def test_the_schedule_emits_every_statement_once_around_shared_loops() -> None:
    """A small result pulled ahead for a statement sharing a loop (same_loop) once made its predecessor run twice:
    the second %2 overwrote %5, which had been written in place over it."""
    from deepdsl.ir import GraphBuilder, Init, InputDef, ParamDef, TensorType, Value

    b = GraphBuilder("F")
    x = b.add_input(InputDef(Value("x", TensorType((8,))), "input"))
    w = b.add_param(ParamDef(Value("w", TensorType((8,))), Init("constant", (0.5,))))
    total = b.emit("sum", x)
    wx = b.emit("mul", w, x, same_loop=True)
    scaled = b.emit("scale_by", w, total)
    kept = b.emit("add", scaled, wx, inplace=0, same_loop=True)
    both = b.emit("add", kept, wx, inplace=1)
    b.output("o0", both)
    b.output("o1", kept)
    b.output("loss", b.emit("add", b.emit("sum", both), b.emit("sum", kept), inplace=0))
    g = b.build()
    names = [s.out.name for s in schedule(g).stmts]
    assert sorted(names) == sorted(s.out.name for s in g.stmts)  # each once
    feeds, params = {"x": np.arange(1, 9, dtype=np.float32)}, {"w": np.full(8, 0.5, np.float32)}
    want = run(g, feeds, params).outputs
    got = run_plan(check_plan(plan(g)), feeds, params, poison=True).outputs
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6)
