"""networks/gpt_tiny.ddsl: its parameter count is the PyTorch network's (scripts/gpt_tiny_pytorch.py, by a formula
derived by hand), at its own size and at another; the causal mask and the scale are fused into the softmax; it
plans at T = 256, where `--remat cheap` keeps attention's probabilities out of the backward pass without changing
the losses; and it trains on a text (slow). Java against the NumPy runner: tests/backends/test_java_transformer.py."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from helpers import ROOT
from sequence_nets import story

from deepdsl import api
from deepdsl.ir.verify import check_graph
from deepdsl.memory.plan import Plan
from deepdsl.running import run_training

GPT = ROOT / "networks" / "gpt_tiny.ddsl"


def _pytorch_script():  # noqa: ANN202
    spec = importlib.util.spec_from_file_location("gpt_tiny_pytorch", ROOT / "scripts" / "gpt_tiny_pytorch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # imports torch only in main()
    return module


@pytest.mark.parametrize(
    "sets, config",
    [
        ({}, {}),  # the network as written: 212,545
        (
            {"D": 32, "HEADS": 2, "M": 48, "L": 2, "T": 256, "V": 30},
            {"width": 32, "heads": 2, "mlp": 48, "blocks": 2, "context": 256, "vocab": 30},
        ),  # fmt: skip
    ],
)
def test_parameter_count_is_the_pytorch_networks(sets: dict, config: dict) -> None:
    script = _pytorch_script()
    c = api.compile_file(GPT, {"N": 2, **sets})
    g = check_graph(c.program.graph)
    assert g.parameter_count == script.parameter_count(**{**script.CONFIG, **config})
    if not sets:
        assert g.parameter_count == 212_545
    assert g.name == "GPTTiny" and c.program.warnings == ()
    t, v = config.get("context", 64), config.get("vocab", 65)
    tok = next(d for d in g.inputs if d.kind == "input")
    assert tok.value.type.shape == (2, t) and tok.value.type.dtype.value == "i64"
    assert g.output("predict").type.shape == (2, t, v)
    names = {p.value.name for p in g.params if p.kind == "param"}
    last = f"model.block{sets.get('L', 4)}.ln2.gamma"
    assert {"model.embed.W", "model.positions1.pos", last, "model.ln.beta", "model.head.W", "model.head.b"} <= names


def test_the_causal_mask_and_the_scale_are_fused_into_the_softmax() -> None:
    c = api.compile_file(GPT, {"N": 2}, stop_at="plan")
    fused = [s for s in c.opt.stmts if s.op == "masked_softmax"]
    assert len(fused) == 4 and all(s.a == {"scale": 0.25, "causal": True, "period": 64} for s in fused)
    assert not any(s.op == "softmax" for s in c.opt.stmts)
    forward = c.opt.stmts[: next(k for k, s in enumerate(c.opt.stmts) if s.op == "softmax_cross_entropy_backward")]
    shapes = ((2, 4, 64, 64), (8, 64, 64), (512, 64))  # the scores, as heads, as a batch, as rows
    scores = [s.op for s in forward if s.out.type.shape in shapes and s.op != "reshape"]
    assert scores == ["batch_matmul", "masked_softmax"] * 4  # neither a scaled nor a masked copy of the scores


def _crossing(p: Plan) -> list[str]:
    """The attention probabilities (masked_softmax results) whose buffer lives across the start of the backward
    pass (the loss's gradient), in plan `p`."""
    stmts = p.graph.stmts
    boundary = next(k for k, s in enumerate(stmts) if s.op == "softmax_cross_entropy_backward")
    probs = {s.out.name for s in stmts if s.op == "masked_softmax"}
    return [v for b in p.buffers if b.start < boundary < b.end for v in b.values if v in probs]


@pytest.fixture(scope="module")
def remat_builds() -> dict[str, api.Build]:
    program = api.compile_file(GPT, {"N": 2, "D": 32, "M": 64}).program  # probabilities of 128 KiB
    return {level: api.build(program, api.Options(remat=level, verify=True)) for level in ("none", "cheap")}


def test_remat_cheap_recomputes_the_attention_probabilities(remat_builds: dict) -> None:
    none, cheap = remat_builds["none"], remat_builds["cheap"]
    assert len(_crossing(none.train_plan)) == 4  # one per block: kept for softmax_backward and the values' grad
    assert _crossing(cheap.train_plan) == []
    recomputed = [s.op for s in cheap.train_plan.graph.stmts if "~" in s.out.name]
    assert recomputed.count("batch_matmul") == 4  # the scores q·kᵀ, once per block
    assert recomputed.count("masked_softmax") == 8  # the probabilities, at each of their two readers
    assert cheap.train_plan.arena_bytes < none.train_plan.arena_bytes
    assert cheap.extra_flops > 0 and none.extra_flops == 0


def test_remat_cheap_gives_the_same_losses(remat_builds: dict, tmp_path: Path) -> None:
    (tmp_path / "story.txt").write_text(story(), encoding="utf-8")
    losses = {
        level: run_training(b, iters=3, data_flag=f"text:{tmp_path / 'story.txt'}", device="cpu")["losses"]
        for level, b in remat_builds.items()
    }
    np.testing.assert_allclose(losses["cheap"], losses["none"], rtol=1e-6)


def test_memcheck_at_t256_with_and_without_remat(cli) -> None:  # noqa: ANN001
    figures = {}
    for level in ("none", "cheap"):
        r = cli("memcheck", str(GPT), "--set", "T=256", "--remat", level, "--json")
        assert r.exit_code == 0, r.output
        figures[level] = json.loads(r.stdout)
    none, cheap = figures["none"], figures["cheap"]
    assert cheap["remat"] == "cheap" and none["remat"] == "none"
    assert cheap["peak_bytes"] < 0.6 * none["peak_bytes"] < none["eager_peak_bytes"]
    assert 0 < cheap["extra_flops"] < 0.15 * cheap["train_flops"]


@pytest.mark.slow
def test_it_trains_on_a_text(tmp_path: Path) -> None:
    (tmp_path / "story.txt").write_text(story() * 2, encoding="utf-8")
    b = api.build(api.compile_file(GPT, {"N": 4, "T": 32}).program)
    result = run_training(b, iters=12, data_flag=f"text:{tmp_path / 'story.txt'}", device="cpu")
    losses = result["losses"]
    assert np.all(np.isfinite(losses)) and np.mean(losses[-3:]) < 0.8 * np.mean(losses[:3]), losses
    assert np.isfinite(result["test_loss"]) and result["test_loss"] < losses[0]
