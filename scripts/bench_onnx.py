"""The ONNX figures: how long `deepdsl import` + `deepdsl compile` take for an exported ResNet-50 (each a fresh
process, as a user runs them), and the largest difference against ONNX Runtime over the round trips of
tests/test_onnx.py (every network at its reduced size exported, and imported again; the exporter-style models).

    python scripts/bench_onnx.py [--skip-diff]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def deepdsl(*args: str) -> tuple[float, float]:
    """Wall and CPU (user + system) seconds of one `deepdsl` command in a fresh process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "deepdsl", *args], check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def timings(folder: Path) -> None:
    onnx_file = folder / "resnet50.onnx"
    export, _ = deepdsl("export", str(ROOT / "networks" / "resnet50.ddsl"), "-o", str(onnx_file))
    size = onnx_file.stat().st_size / 2**20
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"ResNet-50 exported in {export:.2f} s ({size:.0f} MiB)")
    imports, compiles = [], []
    for _ in range(3):  # the best of three: the machine is shared
        imports.append(deepdsl("import", str(onnx_file), "-o", str(folder / "r.ddsl"), "--batch", "32"))
        compiles.append(deepdsl("compile", str(folder / "r.ddsl"), "-o", str(folder / "out")))
    (iw, ic), (cw, cc) = min(imports), min(compiles)
    print(
        f"  import {iw:.2f} s wall ({ic:.2f} s CPU) + compile {cw:.2f} s wall ({cc:.2f} s CPU) = "
        f"{iw + cw:.2f} s wall ({ic + cc:.2f} s CPU), each the best of three, in a fresh process"
    )


def largest_difference(folder: Path) -> None:
    import numpy as np
    import onnx
    from helpers import REDUCED
    from test_onnx import NETWORKS, OPSETS, deepdsl_output, imported, inception_like, ort_output, resnet_like

    from deepdsl import api
    from deepdsl.autodiff import infer_program
    from deepdsl.backends.onnx_export import export_graph
    from deepdsl.interop import initial_arrays

    against_ort: list[tuple[float, str]] = []  # (difference relative to the output's scale, what)
    reimported: list[tuple[float, str]] = []

    def diff(got: np.ndarray, want: np.ndarray, what: str, into: list) -> None:
        d, scale = float(np.max(np.abs(got - want))), float(np.max(np.abs(want)))
        into.append((d / max(1.0, scale), f"{what}: {d:.3g} (outputs up to {scale:.3g})"))

    for net in NETWORKS:
        program = api.compile_file(ROOT / "networks" / f"{net}.ddsl", REDUCED[net][0]).program
        arrays = initial_arrays(program)
        model = export_graph(infer_program(program.graph), arrays)
        x = np.random.default_rng(0).standard_normal(program.graph.inputs[0].value.type.shape).astype(np.float32)
        want = deepdsl_output(program, arrays, x)
        diff(ort_output(model, x), want, f"{net} exported: ORT against deepdsl", against_ort)
        again, again_arrays, _ = imported(folder, model, batch=x.shape[0])
        diff(deepdsl_output(again, again_arrays, x), want, f"{net} exported and imported, against deepdsl", reimported)
    for make in (resnet_like, inception_like):
        for opset in OPSETS:
            model = make(opset)
            program, arrays, _ = imported(folder, model, batch=3)
            x = np.random.default_rng(1).standard_normal(program.graph.inputs[0].value.type.shape).astype(np.float32)
            what = f"{make.__name__} opset {opset} imported: deepdsl against ORT"
            diff(deepdsl_output(program, arrays, x), ort_output(model, x), what, against_ort)
    assert onnx is not None
    for rel, line in sorted(against_ort, reverse=True)[:3]:
        print(f"  {line}, relative {rel:.2g}")
    print(f"largest difference against ONNX Runtime over {len(against_ort)} comparisons: relative "
          f"{max(against_ort)[0]:.2g} ({max(against_ort)[1]})")  # fmt: skip
    print(f"largest difference of an imported export against the network over {len(reimported)}: relative "
          f"{max(reimported)[0]:.2g}")  # fmt: skip


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
