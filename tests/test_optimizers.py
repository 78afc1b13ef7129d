"""AdamW, RMSprop and Nesterov SGD against hand-written float64 NumPy references of PyTorch's formulas (torch.optim
AdamW, RMSprop with centered=False, SGD with nesterov=True) over several steps; the train block's `freeze` (no
gradient statements, no update, no state, less memory; batch norm's running statistics still update) and
`lr_mult` (the rate of the parameters it names multiplied, with a schedule too); and their errors, located."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import HEADER, compile_text

from deepdsl import api
from deepdsl.autodiff import LR, gradient_program, train_program
from deepdsl.backends.numpy_runner import run
from deepdsl.errors import DslError
from deepdsl.memory.report import report
from deepdsl.run_settings import parse_setting, with_settings
from deepdsl.running import run_training

NET = (HEADER + "layer h = full(6)\nlayer f = full(10)\nz = f(relu(h(flatten(x))))\n"
       "loss = softmax_cross_entropy(z, y)\npredict = z\n")  # fmt: skip
STEPS = 4


def _optimizer(spec: str) -> tuple:
    """The optimizer tuple of `spec` as the train block gives it (its defaults filled in)."""
    return compile_text(NET + f"train {{\n  optimizer = {spec}\n}}\n").program.train.optimizer


def _setup(seed: int = 5):  # noqa: ANN202
    rng = np.random.default_rng(seed)
    graph = compile_text(NET).program.graph
    params = {p.value.name: rng.standard_normal(p.value.type.shape) * 0.3 for p in graph.params}
    feeds = [{"x": rng.random((4, 3, 8, 8)), "y": rng.integers(0, 10, 4)} for _ in range(STEPS)]
    return graph, params, feeds


def _grads(graph, params, feed):  # noqa: ANN001, ANN202
    out = run(gradient_program(graph), feed, params, np.float64).outputs
    return {k[5:]: v for k, v in out.items() if k.startswith("grad:")}


def _train(graph, optimizer, params, feeds, rates=None, **kw):  # noqa: ANN001, ANN202
    """`STEPS` steps of deepdsl's train program in float64 (the rate of step k `rates[k]` where given)."""
    g = train_program(graph, optimizer, scheduled=rates is not None, **kw)
    arrays = {p.value.name: np.zeros(p.value.type.shape) for p in g.params} | dict(params)
    for k, feed in enumerate(feeds):
        extra = {} if rates is None else {LR: np.asarray(rates[k])}
        arrays |= run(g, feed | extra, arrays, np.float64).updates
    return arrays


# PyTorch's update of one parameter (torch/optim/{adamw,rmsprop,sgd}.py, single-tensor path), written out
def _adamw(w, g, st, t, lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01, **_):  # noqa: ANN001, ANN202
    w = w * (1 - lr * weight_decay)
    st["m"] = beta1 * st.get("m", 0) + (1 - beta1) * g
    st["v"] = beta2 * st.get("v", 0) + (1 - beta2) * g * g
    denom = np.sqrt(st["v"]) / np.sqrt(1 - beta2**t) + eps
    return w - lr / (1 - beta1**t) * st["m"] / denom


def _rmsprop(w, g, st, t, lr, alpha=0.99, eps=1e-8, momentum=0.0, weight_decay=0.0, **_):  # noqa: ANN001, ANN202
    g = g + weight_decay * w
    st["sq"] = alpha * st.get("sq", 0) + (1 - alpha) * g * g
    avg = np.sqrt(st["sq"]) + eps
    if momentum > 0:
        st["buf"] = momentum * st.get("buf", 0) + g / avg
        return w - lr * st["buf"]
    return w - lr * g / avg


def _sgd(w, g, st, t, lr, momentum=0.0, weight_decay=0.0, nesterov=False, **_):  # noqa: ANN001, ANN202
    g = g + weight_decay * w
    st["buf"] = g if t == 1 else momentum * st["buf"] + g  # torch's first buffer is the gradient itself
    return w - lr * (g + momentum * st["buf"] if nesterov else st["buf"])


