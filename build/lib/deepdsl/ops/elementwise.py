"""Element-wise ops: arithmetic between equal shapes, with scalars, and the activations."""

from __future__ import annotations

from deepdsl.ir.registry import defop
from deepdsl.ops._helpers import binary_same, unary_same

_BINARY = {"add": "a + b", "sub": "a - b", "mul": "a * b", "div": "a / b"}
_SCALAR = {  # the scalar c is attrs["value"]
    "add_scalar": "x + c", "mul_scalar": "x * c", "rsub_scalar": "c - x", "rdiv_scalar": "c / x", "pow_scalar": "x ^ c",
}  # fmt: skip
_UNARY = {
    "neg": "-x", "relu": "max(x, 0)", "sigmoid": "1 / (1 + exp(-x))", "tanh": "tanh(x)", "exp": "exp(x)",
    "log": "log(x)", "sqrt": "sqrt(x)", "abs": "|x|", "leaky_relu": "x > 0 ? x : slope * x (attrs: slope)",
}  # fmt: skip

for _name, _doc in _BINARY.items():
    defop(_name, 2, doc=f"element-wise {_doc} on equal shapes", elementwise=True)(binary_same)
for _name, _doc in (_SCALAR | _UNARY).items():
    defop(_name, 1, doc=f"element-wise {_doc}", elementwise=True)(unary_same)
