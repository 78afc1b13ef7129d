"""Plant a bug in each op family and show that the default test suite catches it (issue 35).

Each mutation replaces one exact piece of text in one source file (the NumPy kernel, the index form, the Java
runtime or printer, the CUDA kernel) in a copy of the working tree, then runs the default-suite tests named for
it (`-m 'not slow'`, one process) in that copy. A mutation is caught when a test fails; the report names the
tests that did (up to three, a golden-file test last). The unmutated copy runs every named test first: a test
that fails before any bug is planted proves nothing, and the script stops there.

    python scripts/plant_bugs.py              # every mutation; a table on stdout, exit 1 if one is missed
    python scripts/plant_bugs.py relu conv    # the mutations whose name contains any of these words
    python scripts/plant_bugs.py --list

A mutation whose text is no longer in its file (the code moved) is reported `stale`: update its text here.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

OPS = "tests/ops"  # the NumPy kernels against references, finite differences and the index forms
FORMS = "tests/ops/test_index_forms.py"
JAVA_OPS = "tests/backends/test_java_cpuops.py"  # the runtime's methods against the NumPy kernels
JAVA_KERNELS = "tests/backends/test_java_emit.py::test_kernels_equal_evaluate"  # printed kernels, in one JVM
CUDA = "tests/backends/test_cuda_emit.py"  # every CUDA kernel of small networks, run on the CPU emulator


@dataclass(frozen=True)
class Mutation:
    name: str
    family: str
    layer: str  # numpy, index form, java, cuda
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


MUTATIONS = [
    # element-wise
    Mutation("relu_identity_numpy", "elementwise", "numpy", "deepdsl/ops/elementwise.py",
             '"relu": lambda x, a: np.maximum(x, 0),', '"relu": lambda x, a: x,', (OPS,)),
    Mutation("relu_identity_index_form", "elementwise", "index form", "deepdsl/ops/elementwise.py",
             '"relu": lambda a, x: ap("max", x, c(0)),', '"relu": lambda a, x: x,', (FORMS,)),
    Mutation("tanh_grad_sign_numpy", "elementwise", "numpy", "deepdsl/ops/elementwise.py",
             '"tanh_grad": lambda g, y, a: g * (1 - y * y),', '"tanh_grad": lambda g, y, a: g * (y * y - 1),',
             (OPS,)),
    Mutation("sigmoid_grad_sign_index_form", "elementwise", "index form", "deepdsl/ops/elementwise.py",
             'ap("*", g, ap("*", y, ap("-", c(1), y)))', 'ap("*", g, ap("*", y, ap("-", y, c(1))))', (FORMS,)),
    Mutation("relu_grad_at_zero_index_form", "elementwise", "index form", "deepdsl/ops/elementwise.py",
             '"relu_grad": lambda a, g, y: ap("select", ap(">", y, c(0)), g, c(0)),',
             '"relu_grad": lambda a, g, y: ap("select", ap(">=", y, c(0)), g, c(0)),', (FORMS,)),  # only at the kink
    Mutation("abs_grad_at_zero_numpy", "elementwise", "numpy", "deepdsl/ops/elementwise.py",
             '"abs_grad": lambda g, x, a: g * np.sign(x).astype(g.dtype),',
             '"abs_grad": lambda g, x, a: g * np.where(x >= 0, 1, -1).astype(g.dtype),', (OPS,)),  # only at the kink
    Mutation("abs_identity_java_printer", "elementwise", "java", "deepdsl/backends/cexpr.py",
             '"abs": "Math.abs({0})"', '"abs": "({0})"', (JAVA_KERNELS,)),
    Mutation("relu_identity_cuda_printer", "elementwise", "cuda", "deepdsl/backends/cexpr.py",
             '"max": "fmaxf({0}, {1})"', '"max": "({0})"', (CUDA,)),
    # convolution
    Mutation("conv_pad_offset_numpy", "conv", "numpy", "deepdsl/ops/conv.py",
             "    out = np.zeros((n, c, h + 2 * ph, w + 2 * pw), dtype=x.dtype)\n"
             "    out[:, :, ph : ph + h, pw : pw + w] = x",
             "    out = np.zeros((n, c, h + 2 * ph, w + 2 * pw), dtype=x.dtype)\n"
             "    out[:, :, 2 * ph : 2 * ph + h, pw : pw + w] = x", (OPS,)),
    Mutation("conv_window_row_java", "conv", "java", "deepdsl/runtime/Im2col.java",
             "            int iy = oy * s.sh - s.ph + i;\n            if (iy < 0 || iy >= s.h) {\n"
             "              Arrays.fill(to, at, at + s.kw, 0f);",
             "            int iy = oy * s.sh - s.ph + i + 1;\n            if (iy < 0 || iy >= s.h) {\n"
             "              Arrays.fill(to, at, at + s.kw, 0f);", (JAVA_OPS,)),
    Mutation("conv_window_row_cuda", "conv", "cuda", "deepdsl/backends/cuda/library.cu",
             "int h = qh * SH - PH + i, u = qw * SW - PW + j;", "int h = qh * SH - PH + i + 1, u = qw * SW - PW + j;",
             (CUDA,)),
    # pooling
    Mutation("pool_window_short_numpy", "pool", "numpy", "deepdsl/ops/pool.py",
             "    for i in range(kh):\n        for j in range(kw):\n            yield",
             "    for i in range(kh - 1):\n        for j in range(kw):\n            yield", (OPS,)),
    Mutation("pool_window_row_java", "pool", "java", "deepdsl/runtime/CpuPooling.java",
             "      int iy = oy * sh - ph + i;", "      int iy = oy * sh - ph + i + 1;", (JAVA_OPS,)),
    Mutation("max_pool_window_row_cuda", "pool", "cuda", "deepdsl/backends/cuda/library.cu",
             "float m = DD_NEG_INF;\n        for (int i = 0; i < KH; i++) {\n            int h = oh * SH - PH + i;",
             "float m = DD_NEG_INF;\n        for (int i = 0; i < KH; i++) {\n            int h = oh * SH - PH + i + 1;",
             (CUDA,)),
    # normalisation
    Mutation("bn_eps_dropped_numpy", "norm", "numpy", "deepdsl/ops/norm.py",
             'scale = 1 / np.sqrt(var + x.dtype.type(a["eps"]))', "scale = 1 / np.sqrt(var)", (OPS,)),
    Mutation("layer_norm_mean_axis_numpy", "norm", "numpy", "deepdsl/ops/layer_norm.py",
             "    centred = x - x.mean(axis=1, keepdims=True)", "    centred = x - x.mean(axis=0, keepdims=True)",
             (OPS,)),
    Mutation("bn_eps_dropped_java", "norm", "java", "deepdsl/runtime/CpuNormalisation.java",
             "float scale = gamma.a[gamma.off + c] / (float) Math.sqrt(var.a[var.off + c] + eps);",
             "float scale = gamma.a[gamma.off + c] / (float) Math.sqrt(var.a[var.off + c]);", (JAVA_OPS,)),
    # losses
    Mutation("softmax_ce_grad_sign_numpy", "loss", "numpy", "deepdsl/ops/loss.py",
             "    d[_rows(len(labels)), labels] -= 1", "    d[_rows(len(labels)), labels] += 1", (OPS,)),
    Mutation("softmax_ce_grad_sign_java", "loss", "java", "deepdsl/runtime/CpuLosses.java",
             "out.a[o + (int) labels.a[labels.off + r]] -= 1f;", "out.a[o + (int) labels.a[labels.off + r]] += 1f;",
             (JAVA_OPS,)),
    # linear algebra
    Mutation("linear_weight_layout_numpy", "linalg", "numpy", "deepdsl/ops/linalg.py",
             'numpy_kernel("linear")(lambda xs, a: xs[0] @ xs[1].T)',
             'numpy_kernel("linear")(lambda xs, a: xs[0] @ xs[1].reshape(xs[1].shape[1], -1))', (OPS,)),
    Mutation("linear_weight_untransposed_java", "linalg", "java", "deepdsl/runtime/CpuGemm.java",
             "x.a, x.off, x.dim(0), x.dim(1), false, w.a, w.off, w.dim(0), w.dim(1), true, out.a,",
             "x.a, x.off, x.dim(0), x.dim(1), false, w.a, w.off, w.dim(1), w.dim(0), false, out.a,", (JAVA_OPS,)),
    # reductions
    Mutation("sum_squares_abs_numpy", "reduce", "numpy", "deepdsl/ops/reduce.py",
             'numpy_kernel("sum_squares")(lambda xs, a: np.sum(xs[0] * xs[0]))',
             'numpy_kernel("sum_squares")(lambda xs, a: np.sum(np.abs(xs[0]) * xs[0]))', (OPS,)),
    Mutation("channel_var_unsquared_numpy", "reduce", "numpy", "deepdsl/ops/reduce.py",
             "np.mean(np.square(xs[0] - _bc(xs[1], xs[0].ndim)), axis=_channel_axes(xs[0]))",
             "np.mean(np.abs(xs[0] - _bc(xs[1], xs[0].ndim)) ** 2 * np.sign(xs[0]), axis=_channel_axes(xs[0]))",
             (OPS,)),
    # shapes
    Mutation("slice_off_by_one_numpy", "shape", "numpy", "deepdsl/ops/shape.py",
             'index[a["axis"]] = slice(a["start"], a["stop"])',
             'index[a["axis"]] = slice(a["start"] + 1, a["stop"] + 1)', (OPS,)),
    Mutation("slice_off_by_one_java", "shape", "java", "deepdsl/runtime/CpuShapes.java",
             "System.arraycopy(x.a, x.off + o * inRow + start * inner, out.a, out.off + o * row, row);",
             "System.arraycopy(x.a, x.off + o * inRow + (start + 1) * inner, out.a, out.off + o * row, row - inner);",
             (JAVA_OPS,)),
    # optimisers
    Mutation("sgd_step_sign_numpy", "optim", "numpy", "deepdsl/ops/optim.py",
             'numpy_kernel("sgd_step")(lambda xs, a: xs[0] - _f(xs[0], a["lr"]) * xs[1])',
             'numpy_kernel("sgd_step")(lambda xs, a: xs[0] + _f(xs[0], a["lr"]) * xs[1])', (OPS,)),
    Mutation("sgd_step_sign_index_form", "optim", "index form", "deepdsl/ops/optim.py",
             '"sgd_step": lambda a, w, v: ap("-", w, ap("*", c(a["lr"]), v)),',
             '"sgd_step": lambda a, w, v: ap("+", w, ap("*", c(a["lr"]), v)),', (FORMS,)),
    # embedding
    Mutation("embedding_row_off_by_one_numpy", "embedding", "numpy", "deepdsl/ops/embedding.py",
             "    return w[tokens]", "    return w[(tokens + 1) % w.shape[0]]", (OPS,)),
    # resize
    Mutation("resize_nearest_shift_numpy", "resize", "numpy", "deepdsl/ops/resize.py",
             "        return np.repeat(x, factor, axis=axis)",
             "        return np.roll(np.repeat(x, factor, axis=axis), 1, axis=axis)", (OPS,)),
    Mutation("resize_bilinear_half_pixel_numpy", "resize", "numpy", "deepdsl/ops/resize.py",
             "    s = np.clip((i + 0.5) / factor - 0.5, 0.0, n - 1)", "    s = np.clip(i / factor, 0.0, n - 1)",
             (OPS,)),
]  # fmt: skip


def copy_tree(dest: Path) -> None:
    """The working tree's tracked and untracked (not ignored) files, and the JCuda jars' folder as a link."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file() and not source.is_symlink():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    jars = ROOT / ".ci" / "jcuda" / "lib"
    if jars.exists():
        (dest / ".ci" / "jcuda").mkdir(parents=True, exist_ok=True)
        (dest / ".ci" / "jcuda" / "lib").symlink_to(jars.resolve())


