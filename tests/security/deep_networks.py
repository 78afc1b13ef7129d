"""Generated .ddsl texts for the limits tests: deep networks and long expression chains."""

from __future__ import annotations

SMALL = "network T\nconst N = 2\ninput x : [N, 4]\nlabel y : [N] classes 2\n"


def residual_mlp(layers: int, width: int = 16) -> str:
    """A residual MLP of `layers` blocks `h = h + relu(full(h))`: its backward pass is one long chain of statements
    that each free what they allocate (what the schedule used to recurse over)."""
    return f"""network Deep
const N = 4
const L = {layers}
input x : [N, {width}]
label y : [N] classes 10
def deep(h) {{
  for i in 1 .. L {{
    h = h + relu(full(h, {width}))
  }}
  return full(h, 10)
}}
layer net = deep
loss = softmax_cross_entropy(net(x), y)
predict = net(x)
train {{
  data = synthetic
  optimizer = sgd(lr=0.01, momentum=0.9)
  iterations = 2
}}
"""


def chain(kind: str, terms: int) -> str:
    """A network whose one expression is a chain of `terms` terms of `+`, `-`, `not` or `o`."""
    if kind == "+":
        return SMALL.replace("const N = 2", "const N = 2" + " + 0" * terms) + _tail()
    if kind == "-":
        return SMALL.replace("const N = 2", "const N = 2" + " - 0" * terms) + _tail()
    if kind == "not":
        nots = "not " * (2 * (terms // 2))
        return SMALL.replace("const N = 2", f"const N = if {nots}true then 2 else 3") + _tail()
    if kind == "o":
        return SMALL + "net = full(2) o " + " o ".join(["relu"] * terms) + "\nloss = softmax_cross_entropy(net(x), y)\n"
    raise ValueError(kind)


def _tail() -> str:
    return "layer f = full(2)\nloss = softmax_cross_entropy(f(x), y)\n"
