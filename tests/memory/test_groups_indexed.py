"""A statement joins the loop of the one before it over the same memory only where that one reads it element for
element (memory/groups.py `can_join_in`, as memory/check.py `hazards` asks). A tensor function's statement
(`indexed`) is never taken to: before, the gradient of a tensor function's second input was written over the
first input's memory in the loop that still read it, and the step's result was a NaN (found with the VAE of
issue 34; this network has nothing of issue 34)."""

from __future__ import annotations

import numpy as np
from helpers import compile_text

from deepdsl import api
from deepdsl.backends.numpy_runner import run, run_plan
from deepdsl.data.named import Samples
from deepdsl.memory.check import hazards
from deepdsl.trainer import Trainer

PRE = """network Pre
const N = 8
input x : [N, 32]
layer enc = full(16)
layer enc_mu = full(4)
layer enc_lv = full(4)
layer dec = full(32)
tensor klm(mu[B, L], lv[B, L]) -> [n, d] = -0.5 * (1 + lv[n, d] - mu[n, d] ^ 2 - exp(lv[n, d])) / B
h = relu(enc(x))
mu = enc_mu(h)
lv = enc_lv(h)
k = klm(mu, lv)
loss = mse(dec(mu + exp(0.5 * lv)), x) + mse(k, k * 0)
"""


def test_the_planned_step_of_a_tensor_function_has_no_hazard_and_the_unplanned_result() -> None:
    b = api.build(compile_text(PRE).program)
    assert hazards(b.train_plan) == ()
    arrays = Trainer(b, Samples({})).arrays
    x = np.random.default_rng(0).standard_normal((8, 32)).astype(np.float32)
    planned = run_plan(b.train_plan, {"x": x}, arrays)
    plain = run(b.train, {"x": x}, arrays)
    assert np.isfinite(planned.outputs["loss"])
    np.testing.assert_allclose(planned.outputs["loss"], plain.outputs["loss"], rtol=1e-6)
    for name, value in plain.updates.items():
        np.testing.assert_allclose(planned.updates[name], value, rtol=1e-5, atol=1e-7, err_msg=name)
