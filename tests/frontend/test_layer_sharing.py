"""A `layer` binding makes its parameters once, for every use: a built-in bound bare (`layer ln = layer_norm`, its
arguments all left at their defaults) as much as one called (`layer ln = layer_norm()`). Until 2026-12-06 a bare
layer_norm, group or instance norm, conv1d, LSTM or GRU made fresh parameters at each use (the elaborator's list of
built-ins that own parameters named only five); the list is now each built-in's own `params` flag."""

from __future__ import annotations

import pytest
from helpers import compile_text

from deepdsl.frontend.builtins import BUILTINS

NET = """network Share
const N = 2
input x : [N, 3, 4, 4]
label y : [N] classes 3
layer n = {layer}
h = n(n(x))
loss = softmax_cross_entropy(full(flatten(h), 3), y)
"""


@pytest.mark.parametrize("layer", ["layer_norm", "layer_norm()", "batch_norm", "batch_norm()",
                                   "instance_norm(affine=true)", "group_norm(3)"])  # fmt: skip
def test_a_layer_used_twice_has_one_set_of_parameters(layer: str) -> None:
    g = compile_text(NET.format(layer=layer)).program.graph
    names = sorted(p.value.name for p in g.trainable if p.value.name.startswith("n."))
    assert names == ["n.beta", "n.gamma"], names


def test_every_builtin_that_makes_parameters_says_so() -> None:
    # the built-ins whose elaboration calls el.param (directly or through a helper), by name: a new one must say
    # params=True at its @builtin, or `layer l = NAME` would make its parameters at each use
    owners = {"conv", "conv1d", "conv_transpose", "full", "batch_norm", "embedding", "layer_norm", "group_norm",
              "instance_norm", "lstm", "gru"}  # fmt: skip
    assert {name for name, b in BUILTINS.items() if b.params} == owners
