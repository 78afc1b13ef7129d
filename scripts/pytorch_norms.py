"""Issue 34's built-ins against PyTorch: forward and gradients (to the input and every parameter) in float64.

Each case is a one-layer network `h = CALL(x)`, loss = mse(h, t), compiled by deepdsl and run by its NumPy runner,
and the same module in PyTorch with the same parameters, input and target. The activations' inputs hold their kinks
exactly (-3, 0, 3, 6, the clip bounds), where the gradient conventions differ between libraries and versions.
Prints one line per case and the largest differences; exit status 1 where any exceeds 1e-9 (relative to the
values' scale).

    PYTHONPATH=$PWD /work/torchvenv/bin/python scripts/pytorch_norms.py
"""

from __future__ import annotations

import sys

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812

from deepdsl import api
from deepdsl.autodiff import gradients, lower, replay
from deepdsl.backends.numpy_runner import run
from deepdsl.ir import GraphBuilder

RNG = np.random.default_rng(34)
KINKS = np.array([-7.0, -3.0, -2.5, -0.5, 0.0, 0.5, 1.0, 2.5, 3.0, 5.5, 6.0, 8.0])
TOL = 1e-9


def deepdsl_side(call: str, x: np.ndarray, out_shape: tuple[int, ...], t: np.ndarray, params: dict | None) -> tuple:
    dims = ", ".join(map(str, x.shape))
    text = (f"network T\ninput x : [{dims}]\ninput t : [{', '.join(map(str, out_shape))}]\nlayer m = {call}\n"
            "h = m(x)\nloss = mse(h, t)\npredict = h\n")  # fmt: skip
    g = lower(api.compile_source(text, "case.ddsl").program.graph, "train")
    b = GraphBuilder(g.name)
    for d in g.inputs:
        b.add_input(d)
    for p in g.params:
        b.add_param(p)
    vmap = replay(g, b)
    loss = vmap[g.output("loss").name]
    b.output("loss", loss)
    b.output("predict", vmap[g.output("predict").name])
    names = [p.value.name for p in g.params if p.kind == "param"]
    grads = gradients(b, loss, {"x", *names})
    for name in ("x", *names):
        b.output(f"grad:{name}", grads[name])
    arrays = dict(params or {})
    for p in g.params:  # running statistics start at PyTorch's 0 and 1
        if p.kind == "state":
            arrays[p.value.name] = (
                np.ones(p.value.type.shape) if "var" in p.value.name else np.zeros(p.value.type.shape)
            )
    feeds = {"x": x, "t": t}
    updates = run(g, feeds, arrays, dtype=np.float64).updates  # the training program's (running statistics)
    return run(b.build(), feeds, arrays, dtype=np.float64).outputs, updates, names


def compare(label: str, call: str, x: np.ndarray, module, params: dict[str, np.ndarray] | None = None,  # noqa: ANN001
            torch_names: dict[str, str] | None = None) -> float:  # fmt: skip
    """The largest difference of output, input gradient and parameter gradients (relative to each's scale)."""
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    if isinstance(module, torch.nn.Module):
        module = module.double().train()
        for ours, theirs in (torch_names or {}).items():
            getattr(module, theirs).data = torch.tensor(params[ours], dtype=torch.float64)
    y = module(xt)
    t = RNG.standard_normal(tuple(y.shape))
    F.mse_loss(y, torch.tensor(t)).backward()
    outs, updates, names = deepdsl_side(call, x, tuple(y.shape), t, params)
    pairs = [("forward", outs["predict"], y.detach().numpy()), ("d x", outs["grad:x"], xt.grad.numpy())]
    for ours, theirs in (torch_names or {}).items():
        pairs.append((f"d {ours}", outs[f"grad:{ours}"], getattr(module, theirs).grad.numpy()))
    if isinstance(module, torch.nn.BatchNorm1d):
        pairs += [("running_mean", updates["m.running_mean"], module.running_mean.numpy()),
                  ("running_var", updates["m.running_var"], module.running_var.numpy())]  # fmt: skip
    assert sorted(names) == sorted(torch_names or {}), (names, torch_names)
    worst = 0.0
    parts = []
    for what, a, b in pairs:
        assert a.shape == b.shape, (label, what, a.shape, b.shape)
        diff = float(np.max(np.abs(a - b))) / max(1.0, float(np.max(np.abs(b))))
        worst = max(worst, diff)
        parts.append(f"{what} {diff:.1e}")
    print(f"{'ok ' if worst <= TOL else 'BAD'} {label:<44} {', '.join(parts)}")
    return worst


