"""The own CUDA convolutions and GEMM (library.cu dd_tiled: register-tiled implicit GEMMs) without a GPU: each entry
of entries.cu, run on the CPU emulator with the Java CUDA device's launch geometry, agrees with the NumPy kernels on
small shapes with edge tiles (sizes not multiples of the 64 x 128 tile or of the 8-step, stride 2, padding,
dilation, groups, depthwise, 1x1 and 7x7); the filter gradient's split reduction gives the same bits twice and the
same sums for any number of slices; NVRTC compiles them with float4 shared-memory reads; the split count and its
planned scratch follow ops/conv.py's rule."""

from __future__ import annotations

import ctypes
import math
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from deepdsl.backends.cuda import launch, nvrtc, translation
from deepdsl.backends.cuda.launch import TILE_M, TILE_N
from deepdsl.ir import REGISTRY, GraphBuilder, InputDef, TensorType, Value
from deepdsl.memory import plan
from deepdsl.ops.conv import SPLIT_BLOCKS, SPLIT_MIN, filter_gradient_splits

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cuda_emulator import emulate  # noqa: E402

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ to run the kernels on the CPU")

ENTRIES = ("dd_k_gemm", "dd_k_conv2d", "dd_k_conv2d_backward_data", "dd_k_conv2d_backward_filter",
           "dd_k_conv2d_backward_filter_finish")  # fmt: skip

# (N, C, H, W, F, KH, KW, stride, pad, dilation, groups): every case has a tile edge somewhere
CASES = {
    "1x1": (2, 8, 5, 7, 12, 1, 1, (1, 1), (0, 0), (1, 1), 1),
    "3x3-stride2-pad": (2, 6, 9, 9, 10, 3, 3, (2, 2), (1, 1), (1, 1), 1),
    "7x7-stride2-pad3": (1, 3, 15, 13, 8, 7, 7, (2, 2), (3, 3), (1, 1), 1),
    "groups-dilation-unequal": (2, 6, 9, 10, 9, 3, 3, (1, 2), (2, 1), (2, 3), 3),
    "depthwise": (2, 4, 6, 6, 4, 3, 3, (1, 1), (1, 1), (1, 1), 4),
    "over-a-tile": (3, 5, 9, 9, 70, 3, 3, (1, 1), (1, 1), (1, 1), 1),  # 70 filters, 243 pixels, K = 45
    "1x1-stride2": (2, 16, 7, 7, 66, 1, 1, (2, 2), (0, 0), (1, 1), 2),
    # stride 2 and dilation 2: the pixels of odd phases get no tap at all, the even ones every tap
    "stride2-dilation2": (2, 4, 11, 10, 6, 3, 3, (2, 2), (2, 1), (2, 2), 1),
    "stride3-dilation2": (1, 3, 13, 11, 5, 4, 3, (3, 2), (2, 1), (2, 3), 1),
}


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    source = translation.library_source() + "\n" + translation.entries_source()
    return emulate(source, ENTRIES, tmp_path_factory.mktemp("own"))


def _run(lib: ctypes.CDLL, kernel: str, grid: tuple[int, int, int], block: tuple[int, int], *args: object) -> None:
    """Launch entry `kernel`: arrays as their pointers, ints in their slots (as cuLaunchKernel's parameters lie)."""
    slots = [a.ctypes.data if isinstance(a, np.ndarray) else (int(a) if a is not None else 0) for a in args]
    getattr(lib, f"run_{kernel}")(*grid, *block, (ctypes.c_void_p * len(slots))(*slots))