REFERENCE = {"adamw": _adamw, "rmsprop": _rmsprop, "sgd": _sgd}
CASES = [
    "adamw()",
    "adamw(lr=0.01, beta1=0.8, beta2=0.99, eps=1e-6, weight_decay=0.1)",
    "rmsprop()",
    "rmsprop(lr=0.005, alpha=0.9, eps=1e-6, momentum=0.8, weight_decay=0.05)",
    "sgd(lr=0.1, momentum=0.9, nesterov=true)",
    "sgd(lr=0.1, momentum=0.5, weight_decay=0.01, nesterov=true)",
]


def _reference(graph, optimizer, params, feeds, rates=None, mult=None):  # noqa: ANN001, ANN202
    name, args = optimizer
    a = dict(args)
    ws = dict(params)
    state: dict[str, dict] = {k: {} for k in ws}
    trained = [p.value.name for p in graph.params if p.kind == "param"]
    for k, feed in enumerate(feeds):
        grads = _grads(graph, ws, feed)
        for p in trained:
            lr = (a["lr"] if rates is None else rates[k]) * (mult or {}).get(p, 1.0)
            ws[p] = REFERENCE[name](ws[p], grads[p], state[p], k + 1, **{**a, "lr": lr})
    return ws


@pytest.mark.parametrize("spec", CASES)
def test_each_update_follows_pytorchs_formula_over_several_steps(spec: str) -> None:
    graph, params, feeds = _setup()
    optimizer = _optimizer(spec)
    got = _train(graph, optimizer, params, feeds)
    want = _reference(graph, optimizer, params, feeds)
    for name, w in want.items():
        assert not np.allclose(w, params[name]), name  # the step moved it
        np.testing.assert_allclose(got[name], w, rtol=1e-10, atol=1e-12, err_msg=f"{spec}: {name}")


@pytest.mark.parametrize("spec", [CASES[1], CASES[3], CASES[5]])
def test_a_schedule_and_lr_mult_multiply_the_rate_of_every_optimizer(spec: str) -> None:
    graph, params, feeds = _setup(7)
    optimizer = _optimizer(spec)
    rates = [0.02, 0.01, 0.03, 0.005]
    mult = {"h.W": 10.0, "h.b": 10.0, "f.W": 0.5}  # h as a layer, f.W alone; f.b keeps the rate
    lr_mult = (("h", 10.0), ("f.W", 0.5))
    got = _train(graph, optimizer, params, feeds, rates, lr_mult=lr_mult)
    want = _reference(graph, optimizer, params, feeds, rates, mult)
    for name, w in want.items():
        np.testing.assert_allclose(got[name], w, rtol=1e-10, atol=1e-12, err_msg=f"{spec}: {name}")
    constant = _train(graph, optimizer, params, feeds, lr_mult=lr_mult)  # the optimizer's own lr, multiplied
    np.testing.assert_allclose(constant["h.W"], _reference(graph, optimizer, params, feeds, mult=mult)["h.W"],
                               rtol=1e-10)  # fmt: skip


def test_the_optimizer_state_is_torchs() -> None:
    graph = compile_text(NET).program.graph
    opt = {s: sorted(p.value.name for p in train_program(graph, _optimizer(s)).params if p.kind == "opt")
           for s in ("adamw()", "rmsprop()", "rmsprop(momentum=0.9)", "sgd(momentum=0.9, nesterov=true)")}  # fmt: skip
    assert opt["adamw()"] == ["opt/f.W/m", "opt/f.W/v", "opt/f.b/m", "opt/f.b/v", "opt/h.W/m", "opt/h.W/v",
                              "opt/h.b/m", "opt/h.b/v", "opt/step"]  # fmt: skip
    assert opt["rmsprop()"] == ["opt/f.W/square_avg", "opt/f.b/square_avg", "opt/h.W/square_avg", "opt/h.b/square_avg"]
    assert len(opt["rmsprop(momentum=0.9)"]) == 8 and "opt/h.W/momentum" in opt["rmsprop(momentum=0.9)"]
    assert opt["sgd(momentum=0.9, nesterov=true)"] == ["opt/f.W/momentum", "opt/f.b/momentum", "opt/h.W/momentum",
                                                       "opt/h.b/momentum"]  # fmt: skip


