"""Every op with an index form (what fusion composes) computes the same as its NumPy kernel."""

from __future__ import annotations

import numpy as np
import pytest
from oracle_inputs import op_inputs
from test_registry_complete import EXAMPLES

from deepdsl.ir import REGISTRY
from deepdsl.ir.analysis import out_vars
from deepdsl.ops.indexed import evaluate

FORMS = sorted(name for name, op in REGISTRY.items() if op.index_form is not None)


def test_the_fusable_ops_are_the_expected_ones() -> None:
    for name in ("add", "relu", "relu_grad", "bias_add", "bn_apply", "channel_sum", "channel_var", "sgd_momentum"):
        assert name in FORMS


@pytest.mark.parametrize("name", FORMS)
def test_index_form_matches_the_kernel(name: str) -> None:
    """On inputs of both signs, with zeros and the op's kinks (oracle_inputs): positive inputs alone would let
    ReLU as the identity pass."""
    rng = np.random.default_rng(7)
    types, attrs = EXAMPLES[name]
    op = REGISTRY[name]
    xs = op_inputs(op, types, rng)
    out = op.shape(types, attrs)
    expect = op.numpy(xs, attrs)
    assert np.isfinite(expect).all(), "an input outside the op's domain: list it in oracle_inputs.POSITIVE"
    body = op.index_form(types, out, attrs)
    got = evaluate(body, tuple(zip(out_vars(out), out.shape)), xs, np.float64)
    np.testing.assert_allclose(got, expect, rtol=1e-12, atol=1e-12)
