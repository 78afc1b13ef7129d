"""Golden before/after text of every pass, on small programs and on LeNet's training program."""

from __future__ import annotations

import pytest
from helpers import GOLDEN, HEADER, ROOT

from deepdsl import api
from deepdsl.ir.printer import format_graph
from deepdsl.passes import run_pipeline

SMALL = {
    "conv_bias_relu": "layer c = conv(4, kernel=3)\nh = relu(c(x))\nloss = mse(h, h * 0.5)\n",
    "bn_relu": "layer c = conv(4, kernel=3, bias=false)\nlayer bn = batch_norm()\nh = relu(bn(c(x)))\n"
    "loss = mse(h, h * 0.5)\n",
    "scalar_chain": "layer f = full(5)\nh = -(-(f(flatten(x)) * 2 * 0.5 + 0))\nloss = mse(h, h * 0.25)\n",
    "layer_norm": "tensor ln(x[B, D]) -> [n, d] {\n  param g[D] = constant(1)\n  mu[n] = sum[d] x[n, d] / D\n"
    "  return g[d] * (x[n, d] - mu[n])\n}\nh = ln(flatten(x))\nloss = mse(h, h * 0.5)\n",
}


def _dump(text: str, file: str) -> str:
    c = api.compile_source(text, file, {"N": 2}, stop_at="train")
    parts = ["# before\n" + format_graph(c.train)]
    run_pipeline(c.train, check=True, dump_after=lambda name, g: parts.append(f"# after {name}\n" + format_graph(g)))
    return "\n".join(parts)


@pytest.mark.parametrize("case", sorted(SMALL))
def test_small_programs(case: str, golden) -> None:  # noqa: ANN001
    golden(GOLDEN / "passes" / f"{case}.txt", _dump(HEADER + SMALL[case], f"{case}.ddsl"))


def test_lenet(golden) -> None:  # noqa: ANN001
    text = (ROOT / "networks" / "lenet.ddsl").read_text()
    golden(GOLDEN / "passes" / "lenet.txt", _dump(text, "lenet.ddsl"))
