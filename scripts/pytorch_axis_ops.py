"""The built-ins along axes (slice, chunk, sum, mean, max, expand) against PyTorch: forward values and gradients.

For each case a network `predict = EXPR` on an input x is compiled by deepdsl; the statements from x to the result
are differentiated by deepdsl's autodiff (loss = sum(result * r) for a fixed random r) and run by the NumPy runner
in float64, and the same expression is evaluated and differentiated by PyTorch in float64. Inputs with ties (values
rounded to a grid) check max's convention against torch.amax. PyTorch is not a dependency of deepdsl:

    PYTHONPATH=$PWD /work/torchvenv/bin/python scripts/pytorch_axis_ops.py
"""

from __future__ import annotations

import sys

import numpy as np
import torch

from deepdsl import api
from deepdsl.autodiff import gradients
from deepdsl.backends.numpy_runner import run
from deepdsl.ir import GraphBuilder, Init, InputDef, ParamDef, TensorType, Value

SHAPE = (2, 3, 4, 5)
HEAD = f"network T\ninput x : [{', '.join(map(str, SHAPE))}]\ninput t : [2, 4]\nloss = mse(full(flatten(x), 4), t)\n"

# (deepdsl expression, the same in PyTorch (of a tensor x), whether x has ties)
CASES = [
    ("slice(x, 1, 3)", "x[:, 1:3]", False),
    ("slice(x, -3, -1, axis=2)", "x[:, :, -3:-1]", False),
    ("slice(x, 1, -1, axis=-1)", "x[..., 1:-1]", False),
    ("chunk(x, 2, 3)", "torch.chunk(x, 3, 1)[2]", False),
    ("chunk(x, 1, 2, axis=2)", "torch.chunk(x, 2, 2)[1]", False),
    ("sum(x)", "x.sum()", False),
    ("sum(x, axis=1)", "x.sum(1)", False),
    ("sum(x, axis=(-1, 1), keepdim=true)", "x.sum((-1, 1), keepdim=True)", False),
    ("mean(x)", "x.mean()", False),
    ("mean(x, axis=(2, 3), keepdim=true)", "x.mean((2, 3), keepdim=True)", False),
    ("max(x)", "torch.amax(x)", False),
    ("max(x, axis=1)", "torch.amax(x, 1)", False),
    ("max(x, axis=(0, 2), keepdim=true)", "torch.amax(x, (0, 2), keepdim=True)", False),
    ("max(x)", "torch.amax(x)", True),
    ("max(x)", "x.max()", True),
    ("max(x, axis=1)", "torch.amax(x, 1)", True),
    ("max(x, axis=(2, 3), keepdim=true)", "torch.amax(x, (2, 3), keepdim=True)", True),
    # not amax: the gradient of max(dim) goes to one of the tied elements, so these differ where there are ties
    ("max(x, axis=1)", "x.max(1).values", "max(dim)"),
    ("expand(mean(x, axis=(2, 3), keepdim=true), (2, 3, 4, 5))",
     "x.mean((2, 3), keepdim=True).expand(2, 3, 4, 5)", False),
    ("x * expand(max(x, axis=1, keepdim=true), (-1, 3, -1, -1))", "x * torch.amax(x, 1, keepdim=True)", False),
    ("expand(slice(x, 0, 1, axis=3), (-1, -1, -1, 5)) - x", "x[..., 0:1].expand(-1, -1, -1, 5) - x", False),
]  # fmt: skip


def deepdsl_forward_backward(expr: str, x: np.ndarray, r_seed: int) -> tuple[np.ndarray, np.ndarray]:
    c = api.compile_source(HEAD + f"predict = {expr}\n", "case.ddsl")
    g = c.program.graph
    target = dict(g.outputs)["predict"].name
    reach, chain = {"x"}, []
    for s in g.stmts:
        if any(v.name in reach for v in s.inputs):
            reach.add(s.out.name)
            chain.append(s)
    need = {target}
    for s in reversed(chain):
        if s.out.name in need:
            need |= {v.name for v in s.inputs}
    chain = [s for s in chain if s.out.name in need]
    b = GraphBuilder("T")
    env = {"x": b.add_param(ParamDef(Value("x", TensorType(x.shape)), Init("constant", (0.0,))))}
    for s in chain:
        env[s.out.name] = b.emit(s.op, *(env[v.name] for v in s.inputs), **s.a)
    out = env["x"] if target == "x" else env[target]
    r = b.add_input(InputDef(Value("r", out.type), "input"))
    loss = b.emit("sum", b.emit("mul", out, r))
    b.output("y", out)
    b.output("dx", gradients(b, loss, {"x"})["x"])
    rv = np.random.default_rng(r_seed).standard_normal(out.type.shape)
    res = run(b.build(), {"r": rv}, {"x": x}, dtype=np.float64).outputs
    return res["y"], res["dx"]


def main() -> int:
    rng = np.random.default_rng(0)
    worst = 0.0
    failed = 0
    print(f"torch {torch.__version__}; x {list(SHAPE)} in float64; loss = sum(result * r)")
    print(f"{'deepdsl':58} {'PyTorch':48} {'ties':5} {'forward':>9} {'gradient':>9}")
    for k, (expr, torch_expr, ties) in enumerate(CASES):
        x = rng.standard_normal(SHAPE)
        if ties:
            x = np.round(x)  # many equal values: maxima tied
        y, dx = deepdsl_forward_backward(expr, x, k)
        tx = torch.tensor(x, requires_grad=True)
        ty = eval(torch_expr, {"torch": torch, "x": tx})  # noqa: S307 — the expressions above
        (ty * torch.tensor(np.random.default_rng(k).standard_normal(tuple(ty.shape)))).sum().backward()
        fwd = float(np.max(np.abs(y - ty.detach().numpy()))) if y.shape == tuple(ty.shape) else float("inf")
        grad = float(np.max(np.abs(dx - tx.grad.numpy())))
        ok = fwd < 1e-12 and grad < 1e-12
        note = ""
        if not ok and ties == "max(dim)":
            note = "  (differs as documented: max(dim) gives a tie's gradient to one element)"
        elif not ok:
            failed += 1
            note = "  MISMATCH"
        else:
            worst = max(worst, fwd, grad)
        print(f"{expr:58} {torch_expr:48} {'yes' if ties else 'no':5} {fwd:9.1e} {grad:9.1e}{note}")
    print(f"largest difference where they agree: {worst:.1e}; mismatches: {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
