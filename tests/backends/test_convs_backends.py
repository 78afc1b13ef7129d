"""The convolution family of issues 33 and 34 (dilation, asymmetric padding, output padding, ceil mode, conv1d and
the 1-D pools) in every backend: the stand-in cuDNN's dilated convolutions through the Python wrapper, the CUDA
runner (own kernels and cuDNN) on the emulated driver, the Java program on the CPU (im2col and direct loops) and on
the CUDA device (own kernels and cuDNN, on the stand-ins) against the NumPy runner's losses."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from cuda13_stand_ins import fake_cuda13, fake_cudnn9
from cuda_emulator import TILED, EmulatedDriver, emulate, fake_driver, fake_vendor, kernel_names
from java_env import JAVA_MARKS, java_json, javac, jcuda_jars

from deepdsl import api
from deepdsl.backends.cuda.vendor import open_vendor
from deepdsl.ir import REGISTRY, TensorType
from deepdsl.running import run_training

needs_gcc = pytest.mark.skipif(shutil.which("g++") is None or shutil.which("gcc") is None, reason="no gcc/g++")

CONVS = """network Convs
const N = 4
const K = 5
input x : [N, 2, 12, 12]
label y : [N] classes K

def body(x) {
  a = relu(conv(x, 4, kernel=3, dilation=2, pad=(1, 2, 2, 1)))
  b = max_pool(a, 3, stride=2, pad=(1, 0, 0, 1), ceil_mode=true)
  c = avg_pool(relu(conv(b, 4, kernel=2, dilation=(1, 2), stride=(1, 2), pad=1, groups=2)), 2, ceil_mode=true)
  d = conv_transpose(c, 3, kernel=3, stride=2, pad=1, dilation=2, output_padding=1)
  s = reshape(x, (N, 2, 144))
  e = max_pool1d(relu(conv1d(s, 4, 5, stride=2, pad=(2, 1), dilation=3)), 3, stride=2, ceil_mode=true)
  f = global_avg_pool(avg_pool1d(e, 3, stride=2, ceil_mode=true))
  return full(flatten(d), K) + full(flatten(f), K)
}

layer model = body
loss    = softmax_cross_entropy(model(x), y)
predict = model(x)

train { data = synthetic(seed=2) optimizer = sgd(lr=0.05, momentum=0.9) iterations = 3 seed = 1 }
"""


def _numpy_losses() -> dict:
    build = api.build(api.compile_source(CONVS, "convs.ddsl", {}).program)
    return run_training(build, iters=3, data_flag="synthetic", device="cpu")


@pytest.fixture(scope="module")
def vendor_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fake_vendor(tmp_path_factory.mktemp("vendor"))


# ---- cuDNN's dilated convolutions (the stand-in computes cuDNN's definition) ----


@pytest.mark.parametrize("op", ["conv2d", "conv2d_backward_data", "conv2d_backward_filter"])
@pytest.mark.parametrize("room", [0, 1 << 20])
def test_a_dilated_convolution_through_cudnn_is_numpys(vendor_folder: Path, op: str, room: int) -> None:
    vendor = open_vendor("vendor", [vendor_folder])
    assert vendor.cudnn is not None
    xs, ws = (2, 4, 11, 9), (6, 2, 3, 2)
    conv = {"stride": (2, 1), "pad": (1, 2), "groups": 2, "dilation": (3, 2)}
    ys = REGISTRY["conv2d"].shape((TensorType(xs), TensorType(ws)), conv).shape
    types, attrs = {"conv2d": ((xs, ws), conv), "conv2d_backward_data": ((ys, ws), {**conv, "in_shape": xs}),
                    "conv2d_backward_filter": ((xs, ys), {**conv, "w_shape": ws})}[op]  # fmt: skip
    tensors = tuple(TensorType(s) for s in types)
    out_type = REGISTRY[op].shape(tensors, attrs)
    fact = REGISTRY[op].vendor(tensors, out_type, attrs)
    assert (fact if op == "conv2d" else fact.conv).dilation == (3, 2)
    rng = np.random.default_rng(1)
    a, b = (rng.standard_normal(s).astype(np.float32) for s in types)
    out = np.full(out_type.shape, np.nan, np.float32)
    call = vendor.cudnn.prepare(fact, room)
    ws_bytes = np.zeros(max(call.workspace, 4), np.uint8)
    vendor.cudnn.convolve(call, out.ctypes.data, a.ctypes.data, b.ctypes.data, ws_bytes.ctypes.data)
    np.testing.assert_allclose(out, REGISTRY[op].numpy((a, b), attrs), rtol=1e-4, atol=1e-5)
    vendor.close()


# ---- the CUDA runner on the emulated driver ----


@needs_gcc
@pytest.mark.parametrize("kernels", [pytest.param("own", marks=pytest.mark.slow), "vendor"])
def test_the_cuda_runner_agrees_with_numpy(kernels: str, tmp_path: Path, vendor_folder: Path) -> None:
    build = api.build(api.compile_source(CONVS, "convs.ddsl", {}).program)
    want = run_training(build, iters=3, data_flag="synthetic", device="cpu")
    driver = EmulatedDriver(tmp_path, vendor=open_vendor(kernels, [vendor_folder]))
    lines: list[str] = []
    got = run_training(build, iters=3, data_flag="synthetic", driver=driver, report=lines.append)
    assert got["device"] == "cuda"
    assert ("cuDNN 9.0.0" in lines[0]) == (kernels == "vendor"), lines[0]
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-4, atol=1e-6)
    assert got["test_loss"] == pytest.approx(want["test_loss"], rel=1e-4)


# ---- the Java program ----


@pytest.fixture(scope="module")
def java_program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Convs compiled to Java with its PTX, built; its kernels for the CPU; the stand-in driver."""
    from click.testing import CliRunner

    from deepdsl.cli import cli

    folder = tmp_path_factory.mktemp("java_convs")
    (folder / "convs.ddsl").write_text(CONVS)
    src = folder / "src"
    r = CliRunner().invoke(cli, ["compile", str(folder / "convs.ddsl"), "-o", str(src), "--ptx", "--arch", "sm_90"])
    assert r.exit_code == 0, r.output
    javac(src, [*src.glob("*.java"), *(src / "deepdsl" / "runtime").glob("*.java")], folder / "build")
    return folder


