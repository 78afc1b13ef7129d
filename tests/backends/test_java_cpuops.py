"""The Java CPU kernels (deepdsl/runtime's family classes: CpuGemm, CpuPooling, ...) against the NumPy kernels.

Every op without an index form has cases: the registry examples of tests/ops/test_registry_complete.py
plus odd sizes, strides, padding, groups, transposes, ties and batch sizes that take the other threading
path. The Java side is compiled once and runs every case in one JVM (tests/backends/java/OpCheck.java).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import JAVAC, ROOT
from java_env import openblas_classpath
from ops.test_registry_complete import EXAMPLES

import deepdsl.ops  # noqa: F401
from deepdsl.ir import REGISTRY
from deepdsl.ir.types import DType, TensorType

pytestmark = [
    pytest.mark.java,
    pytest.mark.skipif(
        shutil.which("javac") is None, reason="javac is not on PATH: the CPU kernels cannot be compiled"
    ),
]

# registry ops that no CPU family class implements: a view, three ops lowered before any backend, and the
# statements the emitter writes as generated loops
NOT_CPUOPS = {"reshape", "batch_norm", "dropout", "layer_norm", "fused", "indexed"}
NOT_CPUOPS |= {"sample_normal", "sample_uniform"}  # lowered to random_normal / random_uniform (or a fill)
# the data-parallel statements: Network's calls of the run's Collective (tests/backends/test_java_data_parallel.py)
NOT_CPUOPS |= {"allreduce_start", "allreduce_wait", "bucket_slice"}
NOT_CPUOPS |= {"cast_bf16"}  # --precision bf16's cast: its cuda_form's kernel, a copy on the CPU (test_java_bf16.py)

# the ops whose work is matrix products (CpuGemm.gemm), run once more with OpenBLAS as the SGEMM
GEMM_OPS = {"conv2d", "conv2d_backward_data", "conv2d_backward_filter", "linear", "matmul", "batch_matmul"}

RNG = np.random.default_rng(2024)


def _random(t: TensorType, classes: int) -> np.ndarray:
    if t.dtype is DType.I64:
        return RNG.integers(0, classes, size=t.shape).astype(np.int64)
    return RNG.standard_normal(t.shape).astype(np.float32)


def _from_example(op: str) -> tuple[list[np.ndarray], dict]:
    types, attrs = EXAMPLES[op]
    classes = types[0].shape[1] if types and len(types[0].shape) > 1 else 2
    xs = [_random(t, classes) for t in types]
    if op == "dropout_mask":
        xs = [np.array(3, dtype=np.int64)]  # the step
    if op.endswith("_at"):  # a data-parallel shard's draws: the step, the shard's first sample in the global batch
        xs = [np.array(3, dtype=np.int64), np.array(2, dtype=np.int64)]
    if op.startswith("cross_entropy"):
        xs[0] = _np("softmax", [xs[0]])  # probabilities
    if op in ("bn_train_backward", "bn_train_apply"):
        var = np.abs(xs[3]) + 0.5  # a variance, 0 in a constant channel: only eps keeps 1 / sqrt(var + eps) finite
        var[0] = 0.0
        xs[3 if op == "bn_train_backward" else 2] = var
    return xs, dict(attrs)


def _np(op: str, xs: list[np.ndarray], **attrs: Any) -> np.ndarray:
    return np.asarray(REGISTRY[op].numpy(tuple(xs), attrs))


def _f(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _labels(n: int, k: int) -> np.ndarray:
    return RNG.integers(0, k, size=n).astype(np.int64)


def _java_ops() -> set[str]:
    """The ops a CpuOps method computes: those without an index form, and those a step calls the runtime for."""
    ops = {n for n, o in REGISTRY.items() if o.index_form is None or (o.java is not None and o.java.called)}
    return ops - NOT_CPUOPS


def _cases() -> list[tuple[str, str, list[np.ndarray], dict]]:
    """(case name, op, inputs, attrs) for every case."""
    cases: list[tuple[str, str, list[np.ndarray], dict]] = []

    def add(op: str, xs: list[np.ndarray], **attrs: Any) -> None:
        cases.append((f"{op}-{sum(c[1] == op for c in cases)}", op, xs, attrs))

    covered = sorted(_java_ops())
    for op in covered:
        xs, attrs = _from_example(op)
        add(op, xs, **attrs)

    # attention's softmax: 3 heads of 4 causal queries over 5 keys (more keys than queries), and unmasked
    add("masked_softmax", [_f(12, 5) * 3], scale=0.7, causal=True, period=4)
    add("masked_softmax", [_f(6, 33)], scale=1.5, causal=False, period=1)
    add("masked_softmax", [_f(6, 9) * 100], scale=-0.5, causal=True, period=6)  # a negative scale: max(x * scale)
    # groups of rows whose exponentials run as one loop (2048 elements), on the threads; a row longer than a group
    add("masked_softmax", [_f(600, 64) * 4], scale=0.25, causal=True, period=64)
    add("masked_softmax", [_f(3, 2100)], scale=1.0, causal=False, period=1)

    p = _np("softmax", [_f(7, 13)])
    add("cross_entropy", [p, _labels(7, 13)])
    add("cross_entropy_backward", [p, _labels(7, 13), _f()])

    # convolutions: odd sizes, asymmetric stride and padding, 3 groups; one image (the parallel-GEMM path);
    # a 1x1 kernel; one group per channel; small outputs, so that several images share a product; LeNet's
    # first layer; more output pixels, and a longer window (C*kh*kw), than a product sweeps in place
    # (GEMM_DIRECT), so that the im2col rows are copied into panels in blocks; a window row longer than
    # the straight-line copies take, padded at the sides only; more images than pieces of two threads, two
    # per product, so that a piece's filter gradient adds a second product onto its first; pointwise (1x1, stride 1,
    # unpadded: no im2col) in two groups with more pixels than a product takes (one image per product), and with
    # nine images of 3x3 in one product
    for n, c, h, w, f, cg, kh, kw, stride, pad, groups in [
        (3, 6, 11, 9, 9, 2, 3, 4, (2, 3), (1, 2), 3),
        (1, 8, 10, 10, 16, 8, 3, 3, (1, 1), (1, 1), 1),
        (4, 6, 5, 7, 10, 6, 1, 1, (1, 1), (0, 0), 1),
        (2, 4, 6, 6, 4, 1, 3, 3, (2, 2), (1, 1), 4),
        (12, 3, 6, 6, 5, 3, 3, 3, (1, 1), (0, 0), 1),
        (10, 4, 5, 5, 6, 2, 2, 2, (1, 1), (0, 0), 2),
        (5, 3, 28, 28, 20, 3, 5, 5, (1, 1), (0, 0), 1),
        (2, 2, 38, 38, 4, 2, 3, 3, (1, 1), (0, 0), 1),
        (2, 48, 7, 7, 6, 48, 5, 5, (1, 1), (1, 1), 1),
        (3, 2, 5, 12, 3, 2, 2, 9, (1, 1), (0, 1), 1),
        (20, 1, 24, 24, 2, 1, 3, 3, (1, 1), (0, 0), 1),
        (3, 8, 24, 24, 6, 4, 1, 1, (1, 1), (0, 0), 2),
        (9, 20, 3, 3, 12, 20, 1, 1, (1, 1), (0, 0), 1),
        # 'same' convolutions (stride 1, as wide as the input: im2col's shifted-plane copy), several images per
        # product: 4x4 and 2x2 images, a 1x1 image whose outer window rows lie wholly in the padding, a 5x3
        # kernel, two groups, and 64 channels, which the threads split
        (8, 5, 4, 4, 6, 5, 3, 3, (1, 1), (1, 1), 1),
        (6, 4, 2, 2, 3, 4, 3, 3, (1, 1), (1, 1), 1),
        (3, 2, 1, 1, 4, 2, 3, 3, (1, 1), (1, 1), 1),
        (4, 3, 6, 5, 4, 3, 5, 3, (1, 1), (2, 1), 1),
        (4, 4, 4, 4, 4, 2, 3, 3, (1, 1), (1, 1), 2),
        (8, 64, 4, 4, 8, 64, 3, 3, (1, 1), (1, 1), 1),
        # pointwise, eight images per product, enough channels that the threads split the copies of the output
        # planes out of the product (forward: 256 filters; data gradient: 256 input channels) and the gathering
        # of the gradient planes into one (filter gradient)
        (8, 16, 4, 4, 256, 16, 1, 1, (1, 1), (0, 0), 1),
        (8, 256, 4, 4, 16, 256, 1, 1, (1, 1), (0, 0), 1),
    ]:
        conv = {"stride": stride, "pad": pad, "groups": groups}
        x, wt = _f(n, c, h, w), _f(f, cg, kh, kw)
        y = _np("conv2d", [x, wt], **conv)
        add("conv2d", [x, wt], **conv)
        add("conv2d_backward_data", [_f(*y.shape), wt], in_shape=x.shape, **conv)
        add("conv2d_backward_filter", [x, _f(*y.shape)], w_shape=wt.shape, **conv)

    # dilated convolutions (issue 34): 'same' (stride 1, the shifted-plane copy) with dilation 2, strided with
    # unequal dilations and groups, a window wider than its row's straight-line copy, a 1-D one ([N, C, 1, L]),
    # one image (the parallel-GEMM path), and small outputs, so that several images share a product
    for n, c, h, w, f, cg, kh, kw, stride, pad, dilation, groups in [
        (4, 3, 7, 7, 4, 3, 3, 3, (1, 1), (2, 2), (2, 2), 1),
        (3, 6, 13, 11, 9, 2, 3, 2, (2, 1), (1, 2), (3, 2), 3),
        (2, 2, 9, 20, 3, 2, 2, 9, (1, 2), (0, 3), (1, 2), 1),
        (5, 4, 1, 30, 6, 2, 1, 3, (1, 2), (0, 2), (1, 4), 2),
        (1, 8, 12, 12, 16, 8, 3, 3, (1, 1), (1, 1), (3, 3), 1),
        (12, 3, 8, 8, 5, 3, 2, 2, (1, 1), (0, 0), (3, 2), 1),
    ]:
        conv = {"stride": stride, "pad": pad, "groups": groups, "dilation": dilation}
        x, wt = _f(n, c, h, w), _f(f, cg, kh, kw)
        y = _np("conv2d", [x, wt], **conv)
        add("conv2d", [x, wt], **conv)
        add("conv2d_backward_data", [_f(*y.shape), wt], in_shape=x.shape, **conv)
        add("conv2d_backward_filter", [x, _f(*y.shape)], w_shape=wt.shape, **conv)
    # a data gradient onto an image larger than the convolution reads (conv_transpose's output padding)
    conv = {"stride": (2, 3), "pad": (1, 0), "groups": 1, "dilation": (2, 1)}
    add("conv2d_backward_data", [_f(2, 4, 4, 3), _f(4, 3, 3, 2)], in_shape=(2, 3, 10, 10), **conv)

    # pooling: padding, odd sizes, overlapping windows; 2x2 windows at stride 2 (their own loops), on even and
    # odd sizes
    for shape, kernel, stride, pad in [
        ((2, 3, 7, 9), (3, 3), (2, 2), (1, 1)),
        ((3, 2, 9, 8), (3, 2), (2, 1), (1, 1)),
        ((1, 2, 5, 5), (3, 3), (1, 1), (1, 0)),
        ((2, 3, 8, 6), (2, 2), (2, 2), (0, 0)),
        ((2, 3, 7, 9), (2, 2), (2, 2), (0, 0)),
    ]:
        pool = {"kernel": kernel, "stride": stride, "pad": pad}
        x = _f(*shape)
        y = _np("max_pool2d", [x], **pool)
        add("max_pool2d", [x], **pool)
        add("avg_pool2d", [x], **pool)
        add("max_pool2d_backward", [x, y, _f(*y.shape)], **pool)
        add("avg_pool2d_backward", [_f(*y.shape)], in_shape=shape, **pool)
    # ties: small integers, overlapping windows, so many windows hold their maximum twice
    pool = {"kernel": (3, 3), "stride": (1, 1), "pad": (1, 1)}
    x = RNG.integers(0, 3, size=(2, 2, 6, 5)).astype(np.float32)
    y = _np("max_pool2d", [x], **pool)
    add("max_pool2d_backward", [x, y, _f(*y.shape)], **pool)
    pool = {"kernel": (2, 2), "stride": (2, 2), "pad": (0, 0)}
    x = RNG.integers(0, 2, size=(2, 3, 6, 8)).astype(np.float32)
    y = _np("max_pool2d", [x], **pool)
    add("max_pool2d_backward", [x, y, _f(*y.shape)], **pool)
    add("global_avg_pool", [_f(3, 5, 7, 6)])
    add("global_avg_pool_backward", [_f(3, 5, 1, 1)], in_shape=(3, 5, 7, 6))

    # lrn: an even size and a stronger alpha
    lrn = {"size": 4, "alpha": 0.05, "beta": 0.75, "k": 2.0}
    x = _f(2, 7, 3, 5)
    add("lrn", [x], **lrn)
    add("lrn_backward", [x, _np("lrn", [x], **lrn), _f(2, 7, 3, 5)], **lrn)

    # layer norm's rows: a width the four running sums do not divide, and rows enough to split over threads
    for rows, width in ((5, 7), (600, 64)):
        x = _f(rows, width) * 3 + 1
        add("layer_norm_rows", [x], eps=1e-5)
        add("layer_norm_rows_backward", [x, _f(rows, width)], eps=1e-5)

    # batch norm's gradient: images, a plane the four running sums do not divide, and channels enough to split
    # over threads; a batch norm over features ([N, C])
    for shape in ((3, 5, 3, 7), (8, 300, 4, 4), (6, 9)):
        c = shape[1]
        x, mean = _f(*shape) * 2 + 1, _f(c)
        var = np.abs(_f(c)) + 0.5
        add("bn_train_backward", [x, _f(*shape), mean, var, _f(c), _f(c), _f(c)], eps=1e-5)

    # matrix products: every transpose, and sizes large enough to split over threads
    for ta in (False, True):
        for tb in (False, True):
            a = _f(*((150, 70) if ta else (70, 150)))
            b = _f(*((90, 150) if tb else (150, 90)))
            add("matmul", [a, b], transpose_a=ta, transpose_b=tb)
            a3 = _f(*((3, 9, 5) if ta else (3, 5, 9)))
            b3 = _f(*((3, 7, 9) if tb else (3, 9, 7)))
            add("batch_matmul", [a3, b3], transpose_a=ta, transpose_b=tb)
    add("matmul", [_f(3, 40), _f(40, 600)])
    add("batch_matmul", [_f(1, 60, 80), _f(1, 70, 80)], transpose_b=True)
    add("linear", [_f(64, 200), _f(100, 200)])
    add("linear", [_f(20, 37), _f(300, 37)])  # wide enough to split the transposed weights by columns
    add("linear", [_f(3, 1), _f(5, 1)])

    # softmax family and losses on more rows
    x, g = _f(7, 13), _f(7, 13)
    labels = _labels(7, 13)
    for op in ("softmax", "log_softmax", "argmax"):
        add(op, [x])
    add("softmax_backward", [_np("softmax", [x]), g])
    add("log_softmax_backward", [_np("log_softmax", [x]), g])
    add("softmax_cross_entropy", [x * 10, labels])
    # rows enough to run on the threads (chunks of 32 rows for the loss), 65 columns (a text's characters)
    big, big_labels = _f(300, 65) * 6, _labels(300, 65)
    add("softmax", [big])
    add("softmax_cross_entropy", [big, big_labels])
    add("softmax_cross_entropy_backward", [big, big_labels, _f()])
    add("softmax_cross_entropy_backward", [x, labels, _f()])
    labels[:4] = np.argmax(x[:4], axis=1)
    add("accuracy", [x, labels])
    add("mse", [_f(3, 5), _f(3, 5)])

    # shape ops along other axes
    x = _f(2, 3, 4, 5)
    add("concat", [x, _f(2, 3, 1, 5), _f(2, 3, 2, 5)], axis=2)
    add("concat", [_f(1, 4), _f(3, 4)], axis=0)
    add("slice", [x], axis=3, start=2, stop=5)
    add("slice", [x], axis=0, start=1, stop=2)
    add("pad_axis", [x], axis=3, start=2, size=9)
    add("pad_axis", [x], axis=0, start=0, size=3)
    for axes in ((3,), (1,), (), (0, 1, 2, 3), (1, 3)):
        add("sum_axes", [x], axes=axes)
    for perm in ((3, 1, 0, 2), (0, 1, 2, 3), (1, 0, 3, 2)):
        add("transpose", [x], perm=perm)
    add("transpose", [_f(33, 47)], perm=(1, 0))

    add("dropout_mask", [np.array(0, dtype=np.int64)], shape=(3, 50), p=0.3, site="fc1.drop", seed=7)
    return cases


CASES = _cases()


def _word(v: Any) -> str:
    if isinstance(v, (tuple, list)):
        return ",".join(str(int(e)) for e in v)
    if isinstance(v, bool):
        return "true" if v else "false"
    return v if isinstance(v, str) else repr(v)


def _shape(a: np.ndarray) -> str:
    return "x".join(map(str, a.shape))


@pytest.fixture(scope="module")
def java_results(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """Compiles the CPU kernels and the driver once, runs every case in one JVM; returns the folder and its stderr."""
    work = tmp_path_factory.mktemp("java_cpuops")
    # javac takes from the source path only the runtime classes the driver uses (the family classes, Buf, Rng), so the
    # runtime's JCuda-bound classes need no jars here
    driver = ROOT / "tests" / "backends" / "java" / "OpCheck.java"
    built = subprocess.run(
        [*JAVAC, "-sourcepath", str(ROOT), "-d", str(work / "classes"), str(driver)],
        cwd=work,  # not the repository: a failing javac writes javac.DATE.args into its cwd
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stderr
    lines = []
    for name, op, xs, attrs in CASES:
        for i, x in enumerate(xs):
            np.asarray(x, dtype="<f4").tofile(work / f"{name}.{i}.bin")
        out = _np(op, xs, **attrs)
        words = [f"out={_shape(out)}", "in=" + ";".join(_shape(np.asarray(x)) for x in xs)]
        words += [f"{k}={_word(v)}" for k, v in sorted(attrs.items())]
        lines.append(" ".join([name, op, *words]))
    (work / "manifest.txt").write_text("\n".join(lines) + "\n")
    return work, _op_check(work, str(work / "classes"))


def _op_check(work: Path, classpath: str, *properties: str) -> str:
    """Runs every case of work/manifest.txt in one JVM; returns its stderr."""
    ran = subprocess.run(
        ["java", *properties, "-cp", classpath, "OpCheck", str(work)],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    return ran.stderr


@pytest.fixture(scope="module")
def openblas_results(java_results: tuple[Path, str]) -> tuple[Path, str]:
    """The same cases with OpenBLAS as the SGEMM (-Ddeepdsl.blas=openblas), into work/NAME.openblas.out.bin."""
    work = java_results[0]
    stderr = _op_check(work, f"{work / 'classes'}:{openblas_classpath()}", "-Ddeepdsl.blas=openblas")
    assert stderr.startswith("gemm: OpenBLAS 0.3.31"), stderr
    return work, stderr


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_cpuops_matches_the_numpy_kernel(case: tuple, java_results: tuple[Path, str]) -> None:
    _check(case, java_results, ".out.bin")


@pytest.mark.parametrize("case", [c for c in CASES if c[1] in GEMM_OPS], ids=[c[0] for c in CASES if c[1] in GEMM_OPS])
def test_cpuops_on_openblas_matches_the_numpy_kernel(case: tuple, openblas_results: tuple[Path, str]) -> None:
    _check(case, openblas_results, ".openblas.out.bin")


def _check(case: tuple, results: tuple[Path, str], suffix: str) -> None:
    name, op, xs, attrs = case
    work, stderr = results
    expected = _np(op, xs, **attrs).astype(np.float32)
    result = work / f"{name}{suffix}"
    assert result.exists(), f"{name} wrote no result:\n{stderr}"
    actual = np.fromfile(result, dtype="<f4").reshape(expected.shape)
    # atol scales with the output's magnitude: an element that cancels to near 0 in a long float32 sum
    # (a filter gradient over 5 x 24 x 24 products) keeps the rounding error of its largest partial sums
    atol = 1e-5 * max(1.0, float(np.max(np.abs(expected), initial=0.0)))
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=atol, err_msg=f"{name}: {op} {attrs}")


def test_every_cpuops_op_has_a_case() -> None:
    """A new op without an index form, or with one and a runtime method a step calls (bn_train_apply's, where it
    stands alone), must get a method in its family class and a case here."""
    wanted = {n for n, o in REGISTRY.items() if o.index_form is None or (o.java is not None and o.java.called)}
    assert {c[1] for c in CASES} == wanted - NOT_CPUOPS == _java_ops()


def family_methods() -> dict[str, set[str]]:
    """The public static methods taking an output first (`(Buf out, ...)`) of each class a registry entry's Java
    call names, by class."""
    classes = {o.java.cls for o in REGISTRY.values() if o.java is not None}
    runtime = ROOT / "deepdsl" / "runtime"
    return {
        c: set(re.findall(r"public static void (\w+)\(\s*Buf out", (runtime / f"{c}.java").read_text()))
        for c in classes
    }


def test_the_family_classes_have_one_public_method_per_op() -> None:
    """Each op without an index form is a method named as the op in the class its registry entry names, and
    every such method of those classes is an op's (no forwarding class between the device and the family)."""
    methods = family_methods()
    called = {n for n, o in REGISTRY.items() if o.java is not None and o.java.called}  # bn_train_apply
    wanted = {n for n, o in REGISTRY.items() if o.index_form is None} - NOT_CPUOPS | called
    assert {n for n in wanted if n not in methods[REGISTRY[n].java.cls]} == set()
    assert set().union(*methods.values()) == wanted


@pytest.mark.slow  # 7 s (the default suite's four minutes)
@pytest.mark.parametrize("blas", ["java", "openblas"])
def test_gemm_reads_a_direct_buffer_operand(blas: str, tmp_path: Path) -> None:
    """CpuGemm.gemm with B in a direct buffer (the im2col columns OpenBLAS reads in place), as stored and
    transposed, from an inner element, on either SGEMM, against float64 loops (tests/backends/java/GemmCheck.java)."""
    check = ROOT / "tests" / "backends" / "java" / "GemmCheck.java"
    built = subprocess.run(
        [*JAVAC, "-sourcepath", str(ROOT), "-d", str(tmp_path), str(check)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stderr
    cp = str(tmp_path) if blas == "java" else f"{tmp_path}:{openblas_classpath()}"
    ran = subprocess.run(
        ["java", "-cp", cp, "deepdsl.runtime.GemmCheck", blas],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert ran.stdout.split("\n")[:2] == ["OpenBLAS 0.3.31" if blas == "openblas" else "Java SGEMM", "ok"]