def test_the_settings_flags_reach_the_new_optimizers() -> None:
    program = compile_text(NET + "train {\n  optimizer = rmsprop(momentum=0.5)\n}\n").program
    assert parse_setting("--alpha", "0.5") == 0.5
    with pytest.raises(ValueError, match=r"--alpha takes a number in \[0, 1\), not '1'"):
        parse_setting("--alpha", "1")
    changed = dict(with_settings(program, {"alpha": 0.5, "momentum": 0.7, "eps": 1e-3}).train.optimizer[1])
    assert (changed["alpha"], changed["momentum"], changed["eps"]) == (0.5, 0.7, 1e-3)
    adamw = compile_text(NET + "train {\n  optimizer = adamw()\n}\n").program
    assert dict(with_settings(adamw, {"weight_decay": 0.5}).train.optimizer[1])["weight_decay"] == 0.5
    with pytest.raises(DslError, match="has no setting 'alpha'"):
        with_settings(adamw, {"alpha": 0.5})


# ---- freeze ----

BN_NET = (HEADER + "layer cv1 = conv(4, kernel=3)\nlayer bn = batch_norm()\nlayer cv2 = conv(4, kernel=3)\n"
          "layer fc = full(10)\nnet = fc o flatten o relu o cv2 o relu o bn o cv1\n"
          "loss = softmax_cross_entropy(net(x), y)\npredict = net(x)\n")  # fmt: skip


def _program(text: str, train: str) -> api.Compilation:
    return compile_text(text + "train {\n  " + train + "\n}\n")


def test_a_frozen_layer_gets_no_gradient_statement_no_update_and_no_state() -> None:
    free = api.train_stage(_program(BN_NET, "optimizer = adam()").program)
    frozen = api.train_stage(_program(BN_NET, 'optimizer = adam()\n  freeze = ("cv2", "bn.gamma")').program)

    def filter_gradients(g):  # noqa: ANN001, ANN202
        return [s for s in g.stmts if s.op == "conv2d_backward_filter"]

    assert len(filter_gradients(free)) == 2
    (only,) = filter_gradients(frozen)  # cv1's; cv2's input gradient still flows through it
    assert only.out.type.shape == (4, 3, 3, 3) and any(s.op == "conv2d_backward_data" for s in frozen.stmts)
    updated = {name for name, _ in frozen.updates}
    assert {"cv2.W", "cv2.b", "bn.gamma"}.isdisjoint(updated) and {"cv1.W", "bn.beta", "fc.W"} <= updated
    assert {"bn.running_mean", "bn.running_var"} <= updated  # running statistics update, as PyTorch's train mode
    state = {p.value.name for p in frozen.params if p.kind == "opt"}
    assert not any(n.startswith(("opt/cv2.", "opt/bn.gamma/")) for n in state) and "opt/cv1.W/m" in state
    # no statement computes a value shaped as cv2.W (its gradient) or reads an optimizer state of it
    assert not any(s.out.type.shape == (4, 4, 3, 3) for s in frozen.stmts)
    # a frozen stem (cv1 and bn's affine parameters) costs no backward pass at all: nothing flows back past cv2
    stem = api.train_stage(_program(BN_NET, 'optimizer = adam()\n  freeze = ("cv1", "bn")').program)
    assert not any(s.op in ("conv2d_backward_data", "conv2d_backward_filter", "bn_train_backward")
                   for s in stem.stmts if s.out.type.shape != (4, 4, 3, 3))  # fmt: skip
    assert [s.op for s in stem.stmts].count("conv2d_backward_filter") == 1  # cv2's only


