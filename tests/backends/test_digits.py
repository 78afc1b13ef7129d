"""Real data: the MLP of networks/ learns scikit-learn's bundled handwritten digits."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import ROOT


@pytest.mark.slow  # 200 NumPy steps and a test pass: 12 s of CPU
def test_mlp_reaches_90_percent_on_digits(cli, tmp_path) -> None:  # noqa: ANN001
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None]  # [1797, 1, 8, 8] in [0, 1]
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order], y[order]
    data = tmp_path / "digits.npz"
    np.savez(data, x=x[:1500], y=y[:1500], x_test=x[1500:], y_test=y[1500:])
    r = cli("run", str(ROOT / "networks" / "mlp.ddsl"), "--set", "N=32", "--set", "H=8", "--set", "W=8",
            "--data", f"npz:{data}", "--iters", "200", "--json")  # fmt: skip
    assert r.exit_code == 0, r.output
    result = json.loads(r.stdout)
    assert result["losses"][-1] < result["losses"][0]
    assert result["test_accuracy"] >= 0.90, result["test_accuracy"]
