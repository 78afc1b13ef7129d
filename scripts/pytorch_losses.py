"""Each loss of issue 34 against PyTorch: its value and its gradient, through the language.

For every case a small network `s = fc(x)` (a linear layer) feeds the loss written in .ddsl; deepdsl's training
forward pass and parameter gradients (autodiff.gradient_program, run by the NumPy runner in float64) are compared
with PyTorch's F.* loss of the same scores and its autograd gradients of the same weights, also in float64.
PyTorch is not a dependency of deepdsl: run with an environment that has it,

    PYTHONPATH=$PWD /work/torchvenv/bin/python scripts/pytorch_losses.py

and it prints one line per case (the value of both, the largest relative difference of the value and of the
gradients) and exits 1 if any differs by more than 1e-9.
"""

from __future__ import annotations

import sys

import numpy as np
import torch
import torch.nn.functional as F

from deepdsl import api
from deepdsl.autodiff import gradient_program
from deepdsl.backends.numpy_runner import run

N, T, D, K = 6, 3, 5, 4
RNG = np.random.default_rng(34)
WEIGHT = (1.0, 2.0, 0.5, 3.0)


def _case(loss: str, torch_loss, rows: int = N, target: str = "normal", labels=None, extra: str = ""):  # noqa: ANN001, ANN202
    """(deepdsl's loss and gradients, PyTorch's) for `loss` over the scores s [rows, K] (s3 [N, T, K] per position)."""
    per_position = rows == N * T
    src = (
        f"network P\nconst N = {N}\ninput x : [N, {T if per_position else 1}, {D}]\ninput t : [N, {K}]\n"
        f"label y : [N{', ' + str(T) if per_position else ''}] classes {K}\nlayer fc = full({K})\n"
        f"h = reshape(x, ({rows}, {D}))\ns = fc(h)\ns3 = reshape(s, (N, {T if per_position else 1}, {K}))\n"
        f"{extra}loss = {loss}\n"
    )
    c = api.compile_source(src, "p.ddsl")
    g = gradient_program(c.program.graph)
    x = RNG.standard_normal((N, T if per_position else 1, D))
    t = RNG.uniform(0, 1, (N, K)) if target == "probabilities" else RNG.standard_normal((N, K))
    y = RNG.integers(0, K, (N, T) if per_position else N) if labels is None else np.asarray(labels)
    w, b = RNG.standard_normal((K, D)), RNG.standard_normal(K)
    feeds = {"x": x, "t": t, "y": y}
    feeds = {d.value.name: feeds[d.value.name] for d in g.inputs}
    out = run(g, feeds, {"fc.W": w, "fc.b": b}, dtype=np.float64).outputs
    mine = (float(out["loss"]), out["grad:fc.W"], out["grad:fc.b"])

    tw = torch.tensor(w, requires_grad=True)
    tb = torch.tensor(b, requires_grad=True)
    s = torch.tensor(x).reshape(rows, D) @ tw.T + tb
    value = torch_loss(s, torch.tensor(t), torch.tensor(y))
    value.backward()
    theirs = (float(value.detach()), tw.grad.numpy(), tb.grad.numpy())
    return mine, theirs


def _w() -> torch.Tensor:
    return torch.tensor(WEIGHT, dtype=torch.float64)


def _kl(s: torch.Tensor) -> torch.Tensor:
    mu, lv = s[:, :2], s[:, 2:]
    return -0.5 * torch.sum(1 + lv - mu**2 - lv.exp()) / s.shape[0]


