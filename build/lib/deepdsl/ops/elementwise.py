"""Element-wise ops: arithmetic between equal shapes, with scalars, and the activations."""

from __future__ import annotations

from deepdsl.ir.registry import defop
from deepdsl.ops._helpers import binary_same, unary_same

for _name in ("add", "sub", "mul", "div"):
    defop(_name, 2, elementwise=True)(binary_same)

# x op c with the scalar in attrs["value"]: add_scalar (x + c), mul_scalar (x * c), rsub_scalar (c - x),
# rdiv_scalar (c / x), pow_scalar (x ^ c)
for _name in ("add_scalar", "mul_scalar", "rsub_scalar", "rdiv_scalar", "pow_scalar"):
    defop(_name, 1, elementwise=True)(unary_same)

for _name in ("neg", "relu", "sigmoid", "tanh", "exp", "log", "sqrt", "abs"):
    defop(_name, 1, elementwise=True)(unary_same)

defop("leaky_relu", 1, elementwise=True)(unary_same)  # attrs: slope
