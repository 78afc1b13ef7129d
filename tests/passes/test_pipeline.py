"""The optimiser: every pass keeps the numbers, the verifier holds after each, fusion lowers the kernel count."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import REDUCED, ROOT, feeds_and_params, with_slow

from deepdsl import api
from deepdsl.backends.numpy_runner import run
from deepdsl.passes import PASS_NAMES, kernels, run_pipeline


def _close(a: dict, b: dict, rtol: float) -> None:
    for k in a:
        scale = max(float(np.max(np.abs(a[k]))), 1e-12)
        err = float(np.max(np.abs(np.asarray(a[k]) - np.asarray(b[k])))) / scale
        assert err <= rtol, f"{k}: relative difference {err}"


@pytest.mark.parametrize("name", with_slow(sorted(REDUCED)))
def test_every_pass_keeps_loss_gradients_and_updates(name: str, compiled) -> None:  # noqa: ANN001
    sets, _ = REDUCED[name]
    train = compiled(name, sets, stop_at="train").train
    rng = np.random.default_rng(0)
    feeds, params = feeds_and_params(train, rng)
    for p in train.params:  # non-zero optimizer state, so the updates see every input
        if p.kind == "opt":
            params[p.value.name] = rng.standard_normal(p.value.type.shape) * 0.01
    # in float64: a conv bias before batch norm has a gradient that is zero but for rounding, and in float32 that
    # noise (a few 1e-7 of the momentum's scale) moves with the summation order a pass picks
    before = run(train, feeds, params, dtype=np.float64)
    seen = []

    def compare(pass_name: str, g) -> None:  # noqa: ANN001
        after = run(g, feeds, params, dtype=np.float64)
        _close(before.outputs, after.outputs, 1e-5)
        _close(before.updates, after.updates, 1e-5)  # momentum buffers hold the gradients
        seen.append(pass_name)

    run_pipeline(train, level=2, check=True, dump_after=compare)
    assert seen == list(PASS_NAMES)


@pytest.mark.parametrize("name", ["lenet", "resnet50"])
def test_optimised_training_program_has_fewer_kernels(name: str, compiled) -> None:  # noqa: ANN001
    c0 = compiled(name, {"N": 2}, stop_at="opt", options=api.Options(level=0))  # kernels do not depend on N
    c2 = compiled(name, {"N": 2}, stop_at="opt")
    assert c0.opt == c0.train  # -O0 runs no pass
    assert kernels(c2.opt) < kernels(c0.opt)


def test_disabled_passes_do_not_run(compiled) -> None:  # noqa: ANN001
    c = compiled("lenet", stop_at="opt", options=api.Options(disabled=("fuse",)))
    assert [p.name for p in c.passes] == [n for n in PASS_NAMES if n != "fuse"]
    assert not any(s.op == "fused" or "epilogue" in s.a for s in c.opt.stmts)


def test_stats_json_lists_stages_and_passes(cli) -> None:  # noqa: ANN001
    import json

    r = cli("ir", str(ROOT / "networks" / "lenet.ddsl"), "--stats", "--json")
    obj = json.loads(r.stdout)
    assert [s["stage"] for s in obj["stages"]] == ["graph", "train", "opt"]
    assert [p["pass"] for p in obj["passes"]] == list(PASS_NAMES)
    assert obj["stages"][-1]["kernels"] == obj["passes"][-1]["kernels"] < obj["stages"][1]["kernels"]


def test_unknown_pass_is_a_usage_error(cli) -> None:  # noqa: ANN001
    r = cli("ir", str(ROOT / "networks" / "lenet.ddsl"), "--no-pass", "fusion")
    assert r.exit_code == 2 and "no pass named 'fusion'" in r.output


def test_dump_after_prints_the_program_after_that_pass(cli) -> None:  # noqa: ANN001
    r = cli("ir", str(ROOT / "networks" / "lenet.ddsl"), "--dump-after", "fuse", "--stage", "graph")
    assert r.exit_code == 0
    assert r.stdout.startswith("graph LeNet")  # --stage graph does not optimise: nothing to dump
    r = cli("ir", str(ROOT / "networks" / "lenet.ddsl"), "--dump-after", "fuse")
    assert r.stdout.startswith("# after fuse\ngraph LeNet") and ("fused(" in r.stdout or "epilogue=" in r.stdout)


def test_inplace_reuses_dying_buffers_and_lowers_the_measured_peak() -> None:
    train = api.compile_file(ROOT / "networks" / "lenet.ddsl", {"N": 8}, stop_at="train").train
    with_inplace, _ = run_pipeline(train, disabled=("fuse",))  # fusion leaves LeNet no element-wise chain
    without, _ = run_pipeline(train, disabled=("fuse", "inplace"))
    marked = [s for s in with_inplace.stmts if "inplace" in s.a]
    assert marked, "LeNet's training program has element-wise statements whose input dies there"
    for s in marked:
        v = s.inputs[s.a["inplace"]]
        assert v.type == s.out.type
        assert not any(v in t.inputs for t in with_inplace.stmts[with_inplace.stmts.index(s) + 1 :])
    rng = np.random.default_rng(0)
    feeds, params = feeds_and_params(train, rng)
    a, b = run(with_inplace, feeds, params), run(without, feeds, params)
    assert a.arena_bytes <= b.arena_bytes
    _close(b.updates, a.updates, 0.0)


def test_inplace_halves_the_peak_of_an_elementwise_chain() -> None:
    from deepdsl.ir import GraphBuilder, Init, ParamDef, TensorType, Value

    b = GraphBuilder("C")
    x = b.add_param(ParamDef(Value("x", TensorType((1000,))), Init("constant", (0.0,))))
    b.output("out", b.emit("tanh", b.emit("exp", x)))
    g = b.build()
    only = tuple(n for n in PASS_NAMES if n != "inplace")
    marked, _ = run_pipeline(g, disabled=only)
    assert [s.a.get("inplace") for s in marked.stmts] == [None, 0]
    params = {"x": np.linspace(-1, 1, 1000)}
    assert run(marked, {}, params).arena_bytes == 4000 < run(g, {}, params).arena_bytes == 8000


def test_motion_sinks_statements_to_their_first_use() -> None:
    from deepdsl.ir import GraphBuilder, Init, ParamDef, TensorType, Value
    from deepdsl.passes.motion import motion

    b = GraphBuilder("M")
    x = b.add_param(ParamDef(Value("x", TensorType((4,))), Init("constant", (0.0,))))
    early = b.emit("exp", x)  # only needed at the end
    t = b.emit("relu", x)
    t = b.emit("tanh", t)
    b.output("out", b.emit("add", t, early))
    g = b.build()
    assert [s.op for s in motion(g).stmts] == ["relu", "tanh", "exp", "add"]


def test_motion_hoists_the_loop_invariant_loss_seed_out_of_the_step() -> None:
    """The `fill` that seeds the backward pass is the same in every step: the optimised program reads it as a
    constant set once (kind "const"), launches one kernel fewer, and trains to the same numbers."""
    from deepdsl.data.named import fields_of, load_samples
    from deepdsl.trainer import Trainer

    c = api.compile_file(ROOT / "networks" / "lenet.ddsl", {"N": 4}, stop_at="opt")
    assert any(s.op == "fill" for s in c.train.stmts)
    assert not any(s.op == "fill" for s in c.opt.stmts)
    (const,) = [p for p in c.opt.params if p.kind == "const"]
    assert const.init.kind == "constant" and const.init.args == (1.0,)
    assert any(const.value in s.inputs for s in c.opt.stmts)
    unhoisted = api.compile_file(ROOT / "networks" / "lenet.ddsl", {"N": 4}, stop_at="opt",
                                 options=api.Options(disabled=("motion",)))  # fmt: skip
    assert kernels(c.opt) == kernels(unhoisted.opt) - 1
    # a constant is part of the program, not of its state: parameter files do not hold it
    program = c.program
    data = load_samples("synthetic", {}, fields_of(program.graph.inputs), 1)
    trainer = Trainer(api.build(program), data)
    losses = [trainer.step()[0] for _ in range(3)]
    assert const.value.name not in trainer.state()
    plain = Trainer(api.build(program, api.Options(disabled=("motion",))), data)
    np.testing.assert_allclose(losses, [plain.step()[0] for _ in range(3)], rtol=1e-6)


ADAM = """network A
const N = 4
input x : [N, 8]
label y : [N] classes 3
layer fc = full(3)
loss = softmax_cross_entropy(fc(x), y)
train { optimizer = adam(lr=0.01) iterations = 2 seed = 1 data = synthetic }
"""


def _update_kernels(c: api.Compilation) -> list[tuple[str, ...]]:
    from deepdsl.memory.groups import planned_groups

    updates = {"sgd_momentum", "sgd_step", "adam_moment", "adam_step"}
    groups = planned_groups(c.plan)  # in the order the backends emit, with its memory
    return [tuple(s.op for s in g) for g in groups if any(s.op in updates for s in g)]


@pytest.mark.parametrize("name", ["mlp", "lenet", "alexnet"])
def test_each_parameters_sgd_update_is_one_kernel(name: str, compiled) -> None:  # noqa: ANN001
    c = compiled(name, {"N": 2}, stop_at="plan")
    kernels_ = _update_kernels(c)
    assert kernels_ and all(k == ("sgd_momentum", "sgd_step") for k in kernels_)
    assert len(kernels_) == len(c.plan.graph.trainable)


def test_adam_moments_and_step_are_one_kernel() -> None:
    c = api.compile_source(ADAM, "adam.ddsl", stop_at="plan")
    assert _update_kernels(c) == [("adam_moment", "adam_moment", "adam_step")] * 2


def test_resnet50_updates_share_a_loop_unless_the_weight_is_still_read(compiled) -> None:  # noqa: ANN001
    """A convolution's weight is still read by its backward-data after its gradient is complete, and a batch norm's
    scale by its backward (bn_train_backward, after the scale's gradient so that the sum recomputing x's normalised
    values keeps x alive no longer): the step waits for that reader while the momentum runs at once to free the
    gradient, so those two stay apart."""
    c = compiled("resnet50", {"N": 2}, stop_at="plan")
    kernels_ = _update_kernels(c)
    together = sum(1 for k in kernels_ if k == ("sgd_momentum", "sgd_step"))
    scales = sum(1 for p in c.plan.graph.trainable if p.value.name.endswith(".gamma"))
    assert scales == 53
    assert together >= 0.85 * (len(c.plan.graph.trainable) - scales)  # 96 of the 108 others
    assert all(k in (("sgd_momentum", "sgd_step"), ("sgd_momentum",), ("sgd_step",)) for k in kernels_)
