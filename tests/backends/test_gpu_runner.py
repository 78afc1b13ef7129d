"""The GPU runner (`deepdsl run --device cuda`): its launch program checked on the CPU with the kernels compiled by
g++ (tests/backends/cuda_emulator.py), its messages where PyCUDA or a GPU is missing, and, marked `gpu`, the
same checks through PyCUDA on a real GPU (scripts/gpu_check.sh runs those)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from cuda_emulator import EmulatedDriver, same_bits
from helpers import NORMED, POOLED, ROOT, SMALL

from deepdsl import api
from deepdsl.backends.cuda import drivers
from deepdsl.backends.cuda import runner as gpu_runner
from deepdsl.cli import cli
from deepdsl.data.named import fields_of, load_samples
from deepdsl.devices import open_device
from deepdsl.errors import DslProgramError
from deepdsl.running import evaluate, predict, run_training
from deepdsl.trainer import Trainer

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ to run the kernels on the CPU")

TINY = """network Tiny
const N = 4
input x : [N, 3, 8, 8]
label y : [N] classes 10
layer cv = conv(6, kernel=3, pad=1)
def block(x) {
  return relu(batch_norm(conv(x, 6, kernel=3, pad=1)) + x)
}
layer res = block
layer fc = full(10)
net = fc o flatten o max_pool(2, stride=2) o res o relu o cv
loss = softmax_cross_entropy(net(x), y)
predict = net(x)
train { data = synthetic(seed=2) optimizer = sgd(lr=0.05, momentum=0.9) iterations = 3 seed = 1 }
"""


def _build(text: str, name: str, sets: dict | None = None) -> api.Build:
    return api.build(api.compile_source(text, name, sets or {}).program)


def _losses(build: api.Build, iters: int, driver=None) -> dict:  # noqa: ANN001
    return run_training(build, iters=iters, data_flag="synthetic", device="cpu", driver=driver)


def _close(a: list[float], b: list[float], rtol: float = 1e-4) -> None:
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=1e-6)


@needs_gxx
@pytest.mark.parametrize("case", [pytest.param("tiny", marks=pytest.mark.slow), "small", "regression"])  # tiny: 2.4 s
def test_runner_agrees_with_numpy_on_the_cpu(case: str, tmp_path: Path) -> None:
    """The GPU runner's whole training run (arena offsets, tensors, in-place updates, copies, the test program for
    the test loss and accuracy) with the kernels on the CPU gives the NumPy runner's losses and accuracy; the
    regression network's second input `t` is read from the data by name there too."""
    if case == "regression":
        build = api.build(api.compile_file(ROOT / "networks" / "regression.ddsl", {"N": 4}).program)
    else:
        build = _build(TINY if case == "tiny" else SMALL, f"{case}.ddsl")
    iters = 3
    want = _losses(build, iters)
    driver = EmulatedDriver(tmp_path)
    got = _losses(build, iters, driver)
    assert got["device"] == "cuda"
    assert driver.launches > 0
    _close(got["losses"], want["losses"])
    assert got["test_loss"] == pytest.approx(want["test_loss"], rel=1e-4)
    assert got.get("test_accuracy") == pytest.approx(want.get("test_accuracy"))
    assert got["gpu_memory_bytes"] == got["gpu_planned_bytes"] > got["peak_bytes"] > 0  # the stand-in counts bytes


@pytest.mark.slow  # 4 s (the default suite's four minutes)
@needs_gxx
def test_parameters_move_between_host_and_gpu(tmp_path: Path) -> None:
    """Saving after GPU steps writes the GPU's parameters; loading sends them to the GPU: save -> load ->
    continue on the GPU equals an uninterrupted run on the NumPy runner."""
    build = _build(TINY, "tiny.ddsl")
    whole = run_training(build, iters=4, device="cpu")["losses"]
    first = run_training(build, iters=2, device="cpu", save=str(tmp_path / "a.npz"),
                         driver=EmulatedDriver(tmp_path / "1"))  # fmt: skip
    rest = run_training(build, iters=2, device="cpu", load=str(tmp_path / "a.npz"),
                        driver=EmulatedDriver(tmp_path / "2"))  # fmt: skip
    _close(first["losses"] + rest["losses"], whole)


