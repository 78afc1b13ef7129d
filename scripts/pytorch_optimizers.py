"""deepdsl's AdamW, RMSprop and Nesterov SGD (and `freeze`, `lr_mult`) against torch.optim on the same network.

    PYTHONPATH=$PWD /work/torchvenv/bin/python scripts/pytorch_optimizers.py     # needs torch

A two-layer perceptron (full(16), relu, full(4), softmax cross-entropy) starts from the same parameters in both and
trains STEPS steps on the same batches, in float64 (deepdsl's NumPy runner with --float64's precision) and in
float32 (deepdsl's default); the script prints, for each optimizer, the largest difference of any parameter from
PyTorch's after the last step, and exits 1 when a float64 difference exceeds 1e-9. PyTorch is no dependency of
deepdsl: only this script imports it.
"""

from __future__ import annotations

import sys

import numpy as np

from deepdsl import api
from deepdsl.backends.numpy_runner import run

STEPS = 5
NET = """network Mlp
input x : [8, 12]
label y : [8] classes 4
layer fc1 = full(16)
layer fc2 = full(4)
loss = softmax_cross_entropy(fc2(relu(fc1(x))), y)
predict = fc2(relu(fc1(x)))
train {
  TRAIN
}
"""
# name -> (the train block's settings, torch's optimizer and its param groups: frozen names, lr multipliers)
CASES = {
    "adamw": ("optimizer = adamw(lr=0.01, weight_decay=0.1)", "AdamW", dict(lr=0.01, weight_decay=0.1), (), {}),
    "rmsprop": ("optimizer = rmsprop(lr=0.01)", "RMSprop", dict(lr=0.01), (), {}),
    "rmsprop momentum": (
        "optimizer = rmsprop(lr=0.01, alpha=0.9, momentum=0.8, weight_decay=0.01)", "RMSprop",
        dict(lr=0.01, alpha=0.9, momentum=0.8, weight_decay=0.01), (), {},
    ),
    "sgd nesterov": (
        "optimizer = sgd(lr=0.1, momentum=0.9, weight_decay=0.001, nesterov=true)", "SGD",
        dict(lr=0.1, momentum=0.9, weight_decay=0.001, nesterov=True), (), {},
    ),
    "adamw, freeze fc1.b, lr_mult fc2 x5": (
        'optimizer = adamw(lr=0.01)\n  freeze = "fc1.b"\n  lr_mult = ("fc2", 5)', "AdamW", dict(lr=0.01),
        ("fc1.b",), {"fc2.W": 5.0, "fc2.b": 5.0},
    ),
}  # fmt: skip


def deepdsl_run(train: str, params: dict, batches: list, dtype: type) -> dict:
    program = api.compile_source(NET.replace("TRAIN", train), "mlp.ddsl").program
    g = api.train_stage(program)
    arrays = {p.value.name: np.zeros(p.value.type.shape) for p in g.params} | params
    arrays = {k: np.asarray(v, dtype) for k, v in arrays.items()}
    for x, y in batches:
        arrays |= run(g, {"x": x.astype(dtype), "y": y}, arrays, dtype).updates
    return arrays


def torch_run(opt: str, kwargs: dict, frozen: tuple, mults: dict, params: dict, batches: list, dtype) -> dict:  # noqa: ANN001
    import torch

    ps = {k: torch.nn.Parameter(torch.tensor(v, dtype=dtype)) for k, v in params.items()}
    for k in frozen:
        ps[k].requires_grad_(False)
    lr = kwargs["lr"]
    groups = [{"params": [p], "lr": lr * mults.get(k, 1.0)} for k, p in ps.items() if k not in frozen]
    optimizer = getattr(torch.optim, opt)(groups, **kwargs)
    for x, y in batches:
        h = torch.relu(torch.tensor(x, dtype=dtype) @ ps["fc1.W"].T + ps["fc1.b"])
        loss = torch.nn.functional.cross_entropy(h @ ps["fc2.W"].T + ps["fc2.b"], torch.tensor(y))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return {k: p.detach().numpy() for k, p in ps.items()}


def main() -> int:
    import torch

    rng = np.random.default_rng(0)
    params = {"fc1.W": rng.standard_normal((16, 12)) * 0.3, "fc1.b": rng.standard_normal(16) * 0.1,
              "fc2.W": rng.standard_normal((4, 16)) * 0.3, "fc2.b": rng.standard_normal(4) * 0.1}  # fmt: skip
    batches = [(rng.standard_normal((8, 12)), rng.integers(0, 4, 8)) for _ in range(STEPS)]
    worst = 0.0
    print(f"largest parameter difference from torch.optim after {STEPS} steps (torch {torch.__version__})")
    for name, (train, opt, kwargs, frozen, mults) in CASES.items():
        line = []
        for dtype, tdtype in ((np.float64, torch.float64), (np.float32, torch.float32)):
            ours = deepdsl_run(train, params, batches, dtype)
            theirs = torch_run(opt, kwargs, frozen, mults, params, batches, tdtype)
            diff = max(float(np.max(np.abs(ours[k] - theirs[k]))) for k in params)
            moved = max(float(np.max(np.abs(theirs[k] - params[k]))) for k in params)
            line.append(f"{np.dtype(dtype).name} {diff:.3g}")
            if dtype is np.float64:
                worst = max(worst, diff)
                for k in frozen:  # a frozen parameter is unchanged in both
                    assert np.array_equal(ours[k], params[k]) and np.array_equal(theirs[k], params[k]), k
        print(f"  {name:38s} {'   '.join(line)}   (the parameters moved by up to {moved:.3g})")
    return 0 if worst < 1e-9 else 1


if __name__ == "__main__":
    sys.exit(main())
