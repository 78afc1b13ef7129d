"""The ONNX figures: how long `deepdsl import` + `deepdsl compile` take for an exported ResNet-50 (each a fresh
process, as a user runs them), and the largest difference against ONNX Runtime over the round trips of
tests/test_onnx.py (every network at its reduced size exported, and imported again; the exporter-style models).

    python scripts/bench_onnx.py [--skip-diff]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def deepdsl(*args: str) -> float:
    """Wall seconds of one `deepdsl` command in a fresh process."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "deepdsl", *args], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def timings(folder: Path) -> None:
    onnx_file = folder / "resnet50.onnx"
    export = deepdsl("export", str(ROOT / "networks" / "resnet50.ddsl"), "-o", str(onnx_file))
    size = onnx_file.stat().st_size / 2**20
    imp = deepdsl("import", str(onnx_file), "-o", str(folder / "r.ddsl"), "--batch", "32")
    comp = deepdsl("compile", str(folder / "r.ddsl"), "-o", str(folder / "out"))
    print(f"ResNet-50: export {export:.2f} s ({size:.0f} MiB); import {imp:.2f} s + compile {comp:.2f} s = "
          f"{imp + comp:.2f} s")  # fmt: skip


def largest_difference(folder: Path) -> None:
    import numpy as np
    import onnx
    from helpers import REDUCED
    from test_onnx import NETWORKS, OPSETS, deepdsl_output, imported, inception_like, ort_output, resnet_like

    from deepdsl import api
    from deepdsl.autodiff import infer_program
    from deepdsl.backends.onnx_export import export_graph
    from deepdsl.interop import initial_arrays

    worst: list[tuple[float, str]] = []

    def diff(got: np.ndarray, want: np.ndarray, what: str) -> None:
        d = float(np.max(np.abs(got - want)))
        worst.append((d / max(1.0, float(np.max(np.abs(want)))), f"{what}: {d:.3g} (outputs up to "
                                                                    f"{float(np.max(np.abs(want))):.3g})"))  # fmt: skip

    for net in NETWORKS:
        program = api.compile_file(ROOT / "networks" / f"{net}.ddsl", REDUCED[net][0]).program
        arrays = initial_arrays(program)
        model = export_graph(infer_program(program.graph), arrays)
        x = np.random.default_rng(0).standard_normal(program.graph.inputs[0].value.type.shape).astype(np.float32)
        want = deepdsl_output(program, arrays, x)
        diff(ort_output(model, x), want, f"{net} exported, ORT against deepdsl")
        again, again_arrays, _ = imported(folder, model, batch=x.shape[0])
        diff(deepdsl_output(again, again_arrays, x), want, f"{net} exported and imported")
    for make in (resnet_like, inception_like):
        for opset in OPSETS:
            model = make(opset)
            program, arrays, _ = imported(folder, model, batch=3)
            x = np.random.default_rng(1).standard_normal(program.graph.inputs[0].value.type.shape).astype(np.float32)
            diff(deepdsl_output(program, arrays, x), ort_output(model, x), f"{make.__name__} opset {opset} imported")
    assert onnx is not None
    for rel, line in sorted(worst, reverse=True)[:3]:
        print(f"  {line}, relative {rel:.2g}")
    print(f"largest difference against ONNX Runtime over {len(worst)} round trips: relative {max(worst)[0]:.2g}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-diff", action="store_true", help="only the ResNet-50 timings")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        timings(Path(d))
        if not args.skip_diff:
            largest_difference(Path(d))


if __name__ == "__main__":
    main()