def run_tests(tree: Path, tests: tuple[str, ...], timeout: int) -> tuple[int, str]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    cmd = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-m", "not slow", "-p", "no:cacheprovider",
           "-rf", "--tb=no", *tests]  # fmt: skip
    try:
        r = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return -1, "timed out"
    return r.returncode, r.stdout + r.stderr


def failures(output: str) -> str:
    """The failed tests, a golden-file comparison last (it sees any change of text, not what the code computes)."""
    failed = sorted(dict.fromkeys(re.findall(r"^(?:FAILED|ERROR) (\S+)", output, re.M)), key=lambda t: "golden" in t)
    if not failed:
        return (output.strip().splitlines() or ["?"])[-1][:100]
    return ", ".join(failed[:3]) + (f" and {len(failed) - 3} more" if len(failed) > 3 else "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("words", nargs="*", help="run only the mutations whose name contains one of these")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument("--timeout", type=int, default=900, help="seconds for one mutation's tests")
    args = parser.parse_args()
    chosen = [m for m in MUTATIONS if not args.words or any(w in m.name for w in args.words)]
    if args.list:
        for m in chosen:
            print(f"{m.name:36} {m.family:10} {m.layer:10} {m.path}")
        return 0
    with tempfile.TemporaryDirectory(prefix="plant-bugs-") as tmp:
        tree = Path(tmp)
        copy_tree(tree)
        needed = tuple(dict.fromkeys(t for m in chosen for t in m.tests))
        rc, out = run_tests(tree, needed, args.timeout)
        if rc != 0:
            print(f"the tests fail before any bug is planted ({failures(out)}):\n{out[-3000:]}")
            return 2
        rows, missed = [], 0
        for m in chosen:
            path = tree / m.path
            text = path.read_text()
            if text.count(m.old) != 1:
                rows.append((m, "stale", f"the text occurs {text.count(m.old)} times in {m.path}", 0.0))
                missed += 1
                continue
            path.write_text(text.replace(m.old, m.new))
            start = time.monotonic()
            try:
                rc, out = run_tests(tree, m.tests, args.timeout)
            finally:
                path.write_text(text)
            caught = rc not in (0, 5, -1)  # 5: no tests ran
            missed += not caught
            rows.append((m, "caught" if caught else "MISSED", failures(out) if caught else out[-200:],
                         time.monotonic() - start))  # fmt: skip
            print(f"{m.name}: {rows[-1][1]} {rows[-1][2]}", file=sys.stderr, flush=True)
    print("| mutation | family | layer | result | caught by | s |")
    print("|---|---|---|---|---|---|")
    for m, result, by, seconds in rows:
        print(f"| {m.name} | {m.family} | {m.layer} | {result} | {by} | {seconds:.0f} |")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
