"""cuDNN's convolution algorithms chosen by timing (`cudnnFind...AlgorithmEx`) without a GPU: the stand-in cuDNN
(fake_libcudnn.c) runs every algorithm of a call on the caller's buffers and gives each a fake time (a hash of the
call, the algorithm and the shapes, `fake_cudnn_time`) and a scratch size; the runner takes the fastest whose scratch
fits the workspace limit, once per shape, before any graph capture; `--deterministic` keeps cuDNN's heuristic
choice; the scratch the chosen algorithms need is what the runner allocates and reports. The Java CUDA device on
the stand-in driver chooses as the Python runner does."""

from __future__ import annotations

import ctypes
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from cuda_emulator import EmulatedDriver, fake_vendor, same_bits
from helpers import POOLED, ROOT, SMALL
from test_vendor import CONV_OPS, CONVS, ONE_BY_ONE, _conv_case

from deepdsl import api
from deepdsl.backends.cuda import runner as gpu_runner
from deepdsl.backends.cuda.cudnn import ALGORITHMS
from deepdsl.backends.cuda.graphs import CaptureFailed
from deepdsl.backends.cuda.vendor import open_vendor
from deepdsl.cli import cli
from deepdsl.errors import DslProgramError
from deepdsl.ir import REGISTRY
from deepdsl.running import run_training

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("g++") is None, reason="no gcc/g++")

KIND = {"conv2d": 0, "conv2d_backward_data": 1, "conv2d_backward_filter": 2}
CALL = {"conv2d": "cudnnConvolutionForward", "conv2d_backward_data": "cudnnConvolutionBackwardData",
        "conv2d_backward_filter": "cudnnConvolutionBackwardFilter"}  # fmt: skip
IMPRECISE = ("FFT", "FFT_TILING", "WINOGRAD_NONFUSED")
NONDETERMINISTIC = {(1, 0), (2, 0), (2, 3)}  # (kind, algo): cuDNN's data ALGO_0, filter ALGO_0 and ALGO_3


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fake_vendor(tmp_path_factory.mktemp("find"))


