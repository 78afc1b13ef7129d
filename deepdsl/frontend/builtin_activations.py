"""The built-in activations and the other element-wise functions of one tensor: `relu`, `sigmoid`, `tanh`,
`gelu`, `leaky_relu`, `hard_swish`, `silu`, `clip`, `relu6`, `hard_sigmoid`; `exp`, `log`, `sqrt`, `abs`; and `lrn`,
made the same way.

`_simple` makes a built-in of a registry op whose arguments are its attributes, in one line (docs/adding-an-op.md
adds `hard_swish` and `cumsum` so); `relu6` and `hard_sigmoid` are written with `clip`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from deepdsl.errors import DslArgumentError, Span
from deepdsl.frontend.builtins import FLOAT32_MAX, Args, ArgSpec, builtin
from deepdsl.frontend.values import TensorVal

if TYPE_CHECKING:
    from deepdsl.frontend.elaborate import Elaborator


def _simple(op: str, *args: ArgSpec) -> None:
    def apply(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
        return el.emit(op, xs, span, path, op, **a)

    builtin(op, *args)(apply)


for _name in ("relu", "sigmoid", "tanh", "exp", "log", "sqrt", "abs", "gelu"):
    _simple(_name)
_simple("leaky_relu", ArgSpec("slope", "float", 0.01))
_simple("lrn", ArgSpec("size", "int", 5, low=1), ArgSpec("alpha", "float", 1e-4, low=0.0),
        ArgSpec("beta", "float", 0.75, low=0.0), ArgSpec("k", "float", 1.0, low=1e-30))  # fmt: skip


# ---- activations (issue 34) ---------------------------------------------------------------------------------

_simple("hard_swish")
_simple("silu")


@builtin(
    "clip",
    ArgSpec("low", "float", low=-FLOAT32_MAX, high=FLOAT32_MAX),
    ArgSpec("high", "float", low=-FLOAT32_MAX, high=FLOAT32_MAX),
)
def clip(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    """torch.clamp(x, low, high), ONNX Clip; no gradient at the bounds (torch 2.15's, ops/elementwise.py)."""
    if a["low"] > a["high"]:
        raise DslArgumentError(f"clip: low={a['low']} is above high={a['high']}", span)
    return el.emit("clip", xs, span, path, "clip", low=a["low"], high=a["high"])


@builtin("relu6")
def relu6(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    """F.relu6, F.hardtanh(x, 0, 6): no gradient at 0 and 6."""
    return el.emit("clip", xs, span, path, "relu6", low=0.0, high=6.0)


@builtin(
    "hard_sigmoid",
    ArgSpec("alpha", "float", 1 / 6, low=1e-6, high=1e6),
    ArgSpec("beta", "float", 0.5, low=-1e6, high=1e6),
)
def hard_sigmoid(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    """max(0, min(1, alpha x + beta)), written alpha clip(x + beta / alpha, 0, 1 / alpha): with PyTorch's alpha 1/6
    and beta 1/2, F.hardsigmoid's min(max(x + 3, 0), 6) / 6, its bounds -3 and 3 exact, where no gradient passes
    (hardsigmoid_backward)."""
    alpha, beta = a["alpha"], a["beta"]
    y = xs[0]
    if beta != 0:
        y = el.emit("add_scalar", (y,), span, path, "hard_sigmoid", value=beta / alpha)
    y = el.emit("clip", (y,), span, path, "hard_sigmoid", low=0.0, high=1 / alpha)
    return el.emit("mul_scalar", (y,), span, path, "hard_sigmoid", value=alpha)
