"""networks/examples/vae.ddsl (issue 34): a custom KL tensor function, `normal` sampling in the graph, a loss of
two named terms; checked and run briefly (tests/backends/test_java_losses.py: the Java program against NumPy)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import ROOT

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


def test_vae_exports_its_inference_with_the_sample_at_its_mean(cli, tmp_path) -> None:  # noqa: ANN001
    # in inference `normal` is 0 (z = mu): exported as a constant that broadcasts over the batch
    ort = pytest.importorskip("onnxruntime")
    from deepdsl import api
    from deepdsl.backends.numpy_runner import run
    from deepdsl.data.named import Samples
    from deepdsl.trainer import Trainer

    sets = {"N": 8, "D": 32, "H": 16, "Z": 4}
    r = cli("export", str(VAE), *[f"--set={k}={v}" for k, v in sets.items()], "-o", str(tmp_path / "vae.onnx"))
    assert r.exit_code == 0, r.output
    b = api.build(api.compile_file(str(VAE), sets).program)
    arrays = Trainer(b, Samples({})).arrays
    x = np.random.default_rng(1).random((8, 32), np.float32)
    assert b.infer is not None
    want = run(b.infer, {"x": x}, arrays).outputs["predict"]
    session = ort.InferenceSession(str(tmp_path / "vae.onnx"))
    np.testing.assert_allclose(session.run(None, {"x": x})[0], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(session.run(None, {"x": x[:3]})[0], want[:3], rtol=1e-5, atol=1e-6)  # another batch


@pytest.mark.slow
def test_the_gpu_runner_draws_and_reports_as_the_numpy_runner(tmp_path) -> None:  # noqa: ANN001
    # the PyCUDA runner with its kernels run on the CPU (tests/backends/cuda_emulator.py): normal's draws, the KL
    # tensor function and the terms as on the NumPy runner
    import shutil
    import sys

    if shutil.which("g++") is None:
        pytest.skip("no g++ to run the kernels on the CPU")
    sys.path.insert(0, str(ROOT / "tests" / "backends"))
    from cuda_emulator import EmulatedDriver

    from deepdsl import api
    from deepdsl.running import run_training

    b = api.build(api.compile_file(str(VAE), {"N": 8, "D": 32, "H": 16, "Z": 4}).program)
    want = run_training(b, iters=3, data_flag="synthetic", device="cpu")
    got = run_training(b, iters=3, data_flag="synthetic", device="cpu", driver=EmulatedDriver(tmp_path))
    assert got["device"] == "cuda"
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-4)
    for term in ("rec", "kl"):
        np.testing.assert_allclose(got["loss_terms"][term], want["loss_terms"][term], rtol=1e-4, atol=1e-6)