def _tiles(n: int, size: int) -> int:
    return -(-n // size)


def _attrs(stride: tuple, pad: tuple, dilation: tuple, groups: int) -> dict:
    return {"stride": stride, "pad": pad, "dilation": dilation, "groups": groups}


def _out_hw(h: int, w: int, kh: int, kw: int, stride: tuple, pad: tuple, dilation: tuple) -> tuple[int, int]:
    return ((h + 2 * pad[0] - (kh - 1) * dilation[0] - 1) // stride[0] + 1,
            (w + 2 * pad[1] - (kw - 1) * dilation[1] - 1) // stride[1] + 1)  # fmt: skip


def _geometry(case: tuple) -> tuple[list[int], dict, tuple[int, ...]]:
    n, c, h, w, f, kh, kw, stride, pad, dilation, groups = case
    oh, ow = _out_hw(h, w, kh, kw, stride, pad, dilation)
    sizes = [n, c, h, w, f, kh, kw, oh, ow, *stride, *pad, groups, *dilation]
    return sizes, _attrs(stride, pad, dilation, groups), (oh, ow)


def _random(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def _close(got: np.ndarray, want: np.ndarray) -> None:
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5 * max(1.0, float(np.abs(want).max())))


def _filter_gradient(lib: ctypes.CDLL, x: np.ndarray, g: np.ndarray, sizes: list[int], splits: int) -> np.ndarray:
    n, c, _, _, f, kh, kw, oh, ow = sizes[:9]
    groups = sizes[13]
    cols = c // groups * kh * kw
    dw = np.full((f, c // groups, kh, kw), np.nan, np.float32)  # NaN: an element the kernels miss shows
    ws = np.full(splits * dw.size, np.nan, np.float32) if splits > 1 else None
    grid = (_tiles(cols, TILE_N), _tiles(f // groups, TILE_M), groups * splits)
    _run(lib, "dd_k_conv2d_backward_filter", grid, (16, 16), dw, x, g, *sizes, ws, splits)
    if splits > 1:
        _run(lib, "dd_k_conv2d_backward_filter_finish", (3, 1, 1), (64, 1), dw, ws, dw.size, splits)
    return dw


@needs_gxx
@pytest.mark.parametrize("name", sorted(CASES))
def test_convolutions_agree_with_numpy(lib: ctypes.CDLL, name: str) -> None:
    case = CASES[name]
    sizes, a, (oh, ow) = _geometry(case)
    n, c, h, w, f, kh, kw = case[:7]
    groups = a["groups"]
    rng = np.random.default_rng(len(name))
    x, wt, g = _random(rng, n, c, h, w), _random(rng, f, c // groups, kh, kw), _random(rng, n, f, oh, ow)

    y = np.full((n, f, oh, ow), np.nan, np.float32)
    _run(lib, "dd_k_conv2d", (_tiles(n * oh * ow, TILE_N), _tiles(f // groups, TILE_M), groups), (16, 16), y, x, wt,
         *sizes)  # fmt: skip
    _close(y, REGISTRY["conv2d"].numpy((x, wt), a))

    dx = np.full(x.shape, np.nan, np.float32)
    sh, sw = a["stride"]  # a block z for each group and phase of the input pixels
    grid = (_tiles(n * _tiles(h, sh) * _tiles(w, sw), TILE_N), _tiles(c // groups, TILE_M), groups * sh * sw)
    _run(lib, "dd_k_conv2d_backward_data", grid, (16, 16), dx, g, wt, *sizes)
    _close(dx, REGISTRY["conv2d_backward_data"].numpy((g, wt), {**a, "in_shape": x.shape}))

    want = REGISTRY["conv2d_backward_filter"].numpy((x, g), {**a, "w_shape": wt.shape})
    for splits in (1, 3, 7):  # 7 slices of whole 8-steps: some slices are shorter, the last ones may be empty
        _close(_filter_gradient(lib, x, g, sizes, splits), want)


@needs_gxx
def test_split_filter_gradient_gives_the_same_bits_twice(lib: ctypes.CDLL) -> None:
    sizes, _, (oh, ow) = _geometry(CASES["over-a-tile"])
    rng = np.random.default_rng(7)
    x, g = _random(rng, *sizes[:4]), _random(rng, sizes[0], sizes[4], oh, ow)
    first, second = (_filter_gradient(lib, x, g, sizes, 5) for _ in range(2))
    assert first.tobytes() == second.tobytes()


@needs_gxx
@pytest.mark.parametrize(("m", "n", "k"), [(70, 130, 19), (5, 3, 1), (64, 128, 16)])
def test_gemm_agrees_with_numpy(lib: ctypes.CDLL, m: int, n: int, k: int) -> None:
    rng = np.random.default_rng(m + n + k)
    batch = 2
    for ta in (0, 1):
        for tb in (0, 1):
            a = _random(rng, batch, *((k, m) if ta else (m, k)))
            b = _random(rng, batch, *((n, k) if tb else (k, n)))
            c = np.full((batch, m, n), np.nan, np.float32)
            _run(lib, "dd_k_gemm", (_tiles(n, TILE_N), _tiles(m, TILE_M), batch), (16, 16), c, a, b, m, n, k, ta, tb)
            want = np.matmul(a.transpose(0, 2, 1) if ta else a, b.transpose(0, 2, 1) if tb else b)
            _close(c, want)


def _have_compiler() -> bool:
    try:
        nvrtc.compiler()
    except nvrtc.NoCudaCompiler:
        return False
    return True


@pytest.mark.skipif(not _have_compiler(), reason=f"no CUDA compiler: pip install '{nvrtc.PINNED_NVRTC}'")
def test_nvrtc_compiles_the_tiled_kernels_with_vector_shared_loads() -> None:
    text = nvrtc.ptx(translation.library_source() + "\n" + translation.entries_source(), "sm_90")
    for entry in ENTRIES:
        assert f".entry {entry}(" in text
    body = text[text.index(".entry dd_k_conv2d(") :]
    body = body[: body.index("\n}\n")]
    assert "ld.shared.v4.f32" in body  # the inner loop reads its operands four at a time
    assert body.count("bar.sync") <= 3  # one barrier a step (double buffering), not two


# ---- the split count and its scratch in the plan ----


def test_the_tile_and_split_constants_agree_in_cuda_python_and_java() -> None:
    """library.cu's tile, the launch geometry's (launch.py, ops/conv.py) and the Java CUDA device's are one."""
    import re

    from deepdsl.ops.conv import OWN_TILE

    lib = translation.library_source()
    cuda = tuple(int(re.search(rf"#define {d} (\d+)", lib)[1]) for d in ("DD_BM", "DD_BN", "DD_BK"))
    assert cuda == OWN_TILE == (TILE_M, TILE_N, launch.TILE_K)
    java = (Path(translation.__file__).parents[2] / "runtime" / "CudaMemory.java").read_text()
    ints = dict(re.findall(r"static final int (\w+) = (\d+);", java))
    assert (int(ints["TILE_M"]), int(ints["TILE_N"])) == OWN_TILE[:2]
    assert (int(ints["SPLIT_BLOCKS"]), int(ints["SPLIT_MIN"])) == (SPLIT_BLOCKS, SPLIT_MIN)


def test_split_count_fills_the_gpu_and_keeps_slices_long() -> None:
    # ResNet-50's first bottleneck at batch 64: one 64 x 128 tile of dW for a 1x1 64 -> 64, 200,704 pixels
    assert filter_gradient_splits(64, 64, 1, 64 * 56 * 56) == SPLIT_BLOCKS
    # stage 4's 3x3 512 -> 512: 8 x 36 tiles already; 2 slices make 576 blocks
    assert filter_gradient_splits(512, 512 * 9, 1, 64 * 7 * 7) == 2
    assert filter_gradient_splits(1024, 4608, 1, 64 * 7 * 7) == 1  # 16 x 36 tiles: enough blocks already
    assert filter_gradient_splits(16, 27, 1, SPLIT_MIN * 2 - 1) == 1  # too short to split
    for f, cols, groups, q in [(64, 64, 1, 200704), (6, 25, 1, 4608), (32, 9, 32, 10000), (512, 4608, 1, 3136)]:
        s = filter_gradient_splits(f, cols, groups, q)
        assert s == 1 or q // s >= SPLIT_MIN
        tiles = math.ceil(f / TILE_M) * math.ceil(cols / TILE_N) * groups
        assert s == 1 or tiles * (s - 1) < SPLIT_BLOCKS


def _filter_plan(limit: int | None) -> tuple:
    b = GraphBuilder("filter")
    x = b.add_input(InputDef(Value("x", TensorType((4, 6, 16, 16))), "x"))
    g = b.add_input(InputDef(Value("g", TensorType((4, 20, 16, 16))), "g"))
    b.output("dw", b.emit("conv2d_backward_filter", x, g, stride=(1, 1), pad=(1, 1), groups=1, w_shape=(20, 6, 3, 3)))
    p = plan(b.build(), limit)
    return p, translation.program(p)


def test_the_split_reduction_works_in_the_planned_workspace() -> None:
    p, prog = _filter_plan(None)
    splits = filter_gradient_splits(20, 54, 1, 4 * 16 * 16)
    assert splits == 4
    ws = next(iter(p.workspace.values()))
    assert ws.nbytes >= splits * 20 * 54 * 4  # the partial sums are planned: memcheck counts them
    main, finish = prog.launches
    assert main.grid == (1, 1, splits) and main.args[-1].offset == ws.offset == finish.args[-1].offset
    assert finish.finishes and finish.loop == "grid-stride" and finish.covers == 20 * 54
    assert f"dd_conv2d_backward_filter_finish(out, in0, 1080, {splits})" in prog.source


def test_without_planned_workspace_the_filter_gradient_does_not_split() -> None:
    _, prog = _filter_plan(0)  # --workspace-limit 0: the plan gives the statement none
    (only,) = prog.launches
    assert only.grid[2] == 1 and len(only.args) == 3
    assert "dd_conv2d_backward_filter(out, in0, in1, nullptr, 1, " in prog.source


# ---- a network whose filter gradients split, on the emulated driver and the Java CUDA device ----

SPLIT = """network SplitNet
const N = 2
const K = 3
input x : [N, 3, 16, 16]
label y : [N] classes K

def body(x) {
  a = relu(conv(x, 6, kernel=3, pad=1))
  c = relu(conv(a, 5, kernel=1))
  b = conv(c, 4, kernel=1, stride=2)
  return full(flatten(global_avg_pool(b)), K)
}

layer model = body
loss    = softmax_cross_entropy(model(x), y)
predict = model(x)

train { data = synthetic(seed=2) optimizer = sgd(lr=0.05, momentum=0.9) iterations = 3 seed = 1 }
"""


def _split_build():  # noqa: ANN202
    from deepdsl import api

    return api.build(api.compile_source(SPLIT, "split.ddsl", {}).program)


def test_the_split_network_splits_two_filter_gradients() -> None:
    prog = translation.program(_split_build().train_plan)
    finishes = [x for x in prog.launches if x.finishes]
    assert len(finishes) == 2  # the 3x3 and the first 1x1 (512 pixels: 2 slices); the strided 1x1 has 128
    assert all(x.op == "conv2d_backward_filter" for x in finishes)


@pytest.mark.slow  # the slow tier: the default suite's four-minute budget
@needs_gxx
def test_the_cuda_runner_with_own_kernels_agrees_with_numpy(tmp_path: Path) -> None:
    from cuda_emulator import EmulatedDriver

    from deepdsl.running import run_training

    build = _split_build()
    want = run_training(build, iters=3, data_flag="synthetic", device="cpu")
    got = run_training(build, iters=3, data_flag="synthetic", driver=EmulatedDriver(tmp_path), report=lambda _: None)
    assert got["device"] == "cuda"
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-4, atol=1e-6)
    again = run_training(build, iters=3, data_flag="synthetic", driver=EmulatedDriver(tmp_path), report=lambda _: None)
    assert again["losses"] == got["losses"]  # the split reductions: the same bits every run


@needs_gxx
@pytest.mark.slow  # javac of the runtime and the kernels emulated on the CPU: about a minute
def test_the_java_cuda_device_with_own_kernels_gives_the_numpy_runners_losses(tmp_path: Path) -> None:
    import json
    import subprocess

    from click.testing import CliRunner
    from cuda_emulator import TILED, fake_driver, kernel_names
    from java_env import javac, jcuda_jars

    from deepdsl.cli import cli
    from deepdsl.running import run_training

    if shutil.which("javac") is None:
        pytest.skip("no javac")
    (tmp_path / "split.ddsl").write_text(SPLIT)
    src = tmp_path / "src"
    r = CliRunner().invoke(cli, ["compile", str(tmp_path / "split.ddsl"), "-o", str(src), "--ptx", "--arch", "sm_90"])
    assert r.exit_code == 0, r.output
    javac(src, [*src.glob("*.java"), *(src / "deepdsl" / "runtime").glob("*.java")], tmp_path / "build")
    unit = (src / "SplitNet.cu").read_text()
    names = kernel_names(unit)
    (tmp_path / "SplitNet").mkdir()
    emulate(unit, names, tmp_path / "SplitNet", [k for k in names if k not in TILED])
    fake_driver(tmp_path / "fake")
    env = {"LD_LIBRARY_PATH": str(tmp_path / "fake"), "PATH": __import__("os").environ["PATH"],
           "DEEPDSL_FAKE_CUDA_KERNELS": str(tmp_path / "SplitNet" / "emulated.so")}  # fmt: skip
    cp = f"{tmp_path / 'build'}:{src}:{jcuda_jars()}/*"
    cmd = ["java", "-cp", cp, "SplitNet", "--data", "synthetic", "--device", "cuda", "--iters", "3", "--kernels", "own",
           "--json"]  # fmt: skip
    run = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env, check=False)
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout)
    assert got["device"] == "cuda"
    want = run_training(_split_build(), iters=3, data_flag="synthetic", device="cpu")
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-4)


@pytest.mark.slow  # the slow tier: the default suite's four-minute budget
@needs_gxx
def test_the_benchmark_script_compares_own_and_vendor_convolutions(tmp_path: Path) -> None:
    """scripts/bench_own_kernels.py's measurement on the emulator: our kernels against the stand-in cuDNN, one row
    per convolution shape with both times, the totals and their ratios (the times are the CPU's, not a GPU's)."""
    from cuda_emulator import EmulatedDriver, fake_vendor

    from deepdsl import api
    from deepdsl.backends.cuda.vendor import open_vendor

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    import bench_own_kernels as bench

    c = api.compile_source(SPLIT, "split.ddsl", {}, stop_at="plan")
    vendor = fake_vendor(tmp_path / "vendor")
    stand_ins = open_vendor("vendor", [vendor])
    result = bench.measure(c, lambda: EmulatedDriver(tmp_path / "own"),
                           lambda: EmulatedDriver(tmp_path / "vendor", vendor=stand_ins), 1)  # fmt: skip
    rows = result["rows"]
    ops = {r["op"] for r in rows}
    assert ops == {"conv2d", "conv2d_backward_data", "conv2d_backward_filter"}
    assert sum(r["count"] for r in rows if r["op"] == "conv2d") == 3
    assert all(r["own_ms"] > 0 and r["vendor_ms"] > 0 and r["ratio"] > 0 for r in rows)
    assert all(r["vendor"].startswith("cudnn") for r in rows), rows
    t = result["totals"]
    assert t["conv_ratio"] == pytest.approx(t["conv_own_ms"] / t["conv_vendor_ms"])
    assert t["launches_own_ms"] >= t["conv_own_ms"] > 0
    lines = bench.report(result, 10)
    assert lines[-1].startswith("the whole step") and len(lines) == 1 + len(rows) + 4