def affine(c: int) -> dict[str, np.ndarray]:
    return {"m.gamma": 1 + 0.5 * RNG.standard_normal(c), "m.beta": 0.5 * RNG.standard_normal(c)}


AFFINE = {"m.gamma": "weight", "m.beta": "bias"}


def main() -> int:
    print(f"torch {torch.__version__}; deepdsl NumPy runner, float64; differences relative to each value's scale")
    kinked = np.stack([KINKS, -KINKS, KINKS * 0.5])
    smooth = RNG.standard_normal((3, 12)) * 3
    cases = [
        ("relu6 at its kinks", "relu6", kinked, F.relu6),
        ("clip(-0.5, 2.5) at its bounds (torch.clamp)", "clip(-0.5, 2.5)", kinked, lambda v: torch.clamp(v, -0.5, 2.5)),
        ("hard_sigmoid at its kinks (F.hardsigmoid)", "hard_sigmoid", kinked, F.hardsigmoid),
        ("hard_sigmoid(alpha=0.2) (ONNX's, as clamp)", "hard_sigmoid(alpha=0.2, beta=0.5)", smooth,
         lambda v: torch.clamp(0.2 * v + 0.5, 0, 1)),
        ("hard_swish at its kinks (F.hardswish)", "hard_swish", kinked, F.hardswish),
        ("silu (nn.SiLU)", "silu", smooth, F.silu),
    ]  # fmt: skip
    worst = 0.0
    for label, call, x, fn in cases:
        worst = max(worst, compare(label, call, x, fn))
    x = RNG.standard_normal((3, 6, 4, 5)) * 2 + 1
    worst = max(worst, compare("group_norm(3) [3, 6, 4, 5]", "group_norm(3)", x, torch.nn.GroupNorm(3, 6), affine(6),
                               AFFINE))  # fmt: skip
    x = RNG.standard_normal((2, 8, 7))
    worst = max(worst, compare("group_norm(2, eps=1e-3) [2, 8, 7]", "group_norm(2, eps=1e-3)", x,
                               torch.nn.GroupNorm(2, 8, eps=1e-3), affine(8), AFFINE))  # fmt: skip
    x = RNG.standard_normal((2, 4, 3, 5))
    worst = max(worst, compare("instance_norm [2, 4, 3, 5] (InstanceNorm2d)", "instance_norm", x,
                               torch.nn.InstanceNorm2d(4)))  # fmt: skip
    x = RNG.standard_normal((2, 5, 6))
    worst = max(worst, compare("instance_norm(affine=true) [2, 5, 6] (1d)", "instance_norm(affine=true)", x,
                               torch.nn.InstanceNorm1d(5, affine=True), affine(5), AFFINE))  # fmt: skip
    x = RNG.standard_normal((4, 3, 5)) * 2 + 0.5
    worst = max(worst, compare("batch_norm [4, 3, 5] (BatchNorm1d, training)", "batch_norm", x,
                               torch.nn.BatchNorm1d(3), affine(3), AFFINE))  # fmt: skip
    for shape in ((2, 5, 7), (2, 3, 4, 6)):
        params = {"m.W": RNG.standard_normal((4, shape[-1])) * 0.5, "m.b": RNG.standard_normal(4)}
        linear, names = torch.nn.Linear(shape[-1], 4), {"m.W": "weight", "m.b": "bias"}
        worst = max(worst, compare(f"full(4) {list(shape)} (nn.Linear)", "full(4)", RNG.standard_normal(shape),
                                   linear, params, names))  # fmt: skip
    for hw, size, torch_size in (((7, 5), "3", 3), ((5, 6), "(3, 2)", (3, 2)), ((3, 2), "(5, 4)", (5, 4)),
                                 ((8, 6), "(4, 3)", (4, 3)), ((5, 7), "1", 1)):  # fmt: skip
        x = RNG.standard_normal((2, 3, *hw))
        worst = max(worst, compare(f"adaptive_avg_pool({size}) on {list(hw)}", f"adaptive_avg_pool({size})", x,
                                   torch.nn.AdaptiveAvgPool2d(torch_size)))  # fmt: skip
    print(f"largest difference {worst:.1e} ({'within' if worst <= TOL else 'ABOVE'} {TOL:.0e})")
    return 0 if worst <= TOL else 1


if __name__ == "__main__":
    sys.exit(main())
