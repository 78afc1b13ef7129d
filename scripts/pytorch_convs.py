"""The convolution family of issues 33 and 34 against PyTorch: forward values and the gradients of every parameter.

    PYTHONPATH=$PWD /work/torchvenv/bin/python scripts/pytorch_convs.py

Each case is a small network: x [2, 3, 11, 10] (or a sequence s [2, 4, 23]) through the layers under test, then
`loss = mse(flatten(h), flatten(t))` for a random target t. deepdsl runs it with the NumPy runner in float64 (the
forward program and the symbolic gradient program); PyTorch computes the same in float64 from the same parameters
(deepdsl's weight layouts are PyTorch's). Asymmetric padding is checked against F.pad followed by the layer (PyTorch's
layers pad symmetrically). Prints each case's largest differences; exits 1 if any exceeds 1e-9.
"""

from __future__ import annotations

import sys

import numpy as np
import torch
import torch.nn.functional as F

from deepdsl import api
from deepdsl.autodiff import gradient_program
from deepdsl.backends.numpy_runner import run

X = (2, 3, 11, 10)
S = (2, 4, 23)
TOL = 1e-9
NEG = float("-inf")

# (name, deepdsl body defining h from x and s, PyTorch: (x, s, params) -> h)
CASES = [
    ("conv dilation=2, pad=(1, 2, 2, 1), stride=2",
     "h = conv(x, 4, kernel=3, dilation=2, pad=(1, 2, 2, 1), stride=2)",
     lambda x, s, p: F.conv2d(F.pad(x, (2, 1, 1, 2)), p["h.W"], p["h.b"], stride=2, dilation=2)),
    ("conv dilation=(2, 1), pad=1, groups=3",
     "h = conv(x, 6, kernel=(2, 3), dilation=(2, 1), pad=1, groups=3)",
     lambda x, s, p: F.conv2d(x, p["h.W"], p["h.b"], padding=1, dilation=(2, 1), groups=3)),
    ("conv_transpose stride=2, pad=1, dilation=2, output_padding=1",
     "h = conv_transpose(x, 4, kernel=3, stride=2, pad=1, dilation=2, output_padding=1)",
     lambda x, s, p: F.conv_transpose2d(x, p["h.W"], p["h.b"], stride=2, padding=1, output_padding=1, dilation=2)),
    ("conv_transpose stride=(3, 2), output_padding=(2, 1), groups=3",
     "h = conv_transpose(x, 6, kernel=2, stride=(3, 2), output_padding=(2, 1), groups=3)",
     lambda x, s, p: F.conv_transpose2d(x, p["h.W"], p["h.b"], stride=(3, 2), output_padding=(2, 1), groups=3)),
    ("conv_transpose dilation=3, output_padding=2 (below the dilation, not the stride)",
     "h = conv_transpose(x, 2, kernel=3, dilation=3, output_padding=2)",
     lambda x, s, p: F.conv_transpose2d(x, p["h.W"], p["h.b"], output_padding=2, dilation=3)),
    ("max_pool 3, stride=2, pad=1, ceil_mode",
     "h = max_pool(conv(x, 4, kernel=1, name=\"c\"), 3, stride=2, pad=1, ceil_mode=true)",
     lambda x, s, p: F.max_pool2d(F.conv2d(x, p["c.W"], p["c.b"]), 3, 2, 1, ceil_mode=True)),
    ("avg_pool 3, stride=2, pad=1, ceil_mode (count_include_pad)",
     "h = avg_pool(conv(x, 4, kernel=1, name=\"c\"), 3, stride=2, pad=1, ceil_mode=true)",
     lambda x, s, p: F.avg_pool2d(F.conv2d(x, p["c.W"], p["c.b"]), 3, 2, 1, ceil_mode=True)),
    ("avg_pool 2, ceil_mode (a last window of one row)",
     "h = avg_pool(conv(x, 4, kernel=1, name=\"c\"), 2, ceil_mode=true)",
     lambda x, s, p: F.avg_pool2d(F.conv2d(x, p["c.W"], p["c.b"]), 2, ceil_mode=True)),
    ("avg_pool (3, 2), stride=(2, 3), pad=(1, 0), ceil_mode",
     "h = avg_pool(conv(x, 4, kernel=1, name=\"c\"), (3, 2), stride=(2, 3), pad=(1, 0), ceil_mode=true)",
     lambda x, s, p: F.avg_pool2d(F.conv2d(x, p["c.W"], p["c.b"]), (3, 2), (2, 3), (1, 0), ceil_mode=True)),
    ("max_pool 4, stride=3, pad=2, ceil_mode (a window dropped at the end)",
     "h = max_pool(conv(x, 4, kernel=1, name=\"c\"), 4, stride=3, pad=2, ceil_mode=true)",
     lambda x, s, p: F.max_pool2d(F.conv2d(x, p["c.W"], p["c.b"]), 4, 3, 2, ceil_mode=True)),
    ("max_pool 3, stride=2, pad=(1, 0, 0, 1)",
     "h = max_pool(conv(x, 4, kernel=1, name=\"c\"), 3, stride=2, pad=(1, 0, 0, 1))",
     lambda x, s, p: F.max_pool2d(F.pad(F.conv2d(x, p["c.W"], p["c.b"]), (0, 1, 1, 0), value=NEG), 3, 2)),
    ("avg_pool 3, stride=2, pad=(0, 1, 1, 1)",
     "h = avg_pool(conv(x, 4, kernel=1, name=\"c\"), 3, stride=2, pad=(0, 1, 1, 1))",
     lambda x, s, p: F.avg_pool2d(F.pad(F.conv2d(x, p["c.W"], p["c.b"]), (0, 0, 0, 1)), 3, 2, (0, 1))),
    ("conv1d stride=2, pad=(2, 1), dilation=3, groups=2",
     "h = conv1d(s, 4, 5, stride=2, pad=(2, 1), dilation=3, groups=2)",
     lambda x, s, p: F.conv1d(F.pad(s, (2, 1)), p["h.W"], p["h.b"], stride=2, dilation=3, groups=2)),
    ("max_pool1d 3, stride=2, pad=1, ceil_mode",
     "h = max_pool1d(conv1d(s, 4, 1, name=\"c\"), 3, stride=2, pad=1, ceil_mode=true)",
     lambda x, s, p: F.max_pool1d(F.conv1d(s, p["c.W"], p["c.b"]), 3, 2, 1, ceil_mode=True)),
    ("avg_pool1d 4, stride=3, pad=2, ceil_mode",
     "h = avg_pool1d(conv1d(s, 4, 1, name=\"c\"), 4, stride=3, pad=2, ceil_mode=true)",
     lambda x, s, p: F.avg_pool1d(F.conv1d(s, p["c.W"], p["c.b"]), 4, 3, 2, ceil_mode=True)),
    ("global_avg_pool on [N, C, L]",
     "h = global_avg_pool(conv1d(s, 4, 3, name=\"c\"))",
     lambda x, s, p: F.adaptive_avg_pool1d(F.conv1d(s, p["c.W"], p["c.b"]), 1)),
]  # fmt: skip