def _cpu(folder: Path, *args: str) -> dict:
    return java_json(folder / "build", "Convs", "--data", "synthetic", "--device", "cpu", *args, cwd=folder)


def _java(test):  # noqa: ANN001, ANN202
    for mark in JAVA_MARKS:
        test = mark(test)
    return test


@_java
def test_the_java_cpu_program_gives_the_numpy_runners_losses(java_program: Path) -> None:
    want = _numpy_losses()
    got = _cpu(java_program, "--iters", "3")
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-4)
    assert got["test_loss"] == pytest.approx(want["test_loss"], rel=1e-4)
    lean = _cpu(java_program, "--iters", "3", "--workspace-limit", "0")  # the direct loops rather than im2col
    np.testing.assert_allclose(lean["losses"], want["losses"], rtol=1e-4)
    # the bytes a step holds mean the same in both and in memcheck's plan
    from click.testing import CliRunner

    from deepdsl.cli import cli

    r = CliRunner().invoke(cli, ["memcheck", str(java_program / "convs.ddsl"), "--json"])
    assert r.exit_code == 0, r.output
    plan = json.loads(r.stdout)
    assert (got["peak_bytes"], got["arena_bytes"]) == (want["peak_bytes"], want["arena_bytes"])
    assert (want["peak_bytes"], want["arena_bytes"]) == (plan["peak_bytes"], plan["arena_bytes"])


@_java
@needs_gcc
@pytest.mark.slow  # 10-15 s each: the kernels emulated on the CPU
@pytest.mark.parametrize("kernels", ["own", "vendor"])
def test_the_java_cuda_device_gives_the_cpu_devices_losses(
    java_program: Path, tmp_path_factory: pytest.TempPathFactory, kernels: str
) -> None:
    """On the stand-in driver with the kernels emulated on the CPU: the CUDA library's own convolution kernels, and
    cuDNN's (the stand-in) for --kernels vendor."""
    folder = java_program
    if not (folder / "Convs" / "emulated.so").exists():
        unit = (folder / "src" / "Convs.cu").read_text()
        names = kernel_names(unit)
        (folder / "Convs").mkdir(exist_ok=True)
        emulate(unit, names, folder / "Convs", [k for k in names if k not in TILED])
        fake_driver(folder / "fake")
    vendor = []
    if kernels == "vendor":
        vendor = [fake_cuda13(tmp_path_factory.mktemp("cuda13")), fake_cudnn9(tmp_path_factory.mktemp("cudnn9"))]
    libs = [str(folder / "fake"), *map(str, vendor)]
    env = {"LD_LIBRARY_PATH": ":".join(libs), "DEEPDSL_FAKE_CUDA_KERNELS": str(folder / "Convs" / "emulated.so"),
           "PATH": __import__("os").environ["PATH"]}  # fmt: skip
    cp = f"{folder / 'build'}:{folder / 'src'}:{jcuda_jars()}/*"
    cmd = ["java", f"-Dorg.bytedeco.javacpp.cachedir={folder / 'javacpp'}", "-cp", cp, "Convs", "--data", "synthetic",
           "--device", "cuda", "--iters", "3", "--kernels", kernels, "--json"]  # fmt: skip
    r = subprocess.run(cmd, cwd=folder, capture_output=True, text=True, timeout=600, env=env, check=False)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["device"] == "cuda"
    assert ("cuDNN 9.0.0" in r.stderr) == (kernels == "vendor"), r.stderr
    want = _cpu(folder, "--iters", "3")
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-4)