@pytest.fixture(scope="module")
def gpu(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the emulated drivers build their kernels: a folder per translation unit (a runner's steps: train and
    infer; a training run's: train, infer and test), shared by the tests, each built once (a library loaded once
    stays loaded, so a folder never holds two units)."""
    return tmp_path_factory.mktemp("gpu")


def _cudnn(folder: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(folder / "libcudnn.so.9"))
    lib.fake_cudnn_time.restype = ctypes.c_float
    return lib


def _table(folder: Path, op: str, fact: object) -> list[tuple[int, float, int]]:
    """What the stand-in says of each algorithm of `fact` as statement `op`: (algo, fake time, scratch bytes), from its
    own formula (fake_libcudnn.c: algorithm_bytes and fake_cudnn_time), computed here from the shapes."""
    c = fact if op == "conv2d" else fact.conv  # type: ignore[attr-defined]
    lib, kind = _cudnn(folder), KIND[op]
    x = (c.n, c.c, c.h, c.w)
    columns = (c.c // c.groups) * c.kh * c.kw * c.oh * c.ow * 4
    out = []
    for algo in range(len(ALGORITHMS[CALL[op]])):
        time = lib.fake_cudnn_time(kind, algo, *x, c.f, c.kh, c.kw)
        out.append((algo, time, algo * columns if algo <= 1 else columns * algo // 2))
    return out


def _fastest(table: list[tuple[int, float, int]], op: str, limit: int) -> tuple[int, int]:
    """The fastest precise algorithm within `limit` bytes: (algo, scratch bytes)."""
    names = ALGORITHMS[CALL[op]]
    fits = [(t, a, m) for a, t, m in table if m <= limit and names[a] not in IMPRECISE]
    _, algo, memory = min(fits)
    return algo, memory


def _found(folder: Path, op: str, k: int, limit: int) -> tuple[object, np.ndarray]:
    """Convolution k of CONVS as `op` prepared by Find within `limit` bytes, and its output computed with it."""
    vendor = open_vendor("vendor", [folder])
    assert vendor.cudnn is not None
    fact, a, b, out, attrs = _conv_case(k, op)
    trial = np.zeros(max(limit, 4), np.uint8)
    asked: list[int] = []
    conv = vendor.cudnn.prepare(fact, limit, find=(out.ctypes.data, a.ctypes.data, b.ctypes.data,
                                                    lambda n: asked.append(n) or trial.ctypes.data))  # fmt: skip
    assert all(0 < n <= limit for n in asked)  # a scratch for Find only where some algorithm needs one
    assert np.isnan(out).all()  # Find leaves arbitrary values (the stand-in: NaN) in the output, not the result
    ws = np.zeros(max(conv.workspace, 4), np.uint8)
    vendor.cudnn.convolve(conv, out.ctypes.data, a.ctypes.data, b.ctypes.data, ws.ctypes.data)
    np.testing.assert_allclose(out, REGISTRY[op].numpy((a, b), attrs), rtol=1e-4, atol=1e-5)
    vendor.close()
    return conv, out


@pytest.mark.parametrize("op", CONV_OPS)
def test_find_takes_the_fastest_algorithm_that_fits(folder: Path, op: str) -> None:
    """Within a limit that every algorithm fits, Find's choice is the stand-in's fastest precise algorithm (by its
    fake times), whose output is NumPy's; on some of these shapes that is not the heuristic's first choice."""
    differs = False
    for k in range(len(CONVS)):
        fact = _conv_case(k, op)[0]
        table = _table(folder, op, fact)
        conv, _ = _found(folder, op, k, 1 << 24)
        assert (conv.algo, conv.workspace) == _fastest(table, op, 1 << 24)  # type: ignore[attr-defined]
        assert conv.time_ms == pytest.approx(dict((a, t) for a, t, _ in table)[conv.algo])  # type: ignore[attr-defined]
        heuristic = open_vendor("vendor", [folder])
        assert heuristic.cudnn is not None
        differs |= heuristic.cudnn.prepare(fact, 1 << 24).algo != conv.algo  # type: ignore[attr-defined]
        heuristic.close()
    assert differs


def test_the_limit_excludes_algorithms_that_need_more(folder: Path) -> None:
    """Where the fastest algorithm needs scratch, a limit just under its need gives the fastest of the rest, and a
    limit of 0 the one algorithm without scratch; Find is never given more than the limit."""
    seen = 0
    for op in CONV_OPS:
        for k in range(len(CONVS)):
            table = _table(folder, op, _conv_case(k, op)[0])
            algo, need = _fastest(table, op, 1 << 24)
            if need == 0:
                continue
            seen += 1
            conv, _ = _found(folder, op, k, need - 1)
            assert conv.algo != algo and conv.workspace <= need - 1  # type: ignore[attr-defined]
            assert (conv.algo, conv.workspace) == _fastest(table, op, need - 1)  # type: ignore[attr-defined]
            assert _found(folder, op, k, 0)[0].algo == 0  # type: ignore[attr-defined]
    assert seen >= 3


def test_without_the_flag_find_may_choose_a_nondeterministic_algorithm(folder: Path) -> None:
    """cuDNN's atomics-based gradients (data ALGO_0, filter ALGO_0 and ALGO_3) are candidates for Find: on these shapes
    one of them is the fastest and is taken; under --deterministic (the heuristic) none is taken where another
    fits."""
    taken = set()
    for op in ("conv2d_backward_data", "conv2d_backward_filter"):
        for k in range(len(CONVS)):
            conv, _ = _found(folder, op, k, 1 << 24)
            taken.add((KIND[op], conv.algo))  # type: ignore[attr-defined]
            heuristic = open_vendor("vendor", [folder])
            assert heuristic.cudnn is not None
            assert (KIND[op], heuristic.cudnn.prepare(_conv_case(k, op)[0], 1 << 24).algo) not in NONDETERMINISTIC
            heuristic.close()
    assert taken & NONDETERMINISTIC


def _calls(folder: Path) -> tuple[int, int]:
    """(Find calls, convolutions computed) of the stand-in cuDNN in this process."""
    lib = _cudnn(folder)
    return int(lib.fake_cudnn_find_calls()), int(lib.fake_cudnn_calls())


def _runner(source: str, path: Path, folder: Path, deterministic: bool, limit: int | None = None):  # noqa: ANN202
    build = api.build(api.compile_source(source, "n.ddsl", {}).program, api.Options(workspace_limit=limit))
    arrays = {p.value.name: np.zeros(p.value.type.shape, np.float32) for p in build.train_plan.graph.params}
    driver = EmulatedDriver(path, vendor=open_vendor("vendor", [folder]))
    return build, gpu_runner.GpuRunner(driver, build.train_plan, build.infer_plan, arrays,
                                       deterministic=deterministic)  # fmt: skip


def test_the_runner_finds_once_per_shape_and_deterministic_keeps_the_heuristic(gpu: Path, folder: Path) -> None:
    """The runner's convolutions are found at its start (one Find per shape and call, however many launches share
    it), each the fastest within the limit; under deterministic=True no Find runs and each convolution is the
    heuristic's (the stand-in's first proposal, an im2col one), as before."""
    before = _calls(folder)[0]
    build, found = _runner(POOLED, gpu / "pooled-runner", folder, deterministic=False)
    finds = _calls(folder)[0] - before
    shapes = {(c["call"], c["shape"]) for c in found.convolutions}
    assert finds == len(shapes) == len(found.convolutions) >= 5  # 2 forward (+ inference's, the same), 1 data, 2 filter
    for c in found.convolutions:
        assert c["time_ms"] is not None and c["algorithm"] in ALGORITHMS[c["call"]]
    found.close()
    before = _calls(folder)[0]
    _, fixed = _runner(POOLED, gpu / "pooled-runner", folder, deterministic=True)
    assert _calls(folder)[0] == before
    assert {c["algorithm"] for c in fixed.convolutions} == {"IMPLICIT_PRECOMP_GEMM", "ALGO_1"}
    assert all(c["time_ms"] is None for c in fixed.convolutions)
    assert {(c["call"], c["shape"]) for c in fixed.convolutions} == shapes
    assert [c["algorithm"] for c in fixed.convolutions] != [c["algorithm"] for c in found.convolutions]
    fixed.close()


def test_deterministic_runs_repeat_bit_for_bit_and_agree_with_numpy(tmp_path: Path, gpu: Path, folder: Path) -> None:
    build = api.build(api.compile_source(POOLED, "pooled.ddsl", {}).program, api.Options(deterministic=True))
    want = run_training(build, iters=3, data_flag="synthetic", device="cpu")
    runs = []
    for k in range(2):
        driver = EmulatedDriver(gpu / "pooled-run", vendor=open_vendor("vendor", [folder]))
        got = run_training(build, iters=3, data_flag="synthetic", driver=driver, save=str(tmp_path / f"{k}.npz"))
        np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-4, atol=1e-6)
        assert got["gpu_deterministic"] is True
        runs.append((got["losses"], dict(np.load(tmp_path / f"{k}.npz"))))
    assert runs[0][0] == runs[1][0] and same_bits(runs[0][1], runs[1][1])


@pytest.mark.parametrize("limit", [None, 0])
def test_the_workspace_reported_is_what_is_allocated(gpu: Path, folder: Path, limit: int | None) -> None:
    """The shared scratch is the most any chosen algorithm needs beyond its statement's planned workspace, allocated
    once; Find's temporary scratch is freed before it; the driver then holds exactly the arena, the tensors and that
    scratch (the planned GPU bytes), and --json says the scratch, each convolution's algorithm and its bytes."""
    build, runner = _runner(ONE_BY_ONE, gpu / f"one-runner-{limit}", folder, deterministic=False, limit=limit)
    driver = runner.driver
    beyond = [c["workspace_bytes"] for c in runner.convolutions if c["scratch"]]
    assert runner.vendor_scratch_bytes == max(beyond, default=0)
    assert (runner.vendor_scratch_bytes > 0) == (limit is None)
    held = sum(b.nbytes for b in driver.blocks)
    # the multi-tensor launch's table (the optimiser's updates, runner.table_bytes) is held beside them
    assert held == max(runner.arena_bytes, 4) + runner.tensor_bytes + runner.table_bytes + runner.vendor_scratch_bytes
    assert runner.planned_bytes == (runner.arena_bytes + runner.tensor_bytes + runner.table_bytes
                                    + runner.vendor_scratch_bytes)  # fmt: skip
    runner.close()
    driver = EmulatedDriver(gpu / f"one-run-{limit}", vendor=open_vendor("vendor", [folder]))
    got = run_training(build, iters=2, data_flag="synthetic", driver=driver)
    assert got["gpu_memory_bytes"] == got["gpu_planned_bytes"]  # the emulator counts bytes
    assert got["gpu_vendor_scratch_bytes"] == max((c["workspace_bytes"] for c in got["gpu_convolutions"]
                                                   if c["scratch"]), default=0)  # fmt: skip
    assert got["gpu_deterministic"] is False
    assert {c["call"] for c in got["gpu_convolutions"]} == set(CALL.values()) - {"cudnnConvolutionBackwardData"}