def _source(body: str, h_shape: tuple[int, ...] | None) -> str:
    head = f"network T\nconst N = 2\ninput x : [N, {X[1]}, {X[2]}, {X[3]}]\ninput s : [N, {S[1]}, {S[2]}]\n"
    if h_shape is None:  # a first compile, for h's shape
        return head + body + "\nloss = mse(flatten(h), flatten(h))\npredict = h\n"
    target = ", ".join(map(str, h_shape))
    return head + f"input t : [{target}]\n" + body + "\nloss = mse(flatten(h), flatten(t))\npredict = h\n"


def check(name: str, body: str, reference, rng: np.random.Generator) -> float:  # noqa: ANN001
    first = api.compile_source(_source(body, None), "t.ddsl").program.graph
    shape = dict(first.outputs)["predict"].type.shape
    g = api.compile_source(_source(body, shape), "t.ddsl").program.graph
    params = {p.value.name: rng.standard_normal(p.value.type.shape) for p in g.params}
    feeds = {"x": rng.standard_normal(X), "s": rng.standard_normal(S), "t": rng.standard_normal(shape)}
    out = run(g, feeds, params, np.float64).outputs
    grads = {k[5:]: v for k, v in run(gradient_program(g), feeds, params, np.float64).outputs.items()
             if k.startswith("grad:")}  # fmt: skip

    tp = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    th = reference(torch.tensor(feeds["x"]), torch.tensor(feeds["s"]), tp)
    loss = F.mse_loss(th, torch.tensor(feeds["t"]))
    loss.backward()
    diffs = {"forward": float(np.max(np.abs(th.detach().numpy() - out["predict"]))) if th.shape == shape else np.inf,
             "loss": abs(float(loss.detach()) - float(out["loss"]))}  # fmt: skip
    for k, t in tp.items():
        diffs[f"d{k}"] = float(np.max(np.abs(t.grad.numpy() - grads[k])))
    worst = max(diffs.values())
    print(f"{'ok ' if worst <= TOL else 'BAD'} {name}: {tuple(th.shape)} vs {shape}; largest differences "
          + ", ".join(f"{k} {v:.1e}" for k, v in diffs.items()))  # fmt: skip
    return worst


def main() -> int:
    torch.set_default_dtype(torch.float64)
    rng = np.random.default_rng(0)
    worst = max(check(name, body, ref, rng) for name, body, ref in CASES)
    print(f"{len(CASES)} cases, torch {torch.__version__}: largest difference {worst:.1e} (tolerance {TOL:g})")
    return 0 if worst <= TOL else 1


if __name__ == "__main__":
    sys.exit(main())
