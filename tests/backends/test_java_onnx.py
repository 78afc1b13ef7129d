"""An imported ONNX model compiles to Java, and Java's first losses from the imported weights equal the NumPy
runner's."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from java_env import JAVA_MARKS, java_json, javac

pytestmark = JAVA_MARKS

onnx = pytest.importorskip("onnx")


@pytest.mark.slow  # two compiles and javac: about 20 s
def test_imported_model_trains_in_java_as_in_numpy(cli, tmp_path: Path) -> None:
    from test_onnx import resnet_like

    onnx.save(resnet_like(13), tmp_path / "m.onnx")
    net, params = tmp_path / "net.ddsl", tmp_path / "p.npz"
    r = cli("import", str(tmp_path / "m.onnx"), "-o", str(net), "--params", str(params), "--batch", "4")
    assert r.exit_code == 0, r.output
    r = cli("compile", str(net), "-o", str(tmp_path / "src"))
    assert r.exit_code == 0, r.output
    from deepdsl.backends.java import class_name

    src, main = tmp_path / "src", class_name("m")  # the graph is torch_jit: the network is named after m.onnx
    javac(src, [src / f"{main}.java", *(src / "deepdsl" / "runtime").glob("*.java")], tmp_path / "build")
    r = cli("run", str(net), "--load", str(params), "--iters", "3", "--data", "synthetic", "--device", "cpu", "--json")
    assert r.exit_code == 0, r.output
    want = json.loads(r.stdout)["losses"]
    got = java_json(tmp_path / "build", main, "--load", str(params), "--iters", "3", "--data", "synthetic",
                    "--device", "cpu", cwd=tmp_path)["losses"]  # fmt: skip
    np.testing.assert_allclose(got, want, rtol=1e-4)
    # and the file's weights were used: a run from the network's own initialisation starts elsewhere
    fresh = json.loads(cli("run", str(net), "--iters", "1", "--device", "cpu", "--json").stdout)["losses"]
    assert abs(fresh[0] - want[0]) > 1e-3
