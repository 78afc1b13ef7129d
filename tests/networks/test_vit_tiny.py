"""networks/vit_tiny.ddsl: its parameter count is the PyTorch network's (scripts/vit_tiny_pytorch.py, by a formula
derived by hand), at its own size and at another; attention's softmax is fused with its scale; it plans; and it
trains (slow). Java against the NumPy runner: tests/backends/test_java_transformer.py."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from helpers import ROOT

from deepdsl import api
from deepdsl.ir.verify import check_graph
from deepdsl.running import run_training

VIT = ROOT / "networks" / "vit_tiny.ddsl"


def _pytorch_script():  # noqa: ANN202
    spec = importlib.util.spec_from_file_location("vit_tiny_pytorch", ROOT / "scripts" / "vit_tiny_pytorch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # imports torch only in main()
    return module


@pytest.mark.parametrize(
    "sets, config",
    [
        ({}, {}),  # the network as written: 142,026
        (
            {"D": 32, "HEADS": 2, "M": 48, "L": 2, "P": 8, "K": 7},
            {"width": 32, "heads": 2, "mlp": 48, "blocks": 2, "patch": 8, "classes": 7},
        ),  # fmt: skip
    ],
)
def test_parameter_count_is_the_pytorch_networks(sets: dict, config: dict) -> None:
    script = _pytorch_script()
    c = api.compile_file(VIT, {"N": 2, **sets})
    g = check_graph(c.program.graph)
    assert g.parameter_count == script.parameter_count(**{**script.CONFIG, **config})
    if not sets:
        assert g.parameter_count == 142_026
    assert g.name == "ViTTiny" and c.program.warnings == ()
    x = next(d for d in g.inputs if d.kind == "input")
    assert x.value.type.shape == (2, 3, 32, 32)
    assert g.output("predict").type.shape == (2, config.get("classes", 10))
    names = {p.value.name for p in g.params if p.kind == "param"}
    assert {"model.tokens1.cls", "model.tokens1.pos", "model.block2.ln2.gamma", "model.ln.beta"} <= names


def test_attention_softmax_is_fused_with_its_scale_and_the_program_plans() -> None:
    c = api.compile_file(VIT, {"N": 2}, stop_at="plan")
    fused = [s for s in c.opt.stmts if s.op == "masked_softmax"]
    assert len(fused) == 4 and all(s.a == {"scale": 0.25, "causal": False, "period": 1} for s in fused)
    assert not any(s.op == "softmax" for s in c.opt.stmts)
    assert c.plan.arena_bytes > 0


@pytest.mark.slow
def test_it_trains() -> None:
    result = run_training(
        api.build(api.compile_file(VIT, {"N": 8}).program), iters=20, data_flag="synthetic", device="cpu"
    )
    losses = result["losses"]
    assert np.all(np.isfinite(losses)) and np.mean(losses[-5:]) < 0.85 * np.mean(losses[:5]), losses