def test_the_emulated_driver_refuses_a_synchronising_call_inside_a_capture(tmp_path: Path, folder: Path) -> None:
    """A synchronisation while the stream captures is refused and invalidates the capture, as the driver does; so is
    cuDNN's Find (which synchronises): inside a capture it fails and the capture with it."""
    driver = EmulatedDriver(tmp_path, vendor=open_vendor("vendor", [folder]))
    driver.synchronize()  # outside a capture: fine
    with pytest.raises(CaptureFailed, match="cuStreamSynchronize while capturing"):
        driver.capture(driver.synchronize)
    fact, a, b, out, _ = _conv_case(0)
    trial = np.zeros(1 << 20, np.uint8)
    find = (out.ctypes.data, a.ctypes.data, b.ctypes.data, lambda n: trial.ctypes.data)
    assert driver.vendor.cudnn is not None
    with pytest.raises(CaptureFailed, match="CUDNN_STATUS_EXECUTION_FAILED"):
        driver.capture(lambda: driver.vendor.cudnn.prepare(fact, 1 << 20, find=find))  # type: ignore[union-attr]
    swallowed: list[str] = []

    def careless() -> None:  # a caller that drops the error: the capture is still invalid
        try:
            driver.vendor.cudnn.prepare(fact, 1 << 20, find=find)  # type: ignore[union-attr]
        except DslProgramError as err:
            swallowed.append(err.message)

    with pytest.raises(CaptureFailed, match="CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"):
        driver.capture(careless)
    assert swallowed
    assert driver.vendor.cudnn.prepare(fact, 1 << 20, find=find).time_ms is not None  # after it: Find runs
    driver.close()


