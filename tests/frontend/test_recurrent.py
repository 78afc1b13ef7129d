"""The recurrent built-ins `lstm` and `gru`: the forward pass against a naive float64 loop over PyTorch's equations
(nn.LSTM / nn.GRU, batch first, one layer, zero initial states), the gradients against central differences, the
parameters (names, layout, initialisation), how the unrolled program is built, and the located errors."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from helpers import ROOT, compile_text, error_text

from deepdsl.autodiff import gradient_program, infer_program
from deepdsl.backends.numpy_runner import run
from deepdsl.initializers import init_array

N, T, D, H = 3, 5, 4, 6


def text(kind: str, sequences: bool = True, bias: bool = True, t: int = T, h: int = H) -> str:
    out = f"[N, {t}, {h}]" if sequences else f"[N, {h}]"
    return (
        f"network R\nconst N = {N}\ninput x : [N, {t}, {D}]\ninput target : {out}\n"
        f"layer rnn = {kind}({h}, sequences={str(sequences).lower()}, bias={str(bias).lower()})\n"
        "loss = mse(rnn(x), target)\npredict = rnn(x)\n"
    )


def sigmoid(v: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-v))


def naive_lstm(x: np.ndarray, p: dict, bias: bool) -> np.ndarray:
    """torch.nn.LSTM's equations, one sample and one step at a time; returns every step's h, [N, T, H]."""
    w_ih, w_hh = p["rnn.W_ih"], p["rnn.W_hh"]
    hs = w_hh.shape[1]
    b_ih = p["rnn.b_ih"] if bias else np.zeros(4 * hs)
    b_hh = p["rnn.b_hh"] if bias else np.zeros(4 * hs)
    out = np.zeros((x.shape[0], x.shape[1], hs))
    for n in range(x.shape[0]):
        h, c = np.zeros(hs), np.zeros(hs)
        for t in range(x.shape[1]):
            gates = w_ih @ x[n, t] + b_ih + w_hh @ h + b_hh
            i, f, g, o = (gates[k * hs : (k + 1) * hs] for k in range(4))
            c = sigmoid(f) * c + sigmoid(i) * np.tanh(g)
            h = sigmoid(o) * np.tanh(c)
            out[n, t] = h
    return out


def naive_gru(x: np.ndarray, p: dict, bias: bool) -> np.ndarray:
    """torch.nn.GRU's equations (r scales W_hn h + b_hn), one sample and one step at a time, [N, T, H]."""
    w_ih, w_hh = p["rnn.W_ih"], p["rnn.W_hh"]
    hs = w_hh.shape[1]
    b_ih = p["rnn.b_ih"] if bias else np.zeros(3 * hs)
    b_hh = p["rnn.b_hh"] if bias else np.zeros(3 * hs)
    out = np.zeros((x.shape[0], x.shape[1], hs))
    for n in range(x.shape[0]):
        h = np.zeros(hs)
        for t in range(x.shape[1]):
            gi = w_ih @ x[n, t] + b_ih
            gh = w_hh @ h + b_hh
            r = sigmoid(gi[:hs] + gh[:hs])
            z = sigmoid(gi[hs : 2 * hs] + gh[hs : 2 * hs])
            cand = np.tanh(gi[2 * hs :] + r * gh[2 * hs :])
            h = (1 - z) * cand + z * h
            out[n, t] = h
    return out


NAIVE = {"lstm": naive_lstm, "gru": naive_gru}


def random_params(graph, rng: np.random.Generator) -> dict:  # noqa: ANN001
    return {p.value.name: rng.uniform(-0.8, 0.8, p.value.type.shape) for p in graph.params}


CASES = [(k, s, b) for k in ("lstm", "gru") for s in (True, False) for b in (True, False)]


