"""networks/examples/vae.ddsl (issue 34): a custom KL tensor function, `normal` sampling in the graph, a loss of
two named terms; checked and run briefly (tests/backends/test_java_losses.py: the Java program against NumPy)."""

from __future__ import annotations

import json

import numpy as np
from conftest import ROOT

VAE = ROOT / "networks" / "examples" / "vae.ddsl"
SMALL = ["--set", "N=8", "--set", "D=32", "--set", "H=16", "--set", "Z=4", "--data", "synthetic"]


def test_vae_checks_with_its_terms_as_outputs(cli) -> None:  # noqa: ANN001
    r = cli("check", str(VAE), "--json")
    assert r.exit_code == 0, r.output
    outputs = json.loads(r.stdout)["outputs"]
    assert outputs["loss"] == [] and outputs["loss:rec"] == [] and outputs["loss:kl"] == []


def test_vae_trains_and_reports_rec_and_kl(cli) -> None:  # noqa: ANN001
    r = cli("run", str(VAE), *SMALL, "--iters", "6", "--device", "cpu", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    rec, kl = np.array(out["loss_terms"]["rec"]), np.array(out["loss_terms"]["kl"])
    np.testing.assert_allclose(out["losses"], rec + kl, rtol=1e-5)
    assert (kl >= 0).all() and out["losses"][-1] < out["losses"][0]