IGNORED = [0, -100, 3, 1, -100, 2]
CASES = {
    "l1": ("l1(s, t)", lambda s, t, y: F.l1_loss(s, t), {}),
    "huber": ("huber(s, t)", lambda s, t, y: F.huber_loss(s, t), {}),
    "huber delta=0.3": ("huber(s, t, delta=0.3)", lambda s, t, y: F.huber_loss(s, t, delta=0.3), {}),
    "bce_with_logits": ("bce_with_logits(s, t)", lambda s, t, y: F.binary_cross_entropy_with_logits(s, t),
                        {"target": "probabilities"}),
    "bce_with_logits, logits x 60": ("bce_with_logits(s * 60, t)",
                                     lambda s, t, y: F.binary_cross_entropy_with_logits(s * 60, t),
                                     {"target": "probabilities"}),
    "nll, ignore_index -100": ("nll(log_softmax(s), y)", lambda s, t, y: F.nll_loss(F.log_softmax(s, 1), y),
                               {"labels": IGNORED}),
    "nll, weight, ignore_index 2": ("nll(log_softmax(s), y, ignore_index=2, weight=(1, 2, 0.5, 3))",
                                    lambda s, t, y: F.nll_loss(F.log_softmax(s, 1), y, weight=_w(), ignore_index=2),
                                    {"labels": [0, 3, 2, 1, 2, 2]}),
    "softmax_cross_entropy, smoothing 0.2": ("softmax_cross_entropy(s, y, label_smoothing=0.2)",
                                             lambda s, t, y: F.cross_entropy(s, y, label_smoothing=0.2), {}),
    "softmax_cross_entropy, weight": ("softmax_cross_entropy(s, y, weight=(1, 2, 0.5, 3))",
                                      lambda s, t, y: F.cross_entropy(s, y, weight=_w()), {}),
    "softmax_cross_entropy, both": ("softmax_cross_entropy(s, y, label_smoothing=0.1, weight=(1, 2, 0.5, 3))",
                                    lambda s, t, y: F.cross_entropy(s, y, weight=_w(), label_smoothing=0.1), {}),
    "softmax_cross_entropy per position, both": (
        "softmax_cross_entropy(s3, y, label_smoothing=0.3, weight=(1, 2, 0.5, 3))",
        lambda s, t, y: F.cross_entropy(s, y.reshape(-1), weight=_w(), label_smoothing=0.3), {"rows": N * T}),
    "cross_entropy of probabilities, both": (
        "cross_entropy(softmax(s), y, label_smoothing=0.2, weight=(1, 2, 0.5, 3))",
        lambda s, t, y: F.cross_entropy(torch.log(F.softmax(s, 1)), y, weight=_w(), label_smoothing=0.2), {}),
    "custom KL tensor function (-> [])": (
        "kl(slice_mu(s), slice_lv(s))", lambda s, t, y: _kl(s),
        {"extra": "tensor slice_mu(a[B, C]) -> [n, d: 2] = a[n, d]\n"
                  "tensor slice_lv(a[B, C]) -> [n, d: 2] = a[n, d + 2]\n"
                  "tensor kl(mu[B, L], lv[B, L]) -> [] = -0.5 * sum[n, d] (1 + lv[n, d] - mu[n, d] ^ 2"
                  " - exp(lv[n, d])) / B\n"}),
    "two terms: rec + 0.5 * kl": (
        "rec + 0.5 * k", lambda s, t, y: F.mse_loss(s, t) + 0.5 * F.l1_loss(s, t),
        {"extra": "rec = mse(s, t)\nk = l1(s, t)\n"}),
}  # fmt: skip


def main() -> int:
    print(f"torch {torch.__version__}, float64; relative differences (value, d fc.W, d fc.b)")
    worst = 0.0
    for name, (loss, torch_loss, kw) in CASES.items():
        mine, theirs = _case(loss, torch_loss, **kw)
        rel = [abs(mine[0] - theirs[0]) / max(1e-12, abs(theirs[0]))]
        rel += [float(np.max(np.abs(a - b)) / max(1e-12, np.max(np.abs(b)))) for a, b in zip(mine[1:], theirs[1:])]
        worst = max(worst, *rel)
        print(f"{name:<42} deepdsl {mine[0]:+.10f}  torch {theirs[0]:+.10f}  " + "  ".join(f"{r:.1e}" for r in rel))
    print(f"largest relative difference: {worst:.1e}")
    return 0 if worst <= 1e-9 else 1


if __name__ == "__main__":
    sys.exit(main())