@pytest.mark.parametrize("kind, sequences, bias", CASES)
def test_the_forward_pass_is_pytorchs(kind: str, sequences: bool, bias: bool) -> None:
    graph = compile_text(text(kind, sequences, bias)).program.graph
    rng = np.random.default_rng(4)
    params = random_params(graph, rng)
    x = rng.standard_normal((N, T, D))
    got = run(infer_program(graph), {"x": x}, params, np.float64).outputs["predict"]
    want = NAIVE[kind](x, params, bias)
    np.testing.assert_allclose(got, want if sequences else want[:, -1], rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_one_step_and_a_hidden_size_of_one(kind: str) -> None:
    graph = compile_text(text(kind, t=1, h=1)).program.graph
    rng = np.random.default_rng(5)
    params = random_params(graph, rng)
    x = rng.standard_normal((N, 1, D))
    got = run(infer_program(graph), {"x": x}, params, np.float64).outputs["predict"]
    np.testing.assert_allclose(got, NAIVE[kind](x, params, True), rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind, sequences, bias", [(k, s, True) for k in ("lstm", "gru") for s in (True, False)]
                         + [("lstm", True, False), ("gru", False, False)])  # fmt: skip
def test_gradients_match_central_differences(kind: str, sequences: bool, bias: bool) -> None:
    graph = compile_text(text(kind, sequences, bias, t=3, h=3)).program.graph
    rng = np.random.default_rng(6)
    params = random_params(graph, rng)
    feeds = {"x": rng.standard_normal((N, 3, D)), "target": rng.standard_normal((N, 3, 3) if sequences else (N, 3))}
    program = gradient_program(graph)
    out = run(program, feeds, params, np.float64).outputs
    for name, value in params.items():
        flat = value.reshape(-1)
        for idx in rng.choice(flat.size, size=min(5, flat.size), replace=False):
            h = 1e-6
            plus, minus = flat.copy(), flat.copy()
            plus[idx] += h
            minus[idx] -= h
            fp = run(program, feeds, params | {name: plus.reshape(value.shape)}, np.float64).outputs["loss"]
            fm = run(program, feeds, params | {name: minus.reshape(value.shape)}, np.float64).outputs["loss"]
            numeric = (fp - fm) / (2 * h)
            got = out[f"grad:{name}"].reshape(-1)[idx]
            assert abs(got - numeric) <= 1e-6 * max(1.0, abs(numeric)), f"d{name}[{idx}]: {got} vs {numeric}"


@pytest.mark.parametrize("kind, gates", [("lstm", 4), ("gru", 3)])
def test_parameters_are_laid_out_and_initialised_as_pytorchs(kind: str, gates: int) -> None:
    graph = compile_text(text(kind)).program.graph
    shapes = {p.value.name: p.value.type.shape for p in graph.params}
    assert shapes == {
        "rnn.W_ih": (gates * H, D), "rnn.W_hh": (gates * H, H), "rnn.b_ih": (gates * H,), "rnn.b_hh": (gates * H,),
    }  # fmt: skip
    bound = 1 / math.sqrt(H)
    values = []
    for p in graph.params:
        assert p.init.kind == "uniform" and p.init.args == (pytest.approx(bound),)
        values.append(init_array(p.value.name, p.value.type.shape, p.init.kind, p.init.args, p.init.fan_in,
                                 p.init.fan_out, 1).reshape(-1))  # fmt: skip
    every = np.abs(np.concatenate(values))
    assert every.max() <= bound and every.max() > 0.9 * bound and 0.4 * bound < every.mean() < 0.6 * bound
    no_bias = compile_text(text(kind, bias=False)).program.graph
    assert sorted(p.value.name for p in no_bias.params) == ["rnn.W_hh", "rnn.W_ih"]


def test_the_unrolled_program_has_one_input_gemm_and_one_gemm_per_later_step() -> None:
    stmts = compile_text(text("lstm", t=8)).program.graph.stmts
    ops = [s.op for s in stmts]
    linear = [s for s in stmts if s.op == "linear"]
    assert len(linear) == 8  # the input projection of all steps, then h·W_hhᵀ from step 1 on
    assert linear[0].inputs[0].type.shape == (N * 8, D) and linear[0].out.type.shape == (N * 8, 4 * H)
    assert all(s.inputs[0].type.shape == (N, H) and s.out.type.shape == (N, 4 * H) for s in linear[1:])
    assert ops.count("slice") == 8  # each step's rows of the projection; no gate is sliced out on its own
    assert ops.count("indexed") == 16  # c and h per step
    assert ops.count("concat") == 1


@pytest.mark.parametrize(
    "source, message",
    [
        ("input x : [N, 12]\nh = lstm(x, 4)\n", "lstm expects a 3-D input [N, T, D] (batch first), got f32[3,12]"),
        (
            "input x : [N, 2, 3, 4]\nh = gru(x, 4)\n",
            "gru expects a 3-D input [N, T, D] (batch first), got f32[3,2,3,4]",
        ),
        ("input x : [N, 5, 4]\nh = lstm(x, 0)\n", "hidden"),
        ("input x : [N, 5, 4]\nh = gru(x, -2)\n", "hidden"),
        ("input x : [N, 5] int vocab 7\nh = lstm(x, 4)\n", "lstm expects a 3-D input"),
        ("input x : [N, 5, 2] int vocab 7\nh = lstm(x, 4)\n", "lstm expects float data"),
        ("input x : [N, 5, 4]\nh = lstm(x, 4, sequences=2)\n", "sequences"),
    ],
)
def test_errors_are_located(source: str, message: str) -> None:
    rendered = error_text(f"network E\nconst N = 3\n{source}loss = mse(h, h)\n")
    assert message in rendered
    assert "t.ddsl:" in rendered and "^" in rendered


def test_the_example_network_checks_runs_and_learns(cli) -> None:  # noqa: ANN001
    path = str(ROOT / "networks" / "examples" / "lstm_classifier.ddsl")
    r = cli("check", path, "--layers")
    assert r.exit_code == 0, r.output
    assert "rnn    lstm  f32[16,8,32]" in r.output and "rnn2   gru   f32[16,32]" in r.output
    r = cli("run", path, "--iters", "20", "--set", "N=8", "--json")
    assert r.exit_code == 0, r.output
    losses = json.loads(r.stdout)["losses"]
    assert len(losses) == 20 and np.mean(losses[-5:]) < 0.75 * np.mean(losses[:5])
    r = cli("memcheck", path, "--set", "N=8")
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("remat", ["none", "cheap", "full"])
def test_the_example_runs_inside_its_poisoned_memory_plan(remat: str) -> None:
    """memcheck's plan of a training step: every value where the plan puts it, freed memory poisoned with NaN, gives
    the unplanned step's loss and updates."""
    from helpers import feeds_and_params

    from deepdsl import api
    from deepdsl.backends.numpy_runner import run_plan
    from deepdsl.memory import plan
    from deepdsl.memory.check import check_plan
    from deepdsl.memory.remat import rematerialise
    from deepdsl.memory.report import total_peak

    path = ROOT / "networks" / "examples" / "lstm_classifier.ddsl"
    g = api.compile_file(path, {"N": 4, "T": 5, "H": 6}, stop_at="opt").opt
    p = check_plan(plan(rematerialise(g, remat, small=0)))
    feeds, params = feeds_and_params(g, np.random.default_rng(0))
    plain = run(g, feeds, params)
    planned = run_plan(p, feeds, params, poison=True)
    assert (planned.peak_bytes, planned.arena_bytes) == (total_peak(p), p.arena_bytes)
    for k, v in plain.outputs.items():
        np.testing.assert_allclose(planned.outputs[k], v, rtol=1e-6)
    for k, v in plain.updates.items():
        np.testing.assert_allclose(planned.updates[k], v, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("kind, sequences", [("lstm", True), ("gru", False)])
def test_long_sequences_take_their_steps_in_blocks(kind: str, sequences: bool) -> None:
    """Past 16 steps each step's rows are sliced out of a block of ⌈√T⌉ steps, so that the backward pass pads
    T gradients into [N, ⌈√T⌉, G] blocks and only the ⌈√T⌉ blocks into the whole [N, T, G] (not T of them): the
    same values, forward and backward."""
    t = 20
    graph = compile_text(text(kind, sequences, t=t, h=2)).program.graph
    g = (4 if kind == "lstm" else 3) * 2
    slices = [s for s in graph.stmts if s.op == "slice"]
    assert len(slices) == 4 + t and sum(s.out.type.shape[1] == 5 for s in slices) == 4  # blocks of ⌈√20⌉ = 5
    program = gradient_program(graph)
    whole = [s for s in program.stmts if s.op == "pad_axis" and s.out.type.shape == (N, t, g)]
    assert len(whole) == 4
    rng = np.random.default_rng(8)
    params = random_params(graph, rng)
    x = rng.standard_normal((N, t, D))
    got = run(infer_program(graph), {"x": x}, params, np.float64).outputs["predict"]
    want = NAIVE[kind](x, params, True)
    np.testing.assert_allclose(got, want if sequences else want[:, -1], rtol=0, atol=1e-12)
    feeds = {"x": x, "target": rng.standard_normal(got.shape)}
    out = run(program, feeds, params, np.float64).outputs
    name = "rnn.W_ih"
    flat = params[name].reshape(-1)
    for idx in rng.choice(flat.size, size=6, replace=False):
        plus, minus = flat.copy(), flat.copy()
        plus[idx] += 1e-6
        minus[idx] -= 1e-6
        fp = run(program, feeds, params | {name: plus.reshape(params[name].shape)}, np.float64).outputs["loss"]
        fm = run(program, feeds, params | {name: minus.reshape(params[name].shape)}, np.float64).outputs["loss"]
        numeric = (fp - fm) / 2e-6
        assert abs(out[f"grad:{name}"].reshape(-1)[idx] - numeric) <= 1e-6 * max(1.0, abs(numeric))