def test_find_never_runs_inside_the_captured_step(gpu: Path, folder: Path) -> None:
    """Training on the emulated driver with the graph on: every Find runs at the runner's start, none in the capture
    (which would fail it, as the test above shows); the graph is on and replays the step."""
    build = api.build(api.compile_source(POOLED, "pooled.ddsl", {}).program)
    driver = EmulatedDriver(gpu / "pooled-run", vendor=open_vendor("vendor", [folder]))
    finds: list[int] = []
    capture = driver.capture

    def watched(issue):  # noqa: ANN001, ANN202
        finds.append(_calls(folder)[0])
        graph = capture(issue)
        finds.append(_calls(folder)[0])
        return graph

    driver.capture = watched  # type: ignore[method-assign]
    before = _calls(folder)[0]
    got = run_training(build, iters=4, data_flag="synthetic", driver=driver)
    assert got["gpu_graph"] == "on" and driver.captures == 1 and driver.replays == 3
    assert finds[0] == finds[1] > before  # Find ran before the capture, and not during it
    assert _calls(folder)[0] == finds[1]


def test_deterministic_on_the_command_line(tmp_path: Path, gpu: Path, folder: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    from test_vendor import _emulated

    _emulated(monkeypatch, gpu / "cli", [folder])
    net = tmp_path / "pooled.ddsl"
    net.write_text(POOLED)
    out = {}
    for flags in ((), ("--deterministic",)):
        r = CliRunner().invoke(cli, ["run", str(net), "--iters", "1", "--device", "cuda", "--kernels", "vendor",
                                     "--json", *flags])  # fmt: skip
        assert r.exit_code == 0, r.output
        out[flags] = json.loads(r.output)
    assert out[()]["gpu_deterministic"] is False and out[("--deterministic",)]["gpu_deterministic"] is True
    assert {c["algorithm"] for c in out[("--deterministic",)]["gpu_convolutions"]} == {"IMPLICIT_PRECOMP_GEMM",
                                                                                        "ALGO_1"}  # fmt: skip
    r = CliRunner().invoke(cli, ["run", str(ROOT / "networks" / "mlp.ddsl"), "--deterministic", "--iters", "1",
                                 "--set", "N=4", "--data", "synthetic", "--device", "cpu"])  # fmt: skip
    assert r.exit_code == 0, r.output  # meaningless on the CPU, and harmless


def test_memcheck_says_the_scratch_the_gpu_may_add(tmp_path: Path) -> None:
    """memcheck cannot know which algorithms cuDNN will choose, but says the most its shared scratch can take (the
    workspace limit, where the step has convolutions) and the GPU peak with it."""
    net = tmp_path / "small.ddsl"
    net.write_text(SMALL)
    r = CliRunner().invoke(cli, ["memcheck", str(net), "--json", "--workspace-limit", "64MiB"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.output)
    assert got["gpu_scratch_limit_bytes"] == 64 << 20
    assert got["gpu_peak_bytes"] == got["peak_bytes"] + (64 << 20) + got["gpu_table_bytes"]  # the updates' tables
    r = CliRunner().invoke(cli, ["memcheck", str(ROOT / "networks" / "mlp.ddsl"), "--json"])
    got = json.loads(r.output)
    assert got["gpu_scratch_limit_bytes"] == 0  # no convolution
    assert got["gpu_peak_bytes"] == got["peak_bytes"] + got["gpu_table_bytes"]
    r = CliRunner().invoke(cli, ["memcheck", str(net)])
    assert "cuDNN scratch" in r.output and "1.00 GiB" in r.output


def test_the_stand_in_driver_refuses_a_synchronisation_inside_a_capture_and_drops_the_capture(tmp_path: Path) -> None:
    """fake_libcuda.c (the Java device's driver): cuStreamSynchronize on a capturing stream is
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, and the capture then ends in CUDA_ERROR_STREAM_CAPTURE_INVALIDATED with no
    graph, as the driver does; outside a capture it succeeds, and a capture without it gives a graph. In a process of
    its own: a libcuda.so.1 loaded here would be found by the stand-in libraries of later tests."""
    import subprocess
    import sys

    from cuda_emulator import fake_driver

    check = f"""
import ctypes
lib = ctypes.CDLL({str(fake_driver(tmp_path) / "libcuda.so.1")!r})
stream, graph = ctypes.c_void_p(), ctypes.c_void_p()
assert lib.cuStreamCreate(ctypes.byref(stream), 0) == 0
assert lib.cuStreamSynchronize(stream) == 0
assert lib.cuStreamBeginCapture_v2(stream, 0) == 0
assert lib.cuStreamSynchronize(stream) == 900
assert lib.cuStreamEndCapture(stream, ctypes.byref(graph)) == 901 and not graph.value
assert lib.cuStreamBeginCapture_v2(stream, 0) == 0
assert lib.cuStreamEndCapture(stream, ctypes.byref(graph)) == 0 and graph.value
assert lib.cuGraphDestroy(graph) == 0 and lib.cuStreamDestroy_v2(stream) == 0
"""
    r = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr


# ---- on a real GPU (scripts/gpu_check.sh runs `pytest -m gpu`) ----


@pytest.mark.gpu
def test_on_a_gpu_find_times_every_convolution_before_the_capture(tmp_path: Path) -> None:
    """LeNet's convolutions through the real cuDNN: each found by timing (a time per convolution), the graph on (so
    no Find ran inside the capture, which would have broken it), the losses NumPy's; the shared scratch is the most a
    chosen algorithm needs beyond its planned workspace. Under --deterministic, two runs give the same bits."""
    from test_gpu_runner import _close, _losses, _needs_pycuda, _real_gpu

    _needs_pycuda()  # before LeNet's build
    lenet = api.compile_file(ROOT / "networks" / "lenet.ddsl", {"N": 16}).program
    build = api.build(lenet)
    got = run_training(build, iters=5, data_flag="synthetic", device="cuda", driver=_real_gpu("vendor"))
    _close(got["losses"], _losses(build, 5))
    assert got["gpu_graph"] == "on" and got["gpu_deterministic"] is False
    convolutions = got["gpu_convolutions"]
    assert len(convolutions) >= 5 and all(c["time_ms"] is not None and c["time_ms"] >= 0 for c in convolutions)
    assert got["gpu_vendor_scratch_bytes"] >= max((c["workspace_bytes"] for c in convolutions if c["scratch"]),
                                                  default=0)  # fmt: skip
    fixed = api.build(lenet, api.Options(deterministic=True))
    runs = []
    for k in range(2):
        saved = tmp_path / f"{k}.npz"
        out = run_training(fixed, iters=5, data_flag="synthetic", device="cuda", driver=_real_gpu("vendor"),
                           save=str(saved))  # fmt: skip
        assert all(c["time_ms"] is None for c in out["gpu_convolutions"])
        runs.append((out["losses"], dict(np.load(saved))))
    assert runs[0][0] == runs[1][0] and same_bits(runs[0][1], runs[1][1])


def test_compile_deterministic_sets_the_java_programs_default(tmp_path: Path) -> None:
    net = tmp_path / "small.ddsl"
    net.write_text(SMALL)
    for flags, line in (((), False), (("--deterministic",), True)):
        out = tmp_path / str(line)
        r = CliRunner().invoke(cli, ["compile", str(net), "-o", str(out), *flags])
        assert r.exit_code == 0, r.output
        assert (".deterministic(true)" in (out / "Small.java").read_text()) == line