@needs_gxx
def test_a_plan_larger_than_the_gpu_is_a_message_with_the_numbers(tmp_path: Path) -> None:
    build = _build(TINY, "tiny.ddsl")
    cfg = build.program.train
    data = load_samples(cfg.data[0], dict(cfg.data[1]), fields_of(build.program.graph.inputs), cfg.seed)
    trainer = Trainer(build, data)
    with pytest.raises(DslProgramError) as err:
        trainer.use_gpu(EmulatedDriver(tmp_path, capacity=10_000))
    text = err.value.message
    assert "10,000 free" in text and "arena" in text and "--remat" in text


def test_cuda_without_pycuda_is_a_clear_message(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(drivers, "pycuda_available", lambda: False)
    with pytest.raises(DslProgramError, match=r"needs PyCUDA.*pip install 'deepdsl\[gpu\]'"):
        drivers.PyCudaDriver()


def test_auto_says_why_it_runs_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    import deepdsl.devices as devices

    monkeypatch.setattr(devices, "pycuda_available", lambda: False)
    driver, line, why = open_device("auto")  # a CPU install (no gpu extra): nothing about CUDA on every command
    assert driver is None and line == "cpu (NumPy reference runner)" and why is None
    driver, line, why = open_device("auto", double=True)
    assert driver is None and why is None  # --float64 asks for the CPU (its runner): nothing about CUDA
    assert open_device("cpu") == (None, "cpu (NumPy reference runner)", None)  # asked for: nothing about CUDA
    lines: list[str] = []
    run_training(_build(TINY, "tiny.ddsl"), iters=1, device="auto", report=lines.append)
    assert lines[0].startswith("device: cpu (NumPy reference runner)  network Tiny") and "CUDA" not in "".join(lines)
    lines.clear()
    run_training(_build(TINY, "tiny.ddsl"), iters=1, device="cpu", report=lines.append)
    assert lines[0].startswith("device: cpu (NumPy reference runner)  network") and "CUDA" not in "".join(lines)
    with pytest.raises(DslProgramError, match="float64"):
        open_device("cuda", double=True)


def test_run_device_cuda_on_a_machine_without_it_exits_1(monkeypatch: pytest.MonkeyPatch) -> None:
    if drivers.pycuda_available():
        pytest.skip("PyCUDA is installed here: --device cuda may well work")
    result = CliRunner().invoke(cli, ["run", str(ROOT / "networks" / "mlp.ddsl"), "--device", "cuda", "--iters", "1"])
    assert result.exit_code == 1
    assert "PyCUDA" in result.output and "Traceback" not in result.output
    mlp = str(ROOT / "networks" / "mlp.ddsl")
    auto = CliRunner().invoke(cli, ["run", mlp, "--iters", "1", "--data", "synthetic", "--json"])
    assert auto.exit_code == 0 and json.loads(auto.output.strip().splitlines()[-1])["device"] == "cpu"


# ---- on a real GPU (scripts/gpu_check.sh) ----


def _needs_pycuda() -> None:
    """Skips a GPU test where PyCUDA is missing; called first, so that such a machine skips it before the NumPy
    runner's reference run and the build (LeNet's: seconds of the default suite, for a test that then skips)."""
    if not drivers.pycuda_available():
        pytest.skip("PyCUDA is not installed")


def _real_gpu(kernels: str = "own"):  # noqa: ANN202
    _needs_pycuda()
    try:
        return drivers.PyCudaDriver(kernels)
    except DslProgramError as err:
        pytest.skip(err.message)


@pytest.mark.gpu
@pytest.mark.parametrize("kernels", ["own", "vendor"])
@pytest.mark.parametrize("case", ["mlp", "lenet", "tiny", "small", "pooled", "normed"])
def test_pycuda_runner_agrees_with_numpy(case: str, kernels: str) -> None:
    """5 iterations on the GPU, with our kernels and with cuBLAS and cuDNN (GEMMs; convolutions and their gradients,
    pooling, softmax, LRN), give the NumPy runner's losses (1e-4 relative), and the GPU memory the runner took is the
    plan's: arena plus tensors, to within the driver's allocation granularity (and the libraries' own workspace)."""
    _needs_pycuda()
    if case in ("mlp", "lenet"):
        build = api.build(api.compile_file(ROOT / "networks" / f"{case}.ddsl", {"N": 16}).program)
    else:
        build = _build({"tiny": TINY, "small": SMALL, "pooled": POOLED, "normed": NORMED}[case], f"{case}.ddsl")
    want = _losses(build, 5)
    driver = _real_gpu(kernels)
    assert (driver.vendor.cublas is not None) == (kernels == "vendor")
    got = run_training(build, iters=5, data_flag="synthetic", device="cuda", driver=driver)
    _close(got["losses"], want["losses"])
    # the driver hands out memory in 2 MiB pages, and the module's code takes some: the measured bytes are the
    # planned ones to within a page per allocation and a few MiB. Below by up to a page: the driver keeps pages an
    # earlier test of this process freed and puts small allocations there (seen on the H200 with cuBLAS and cuDNN
    # loaded: a 60 KB plan measured 0 bytes)
    allocations = 1 + len(build.program.graph.params) + 64
    page = 2 << 20
    assert got["gpu_planned_bytes"] - page <= got["gpu_memory_bytes"] <= got["gpu_planned_bytes"] + page * allocations


@pytest.mark.gpu
@pytest.mark.parametrize("kernels", ["own", "vendor"])
def test_pycuda_graph_replays_the_train_step_bit_for_bit(kernels: str, tmp_path: Path) -> None:
    """5 steps of LeNet on the GPU with the train step as a CUDA graph (captured through libcuda at the second step,
    cuBLAS and cuDNN on the captured stream) give the losses and parameters of the run without it, bit for bit (cuDNN's
    deterministic algorithms: the fastest found by timing may differ from run to run, or use atomics)."""
    _needs_pycuda()
    build = api.build(api.compile_file(ROOT / "networks" / "lenet.ddsl", {"N": 16}).program,
                      api.Options(deterministic=True))  # fmt: skip
    runs = []
    for graphs in (True, False):
        lines: list[str] = []
        saved = tmp_path / f"graph_{graphs}.npz"
        got = run_training(build, iters=5, data_flag="synthetic", device="cuda", driver=_real_gpu(kernels),
                           graphs=graphs, report=lines.append, save=str(saved))  # fmt: skip
        runs.append((got, dict(np.load(saved)), lines))
    (on, on_params, on_lines), (off, off_params, off_lines) = runs
    assert on["gpu_graph"] == "on" and "; graph: on)" in on_lines[0], on_lines
    assert off["gpu_graph"] == "off (--no-graph)" and "; graph: off (--no-graph))" in off_lines[0]
    assert on["losses"] == off["losses"] and same_bits(on_params, off_params)


@needs_gxx
def test_a_kernel_never_overwrites_a_scalar_its_other_threads_still_read(tmp_path: Path) -> None:
    """a = x * sum(x) and c = -a share a loop; the plan may put c where sum(x) was (it dies at a), so the loop
    may not be one kernel: thread 0 would write c[0] over the sum the others still read."""
    from deepdsl.ir import GraphBuilder, InputDef, TensorType, Value
    from deepdsl.memory import plan
    from deepdsl.passes.fuse import share_loops

    b = GraphBuilder("T")
    x = b.add_input(InputDef(Value("x", TensorType((8,))), "input"))
    a = b.emit("scale_by", x, b.emit("sum", x))
    b.output("a", a)
    b.output("loss", b.emit("neg", a))
    runner = gpu_runner.GpuRunner(EmulatedDriver(tmp_path), plan(share_loops(b.build())), None, {})
    xs = np.arange(1, 9, dtype=np.float32)
    out, _ = runner.run("train", {"x": xs})
    np.testing.assert_array_equal(out["a"], xs * xs.sum())
    np.testing.assert_array_equal(out["loss"], -xs * xs.sum())


@needs_gxx
def test_auto_falls_back_to_the_cpu_when_the_gpu_cannot_take_the_plan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import deepdsl.running as running

    small = EmulatedDriver(tmp_path, capacity=10_000)
    monkeypatch.setattr(
        running,
        "open_device",
        lambda device, double=False, kernels="auto", tf32=False: (small, "cuda (a small GPU)", None),
    )
    lines: list[str] = []
    got = run_training(_build(TINY, "tiny.ddsl"), iters=1, device="auto", report=lines.append)
    assert got["device"] == "cpu" and lines[0].startswith("CUDA not used: the plan needs")
    assert lines[1].startswith("device: cpu (NumPy reference runner)  network")
    with pytest.raises(DslProgramError, match="10,000 free"):
        run_training(_build(TINY, "tiny.ddsl"), iters=1, device="cuda")


# a tensor-function mean: the vectoriser makes it sum_axes with the 1 / D scale as its epilogue
MEAN = """network Mean
const N = 4
input x : [N, 3, 4, 4]
label y : [N] classes 10
tensor centre(x[B, D]) -> [n, d] {
  param g[D] = constant(1)
  mu[n] = sum[d] x[n, d] / D
  return g[d] * (x[n, d] - mu[n])
}
layer fc = full(10)
net = fc o centre o flatten
loss = softmax_cross_entropy(net(x), y)
train { data = synthetic(seed=2) optimizer = sgd(lr=0.05) iterations = 3 seed = 1 }
"""


@needs_gxx
def test_a_reduction_keeps_its_epilogue_on_the_gpu(tmp_path: Path) -> None:
    """sum_axes with an epilogue (the mean's scale) is one kernel on the CUDA device too, the epilogue applied."""
    build = _build(MEAN, "mean.ddsl")
    assert any(s.op == "sum_axes" and "epilogue" in s.a for s in build.train_plan.graph.stmts)
    want = _losses(build, 3)
    got = _losses(build, 3, EmulatedDriver(tmp_path))
    _close(got["losses"], want["losses"])


@pytest.mark.slow  # 3 s (the default suite's four minutes)
@needs_gxx
def test_eval_and_predict_run_on_the_gpu_runner(tmp_path: Path) -> None:
    """deepdsl eval's test program and deepdsl predict's inference program on the stand-in GPU give the NumPy
    runner's test loss, accuracy and predictions."""
    build = _build(TINY, "tiny.ddsl")
    run_training(build, iters=2, device="cpu", save=str(tmp_path / "p.npz"))
    want = evaluate(build, str(tmp_path / "p.npz"), "synthetic", device="cpu")
    got = evaluate(build, str(tmp_path / "p.npz"), "synthetic", driver=EmulatedDriver(tmp_path / "1"))
    assert got["device"] == "cuda"
    assert set(got) == set(want) == {"device", "precision", "test_loss", "test_accuracy", "test_top5_accuracy"}
    assert got["test_loss"] == pytest.approx(want["test_loss"], rel=1e-4)
    assert got["test_accuracy"] == pytest.approx(want["test_accuracy"])
    x = np.random.default_rng(3).random((6, 3, 8, 8), np.float32)  # 6 samples: a batch of 4 and a partial one
    np.savez(tmp_path / "x.npz", x=x)
    predict(build, str(tmp_path / "p.npz"), str(tmp_path / "cpu.npz"), f"npz:{tmp_path / 'x.npz'}", device="cpu")
    out = predict(build, str(tmp_path / "p.npz"), str(tmp_path / "gpu.npz"), f"npz:{tmp_path / 'x.npz'}",
                  driver=EmulatedDriver(tmp_path / "2"))  # fmt: skip
    assert out["device"] == "cuda" and out["samples"] == 6
    np.testing.assert_allclose(np.load(tmp_path / "gpu.npz")["predict"], np.load(tmp_path / "cpu.npz")["predict"],
                               rtol=1e-4, atol=1e-5)  # fmt: skip


@needs_gxx
def test_profile_times_every_launch_and_computes_the_step(tmp_path: Path) -> None:
    """`GpuRunner.profile` (scripts/profile_gpu.py) runs each launch of the step once, timing it alone: one entry per
    launch, in program order, naming its kernel, and the parameters it leaves are those of a plain run."""
    from deepdsl.initializers import init_array

    c = api.compile_source(TINY, "tiny.ddsl", {}, stop_at="plan")
    g = c.plan.graph
    arrays = {p.value.name: init_array(p.value.name, p.value.type.shape, p.init.kind, p.init.args, p.init.fan_in,
                                       p.init.fan_out, 1, np.float32) for p in g.params}  # fmt: skip
    rng = np.random.default_rng(0)
    feeds = {d.value.name: rng.random(d.value.type.shape, np.float32) if d.kind == "input"
             else rng.integers(0, d.classes, d.value.type.shape) if d.kind == "label" else np.int64(0)
             for d in g.inputs}  # fmt: skip
    plain = gpu_runner.GpuRunner(EmulatedDriver(tmp_path / "plain"), c.plan, None, arrays)
    timed = gpu_runner.GpuRunner(EmulatedDriver(tmp_path / "timed"), c.plan, None, arrays)
    plain.run("train", feeds)
    timings = timed.profile("train", feeds)
    assert [launch for launch, _, _ in timings] == [launch for launch, _, _ in timed.calls["train"]]
    assert all(what == launch.kernel and seconds >= 0 for launch, what, seconds in timings)
    want, got = plain.arrays(), timed.arrays()
    assert want.keys() == got.keys()
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


# ---- the train step as a CUDA graph ----


def _graph_run(build: api.Build, driver: EmulatedDriver, graphs: bool = True, iters: int = 4):  # noqa: ANN202
    """(run_training's result, the parameters saved after it, the reported lines) on `driver`."""
    lines: list[str] = []
    saved = driver.folder / "params.npz"
    got = run_training(build, iters=iters, device="cpu", driver=driver, graphs=graphs, report=lines.append,
                       save=str(saved))  # fmt: skip
    return got, dict(np.load(saved)), lines


class _DroppingDriver(EmulatedDriver):
    """A broken replay: the graph's last call (the step's last update) left out."""

    def replay(self, graph: list) -> None:
        super().replay(graph[:-1])


@needs_gxx
def test_the_train_step_is_one_graph_from_the_second_step_on(tmp_path: Path) -> None:
    """4 steps with the graph: the first runs call for call, the second is captured once (every launch and copy of
    the step recorded, none run, the batch uploaded before) and replayed, as are the third and fourth; the losses
    and parameters are those of the run without the graph bit for bit. A replay that drops the step's last call
    shows in the parameters."""
    from deepdsl.backends.cuda.translation import program

    build = _build(TINY, "tiny.ddsl")
    on, off = EmulatedDriver(tmp_path), EmulatedDriver(tmp_path)
    got, params, lines = _graph_run(build, on)
    want, want_params, off_lines = _graph_run(build, off, graphs=False)
    assert (on.captures, on.replays) == (1, 3) and (off.captures, off.replays) == (0, 0)
    step = program(build.train_plan)
    assert on.recording is not None and len(on.recording) == len(step.launches) + len(step.copies)
    assert got["losses"] == want["losses"] and same_bits(params, want_params)
    assert got["test_loss"] == want["test_loss"]  # the test steps after the graph run call for call
    assert lines[0].startswith("device: cuda (")
    assert lines[0].endswith("; graph: on)  network Tiny  batch 4  data synthetic (seed 2)  precision fp32")
    assert "; graph: off (--no-graph))" in off_lines[0]
    assert got["gpu_graph"] == "on" and want["gpu_graph"] == "off (--no-graph)"
    dropped = _DroppingDriver(tmp_path)
    broken, broken_params, _ = _graph_run(build, dropped)
    assert dropped.replays == 3 and not same_bits(broken_params, want_params)


class _RefusingDriver(EmulatedDriver):
    """A driver that refuses the step's capture after recording it all (as a GPU refuses a host call while
    capturing): nothing of it may have run."""

    def capture(self, issue):  # noqa: ANN001, ANN201
        return super().capture(lambda: (issue(), self.free_bytes()))


@needs_gxx
@pytest.mark.slow
def test_a_step_that_cannot_be_captured_runs_call_for_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A driver without graphs says why on the device line; a capture the driver refuses is dropped (nothing of it
    ran), said after the run, and every step runs call for call: the same bits as without the graph. `deepdsl run
    --no-graph` reaches the runner."""
    import deepdsl.running as running

    build = _build(TINY, "tiny.ddsl")
    want, want_params, _ = _graph_run(build, EmulatedDriver(tmp_path), graphs=False)
    plain = EmulatedDriver(tmp_path)
    plain.graph_unsupported = "no stream capture here"
    got, params, lines = _graph_run(build, plain)
    assert "; graph: off (no stream capture here))" in lines[0] and plain.captures == 0
    assert got["losses"] == want["losses"] and same_bits(params, want_params)
    refusing = _RefusingDriver(tmp_path)
    got, params, lines = _graph_run(build, refusing)
    assert "; graph: on)" in lines[0] and refusing.captures == refusing.replays == 0
    why = "graph: off (the step did not capture: cuMemGetInfo while capturing (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED))"
    assert why in lines and got["losses"] == want["losses"] and same_bits(params, want_params)
    drivers: list[EmulatedDriver] = []

    def emulated(device: str, double: bool = False, kernels: str = "auto", tf32: bool = False) -> tuple:
        drivers.append(EmulatedDriver(tmp_path))
        return drivers[-1], "cuda (emulated)", None

    monkeypatch.setattr(running, "open_device", emulated)
    (tmp_path / "tiny.ddsl").write_text(TINY)
    for flags, graph in (((), "on"), (("--no-graph",), "off (--no-graph)")):
        args = ["run", str(tmp_path / "tiny.ddsl"), "--iters", "2", "--device", "cuda", "--json", *flags]
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 0, result.output
        assert json.loads(result.output.strip().splitlines()[-1])["gpu_graph"] == graph
    assert [d.captures for d in drivers] == [1, 0]