def test_frozen_parameters_are_unchanged_after_training(tmp_path) -> None:  # noqa: ANN001
    c = _program(BN_NET, 'optimizer = sgd(lr=0.1, momentum=0.9)\n  freeze = "cv2"\n  iterations = 3')
    build = api.build(c.program)
    run_training(build, device="cpu", data_flag="synthetic", iters=0, save=str(tmp_path / "a.npz"))
    run_training(build, device="cpu", data_flag="synthetic", save=str(tmp_path / "b.npz"))
    a, b = np.load(tmp_path / "a.npz"), np.load(tmp_path / "b.npz")
    np.testing.assert_array_equal(a["cv2.W"], b["cv2.W"])
    np.testing.assert_array_equal(a["cv2.b"], b["cv2.b"])
    assert not np.array_equal(a["cv1.W"], b["cv1.W"]) and not np.array_equal(a["fc.W"], b["fc.W"])
    assert not np.array_equal(a["bn.running_mean"], b["bn.running_mean"])


def test_memcheck_shows_the_saving_of_a_frozen_layer() -> None:
    def figures(train: str) -> dict:
        return report(api.build(_program(BN_NET.replace("conv(4,", "conv(16,"), train).program).train_plan)

    free, frozen = figures("optimizer = adam()"), figures('optimizer = adam()\n  freeze = ("cv1", "cv2")')
    cv = (16 * 3 * 9 + 16) * 4 + (16 * 16 * 9 + 16) * 4
    assert free["optimizer_state_bytes"] - frozen["optimizer_state_bytes"] == 2 * cv
    assert free["gradient_bytes"] - frozen["gradient_bytes"] == cv
    assert frozen["peak_bytes"] < free["peak_bytes"] - 2 * cv
    assert frozen["parameter_bytes"] == free["parameter_bytes"]


# ---- errors, each at its place ----


@pytest.mark.parametrize(
    ("train", "message", "at", "hint"),
    [
        (
            "optimizer = sgd(lr=0.1, nesterov=true)",
            "nesterov=true needs a momentum above 0",
            "nesterov=true",
            "momentum=0.9",
        ),
        (
            'freeze = ("cv1", "cv22")',
            "freeze: 'cv22' names no trainable parameter or layer",
            '"cv22"',
            "did you mean 'cv2'",
        ),
        ('freeze = "bn.gama"', "freeze: 'bn.gama' names no", '"bn.gama"', "did you mean 'bn.gamma'"),
        ('freeze = "bn.running_mean"', "names no trainable parameter", '"bn.running_mean"', None),
        ("freeze = 3", "'freeze' takes a layer or parameter name", "3", None),
        ('freeze = ("cv1", "cv1")', "freeze: 'cv1' is given twice", '"cv1")', None),
        ('freeze = ("cv1", "bn", "cv2", "fc")', "`freeze` names every trainable parameter", '("cv1"', None),
        ('lr_mult = ("fx", 2)', "lr_mult: 'fx' names no", '"fx"', "the layers are: cv1, bn, cv2, fc"),
        ('lr_mult = (("fc", 2), ("cv1", -1))', "the multiplier of 'cv1' must be a number in [0", "-1", None),
        ('lr_mult = (("fc", 2), "cv1")', "'lr_mult' takes pairs (name, multiplier)", '"cv1")', None),
        ('lr_mult = ("fc", 2)\n  freeze = "fc"', "every parameter 'fc' names is frozen", '("fc", 2)', None),
        ("optimizer = rmsprop(alpha=1)", "must be less than 1", "alpha=1", None),
    ],
)
def test_the_errors_are_located(train: str, message: str, at: str, hint: str | None) -> None:
    text = BN_NET + "train {\n  " + train + "\n}\n"
    with pytest.raises(DslError) as err:
        compile_text(text)
    e = err.value
    assert message in e.message, e.message
    assert e.span is not None and e.span.line >= 12, e
    line = text.splitlines()[e.span.line - 1]
    assert line[e.span.col - 1 :].startswith(at), (line, e.span)
    if hint is not None:
        assert hint in (e.hint or ""), e.hint


