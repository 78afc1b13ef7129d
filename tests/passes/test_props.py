"""Property: on random small graphs of element-wise ops, broadcasts and reductions, the whole pipeline
preserves every output and update (float64)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from deepdsl.backends.numpy_runner import run, run_plan
from deepdsl.ir import GraphBuilder, Init, ParamDef, TensorType, Value
from deepdsl.memory import plan
from deepdsl.passes import run_pipeline

X = TensorType((2, 3, 2, 2))
C = TensorType((3,))
UNARY = ["relu", "tanh", "sigmoid", "neg", "abs"]
BINARY = ["add", "sub", "mul"]


@st.composite
def graphs(draw):  # noqa: ANN001, ANN201
    b = GraphBuilder("P")
    big = [b.add_param(ParamDef(Value(f"x{k}", X), Init("constant", (0.0,)))) for k in range(2)]
    small = [b.add_param(ParamDef(Value("c", C), Init("constant", (0.0,))))]
    scalars = []
    for _ in range(draw(st.integers(2, 12))):
        kind = draw(st.sampled_from(["unary", "binary", "scalar", "bias", "csum", "bcast", "sum", "bn", "relu_grad"]))
        x = draw(st.sampled_from(big))
        if kind == "unary":
            big.append(b.emit(draw(st.sampled_from(UNARY)), x))
        elif kind == "binary":
            big.append(b.emit(draw(st.sampled_from(BINARY)), x, draw(st.sampled_from(big))))
        elif kind == "scalar":
            op = draw(st.sampled_from(["add_scalar", "mul_scalar", "rsub_scalar"]))
            big.append(b.emit(op, x, value=draw(st.sampled_from([0.0, 1.0, -2.0, 0.5]))))
        elif kind == "bias":
            big.append(b.emit("bias_add", x, draw(st.sampled_from(small))))
        elif kind == "csum":
            small.append(b.emit(draw(st.sampled_from(["channel_sum", "channel_mean"])), x))
        elif kind == "bcast":
            big.append(b.emit("broadcast_channel", draw(st.sampled_from(small)), shape=X.shape))
        elif kind == "sum":
            scalars.append(b.emit(draw(st.sampled_from(["sum", "sum_squares"])), x))
        elif kind == "bn":
            m = b.emit("channel_mean", x)
            v = b.emit("channel_var", x, m)
            big.append(b.emit("bn_apply", x, m, v, eps=1e-5))
        else:
            big.append(b.emit("relu_grad", x, draw(st.sampled_from(big))))
    pool = big[2:] + small[1:] + scalars
    if not pool:
        pool = [b.emit("relu", big[0])]
    for k, v in enumerate(draw(st.lists(st.sampled_from(pool), min_size=1, max_size=3, unique_by=lambda v: v.name))):
        b.output(f"out{k}", v)
    return b.build()


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(graphs())
def test_pipeline_preserves_outputs(g) -> None:  # noqa: ANN001
    rng = np.random.default_rng(0)
    params = {p.value.name: rng.standard_normal(p.value.type.shape) for p in g.params}
    opt, _ = run_pipeline(g, level=2, check=True)
    before = run(g, {}, params, np.float64).outputs
    after = run(opt, {}, params, np.float64).outputs
    for name, value in before.items():
        np.testing.assert_allclose(after[name], value, rtol=1e-9, atol=1e-9)
    # and as planned (the memory schedule's order, shared buffers, freed regions poisoned), in float32
    planned = run_plan(plan(opt), {}, params, poison=True).outputs
    for name, value in before.items():
        scale = max(float(np.max(np.abs(value))), 1.0)
        np.testing.assert_allclose(planned[name], value, rtol=1e-4, atol=1e-4 * scale)
