"""A ReLU mask (relu_grad) or a residual add after a convolution's data gradient is that convolution's epilogue, not
a launch of its own (passes/fuse.py): placed where the convolution stands when the mask is ready by then, composed
with the residual add already there; the gradients stay those of the unfused program."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import ROOT, feeds_and_params

from deepdsl import api
from deepdsl.backends.numpy_runner import run
from deepdsl.ir.indexexpr import Apply


def _opt(disabled: tuple[str, ...] = ()) -> api.Compilation:
    return api.compile_file(ROOT / "networks" / "resnet50.ddsl", {"N": 2}, stop_at="opt",
                            options=api.Options(disabled=disabled))  # fmt: skip


def test_no_relu_mask_reads_a_convolutions_data_gradient() -> None:
    g = _opt().opt
    made = {s.out.name: s for s in g.stmts}
    masks = [s for s in g.stmts if s.op == "relu_grad"]
    assert not [s for s in masks if made.get(s.inputs[0].name) and made[s.inputs[0].name].op == "conv2d_backward_data"]
    # the two left: after the global average pool's and the max pool's gradients (no library kernel before them)
    assert sorted(made[s.inputs[0].name].op for s in masks) == ["global_avg_pool_backward", "max_pool2d_backward"]
    epilogues = [s for s in g.stmts if s.op == "conv2d_backward_data" and "epilogue" in s.a]
    # of the 52 data gradients: 32 with a mask alone (16 of them were a launch of their own), 15 with the mask of the
    # block before and the residual add composed (each was two launches), one with the add alone
    assert len(epilogues) == 48
    masks_alone = [s for s in epilogues if not _has(s.a["epilogue"], "+")]
    composed = [s for s in epilogues if _has(s.a["epilogue"], "+") and _has(s.a["epilogue"], "select")]
    assert (len(masks_alone), len(composed)) == (32, 15)


def _has(e: object, fn: str) -> bool:
    return isinstance(e, Apply) and (e.fn == fn or any(_has(a, fn) for a in e.args))


def _same_gradients(path: str, sets: dict[str, int]) -> None:
    def opt(disabled: tuple[str, ...]) -> api.Graph:
        return api.compile_file(ROOT / path, sets, stop_at="opt", options=api.Options(disabled=disabled)).opt

    fused, plain = opt(()), opt(("fuse",))
    assert any(s.op == "conv2d_backward_data" and "epilogue" in s.a for s in fused.stmts)  # the fusion happened
    feeds, params = feeds_and_params(fused, np.random.default_rng(0))
    a, b = run(fused, feeds, params), run(plain, feeds, params)
    for name in a.outputs:
        np.testing.assert_allclose(a.outputs[name], b.outputs[name], rtol=1e-4, atol=1e-6, err_msg=name)


def test_the_fused_masks_keep_the_gradients_of_a_cifar_resnet() -> None:
    # six of its eight data gradients take a mask or a residual add as their epilogue
    _same_gradients("networks/examples/cifar_resnet.ddsl", {"N": 2})


@pytest.mark.slow
def test_the_fused_masks_keep_the_gradients() -> None:  # ResNet-50: two NumPy steps at batch 2 (a minute of CPU)
    _same_gradients("networks/resnet50.ddsl", {"N": 2})