def test_lr_mult_and_freeze_accept_the_documented_forms() -> None:
    c = _program(BN_NET, 'freeze = "cv1"\n  lr_mult = (("fc", 10), ("bn.beta", 0.5), ("cv2", 0))')
    assert c.program.train.freeze == ("cv1",)
    assert c.program.train.lr_mult == (("fc", 10.0), ("bn.beta", 0.5), ("cv2", 0.0))
    assert _program(BN_NET, 'freeze = ("cv1", "cv2.W")').program.train.freeze == ("cv1", "cv2.W")
    assert _program(BN_NET, 'lr_mult = ("fc", 3)').program.train.lr_mult == (("fc", 3.0),)


def test_the_finetune_example_trains_its_head_and_keeps_its_stem(tmp_path) -> None:  # noqa: ANN001
    from helpers import ROOT

    c = api.compile_file(str(ROOT / "networks" / "examples" / "finetune.ddsl"))
    assert c.program.train.freeze == ("cv1", "bn") and c.program.train.optimizer[0] == "adamw"
    build = api.build(c.program)
    run_training(build, device="cpu", data_flag="synthetic", iters=0, save=str(tmp_path / "a.npz"))
    got = run_training(build, device="cpu", data_flag="synthetic", iters=3, save=str(tmp_path / "b.npz"))
    a, b = np.load(tmp_path / "a.npz"), np.load(tmp_path / "b.npz")
    for name in ("cv1.W", "cv1.b", "bn.gamma", "bn.beta"):
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    for name in ("cv2.W", "fc1.W", "fc2.W", "bn.running_mean"):
        assert not np.array_equal(a[name], b[name]), name
    assert all(np.isfinite(got["losses"]))


def test_fine_tuning_loads_a_run_saved_without_freeze(tmp_path) -> None:  # noqa: ANN001
    # train everything and save (with momentum state for every parameter), then fine-tune with cv1 frozen from that
    # file: the frozen parameters' optimizer state is skipped, the others' loads, and cv1 stays as it was saved
    full = api.build(_program(BN_NET, "optimizer = sgd(lr=0.1, momentum=0.9)\n  iterations = 2").program)
    run_training(full, device="cpu", data_flag="synthetic", save=str(tmp_path / "trained.npz"))
    trained = np.load(tmp_path / "trained.npz")
    assert "opt/cv1.W/momentum" in trained.files
    tune = api.build(_program(BN_NET, 'optimizer = sgd(lr=0.1, momentum=0.9)\n  freeze = "cv1"').program)
    got = run_training(tune, device="cpu", data_flag="synthetic", iters=2, load=str(tmp_path / "trained.npz"),
                       save=str(tmp_path / "tuned.npz"))  # fmt: skip
    tuned = np.load(tmp_path / "tuned.npz")
    assert all(np.isfinite(got["losses"])) and "opt/cv1.W/momentum" not in tuned.files
    np.testing.assert_array_equal(tuned["cv1.W"], trained["cv1.W"])
    assert int(tuned["opt/iteration"]) == int(trained["opt/iteration"]) + 2  # the step counter continues
    assert not np.array_equal(tuned["fc.W"], trained["fc.W"])
    # a different optimizer's state is still an error: not a frozen parameter's
    adam = api.build(_program(BN_NET, 'optimizer = adam()\n  freeze = "cv1"').program)
    with pytest.raises(DslError, match="optimizer state"):
        run_training(adam, device="cpu", data_flag="synthetic", iters=1, load=str(tmp_path / "trained.npz"))
