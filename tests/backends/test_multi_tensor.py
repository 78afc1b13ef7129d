"""The optimiser's updates as one multi-tensor launch (passes/multi_tensor.py, ir/launches.py): for every optimiser
(SGD plain, with momentum and weight decay, Nesterov; Adam, AdamW; RMSprop plain and with momentum), with a learning
rate schedule, lr_mult, freeze and gradient clipping, the PyCUDA runner's program launches every parameter's update
in one kernel, and that kernel (compiled for the CPU) leaves the parameters and optimizer state the NumPy runner
leaves; ResNet-50's step at batch 64 counts the kernels it launches."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from cuda_emulator import EmulatedDriver
from helpers import ROOT

from deepdsl import api
from deepdsl.backends.cuda import launch, translation
from deepdsl.passes.pipeline import kernels as kernel_count
from deepdsl.running import run_training

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ to run the kernels on the CPU")

NET = """network M
input x : [4, 2, 6, 6]
label y : [4] classes 3
layer cv = conv(3, kernel=3)
layer bn = batch_norm()
layer h = full(5)
layer fc = full(3)
net = fc o relu o h o flatten o bn o relu o cv
loss = softmax_cross_entropy(net(x), y)
train {
  data = synthetic(seed=3)
  iterations = 3
  TRAIN
}
"""
OPTIMISERS = {
    "sgd": "optimizer = sgd(lr=0.1)",
    "sgd_momentum": "optimizer = sgd(lr=0.05, momentum=0.9, weight_decay=0.01)",
    "nesterov": 'optimizer = sgd(lr=0.05, momentum=0.9, weight_decay=0.001, nesterov=true)\n  lr_mult = ("cv", 0.5)',
    "adam": "optimizer = adam()\n  lr = warmup(cosine(0.01), steps=2)",
    "adamw": 'optimizer = adamw(lr=0.01, weight_decay=0.05)\n  freeze = "bn"',
    "rmsprop": 'optimizer = rmsprop(lr=0.005)\n  lr_mult = (("h", 4), ("fc.b", 0))',
    "rmsprop_momentum": 'optimizer = rmsprop(momentum=0.8, weight_decay=0.01)\n  freeze = ("cv", "bn.gamma")',
    "sgd_clip": "optimizer = sgd(lr=0.05, momentum=0.9, clip=0.5)",
    # the updates at the end and batch norm frozen: the plan put dbeta in the variance's memory, which the one-pass
    # dgamma/dbeta/inverse-deviation reduction still reads in its finishing launch (cv.W NaN from the first step)
    "adam_freeze": 'optimizer = adam(lr=0.01)\n  freeze = "bn"',
}


def _build(name: str) -> api.Build:
    text = NET.replace("TRAIN", OPTIMISERS[name])
    return api.build(api.compile_source(text, f"{name}.ddsl").program)


@pytest.mark.parametrize("name", list(OPTIMISERS))
def test_every_update_is_one_launch(name: str) -> None:
    """One multi-tensor launch computes every update of a trained parameter and its optimizer state, and nothing
    else of the program launches an optimiser op."""
    b = _build(name)
    g = b.train_plan.graph
    prog = translation.program(b.train_plan)
    multi = [x for x in prog.launches if x.loop == "multi-tensor"]
    assert len(multi) == 1
    computed = {multi[0].stmt, *multi[0].also}
    ops = {s.out.name: s for s in g.stmts}
    updated = {target for target, v in g.updates if v.name in computed}
    frozen = {"adamw": {"bn.gamma", "bn.beta"}, "adam_freeze": {"bn.gamma", "bn.beta"},
              "rmsprop_momentum": {"cv.W", "cv.b", "bn.gamma"}}.get(name, set())  # fmt: skip
    assert updated & {p.value.name for p in g.trainable} == {p.value.name for p in g.trainable} - frozen
    # and every optimizer state tensor (momentum, moments, square averages): all but Adam's step counter
    opt_state = {p.value.name for p in g.params if p.kind == "opt"} - {"opt/step"}
    assert opt_state <= updated and (name == "sgd") == (not opt_state)
    assert all(ops[m].a.get("multi_tensor") for m in computed)
    others = [x for x in prog.launches if x.loop != "multi-tensor"]
    assert not any(ops[x.stmt].a.get("multi_tensor") for x in others)


# the default suite runs two of the optimisers through three emulated steps (the rest in the slow tier)
QUICK = ("sgd_momentum", "adam_freeze")


@needs_gxx
@pytest.mark.parametrize(
    "name", [n if n in QUICK else pytest.param(n, marks=pytest.mark.slow) for n in OPTIMISERS]
)  # fmt: skip
def test_the_multi_tensor_launch_agrees_with_numpy(name: str, tmp_path: Path) -> None:
    """Three steps on the emulated GPU leave every parameter and optimizer state tensor the NumPy runner leaves."""
    b = _build(name)
    want = run_training(b, device="cpu", save=str(tmp_path / "numpy.npz"))
    driver = EmulatedDriver(tmp_path / "gpu")
    got = run_training(b, device="cpu", driver=driver, graphs=False, save=str(tmp_path / "gpu.npz"))
    assert got["device"] == "cuda"
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-5)
    a, c = dict(np.load(tmp_path / "numpy.npz")), dict(np.load(tmp_path / "gpu.npz"))
    state = [k for k in a if k.startswith("opt/") and k not in ("opt/iteration", "opt/step")]
    assert a.keys() == c.keys() and bool(state) == (name != "sgd")
    for k in a:
        # three steps of differently ordered float32 sums (the forward and backward kernels) before the updates
        np.testing.assert_allclose(c[k], a[k], rtol=1e-4, atol=1e-5 * float(np.abs(a[k]).max(initial=1.0)), err_msg=k)


@needs_gxx
def test_memcheck_counts_the_tables_the_pycuda_runner_allocates(tmp_path: Path) -> None:
    """The multi-tensor launches' tables live beside the arena (written once at the start): memcheck counts exactly
    what the PyCUDA runner allocates for them (gpu_table_bytes), in its GPU peak too."""
    from deepdsl.backends.cuda.runner import GpuRunner
    from deepdsl.memory.report import report

    b = _build("adam")
    arrays = {p.value.name: np.zeros(p.value.type.shape, np.float32) for p in b.train_plan.graph.params}
    runner = GpuRunner(EmulatedDriver(tmp_path / "gpu"), b.train_plan, b.infer_plan, arrays)
    r = report(b.train_plan)
    assert runner.table_bytes == r["gpu_table_bytes"] > 0
    assert r["gpu_peak_bytes"] == r["peak_bytes"] + r["gpu_scratch_limit_bytes"] + r["gpu_table_bytes"]
    runner.close()


@pytest.mark.parametrize("name", list(OPTIMISERS))
def test_a_reduction_pass_writes_no_memory_its_members_read(name: str) -> None:
    """A one-pass reduction (ir/reductions.py: batch norm's dgamma, dbeta and inverse deviation) reads every
    member's inputs before its finishing launch writes every member's result: the plan gives no result the memory of
    an input of the pass, nor of another result (with the updates moved to the end, the plan had put dbeta where the
    variance lives, which the inverse deviation reads after dbeta is written)."""
    from deepdsl.ir.reductions import reduction_group, reduction_groups
    from deepdsl.memory.groups import planned_groups, region

    plan = _build(name).train_plan
    passes = [g for g in reduction_groups(planned_groups(plan)) if len(g) > 1 and reduction_group(g) is not None]
    assert passes  # the batch norm's statistics, and its dgamma/dbeta
    for group in passes:
        for s in group:
            w = region(plan, s.out.name)
            own = {v.name for v in s.inputs if region(plan, v.name) == w}  # an update in place, element for element
            others = {v.name for m in group for v in m.inputs} | {m.out.name for m in group}
            for v in others - own - {s.out.name}:
                r = region(plan, v)
                apart = w[0] != r[0] or (w[0] == "arena" and (w[1] + w[2] <= r[1] or r[1] + r[2] <= w[1]))
                assert apart, f"%{s.out.name} is written over %{v} in the pass {[m.out.name for m in group]}"


def test_check_plan_refuses_a_result_over_memory_a_reduction_pass_still_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan checker (--verify) finds the plan that ran NaN: placed with a reduction pass's members' lifetimes
    as plain statements (dbeta over the variance the pass's inverse deviation reads)."""
    import importlib

    from deepdsl.memory.check import PlanInvariantError, check_plan

    planning = importlib.import_module("deepdsl.memory.plan")  # the module (deepdsl.memory's `plan` is its function)

    b = _build("adam_freeze")
    check_plan(b.train_plan)
    monkeypatch.setattr(planning, "workspace_spans", lambda g: {})  # no scratch here: a pass's spans only
    bad = planning.place(b.train_plan.graph)
    monkeypatch.undo()
    with pytest.raises(PlanInvariantError, match=r"still needs when that is written"):
        check_plan(bad)


@needs_gxx
@pytest.mark.parametrize(  # slow for the default's 4 minutes: adam (adamw stays there) and rmsprop (rmsprop_momentum)
    "name", [pytest.param(n, marks=pytest.mark.slow) if n in ("adam", "rmsprop") else n for n in OPTIMISERS]
)
def test_the_multi_tensor_kernel_computes_each_update_as_numpy(name: str, tmp_path: Path) -> None:
    """The multi-tensor launch alone, on the same inputs as the NumPy kernels of its statements (random gradients,
    parameters and state, the schedule's rate and the step counter), writes what those kernels compute."""
    from cuda_emulator import emulate, run_launch

    from deepdsl.ir import REGISTRY

    p = _build(name).train_plan
    g = p.graph
    prog = translation.program(p)
    (multi,) = [x for x in prog.launches if x.loop == "multi-tensor"]
    members = {multi.stmt, *multi.also}
    rng = np.random.default_rng(1)
    env: dict = {}
    for s in g.stmts:
        if s.out.name not in members:
            continue
        for v in s.inputs:  # what the rest of the step computes: gradients, the rate, the step count, the scale
            if v.name not in env and v.name not in members:
                low = 1.0 if v.name.startswith("opt/") or v.type.shape == () else -1.0  # square averages positive
                env[v.name] = rng.uniform(low, 1.5, v.type.shape).astype(np.float32)
        env[s.out.name] = np.asarray(REGISTRY[s.op].numpy(tuple(env[v.name] for v in s.inputs), s.a), np.float32)
    lib = emulate(prog.source, [multi.kernel], tmp_path)
    arrays: dict = {}
    ptrs = []
    for arg in multi.args:
        if arg.value in members:
            ptrs.append(arrays.setdefault(arg.value, np.zeros_like(env[arg.value])).ctypes.data)
        else:
            ptrs.append(arrays.setdefault(arg.value, np.array(env[arg.value], np.float32, order="C")).ctypes.data)
    table = launch.multi_table(multi, ptrs)
    run_launch(lib, multi, [table.ctypes.data], small=False)
    for m in members:
        # Adam's bias correction: powf in float32 on the device, the power in float64 in NumPy, its error divided by
        # 1 - 0.999^t, small at an early step
        tol = 1e-5 if name.startswith("adam") else 1e-7
        np.testing.assert_allclose(arrays[m], env[m], rtol=1e-6, atol=tol, err_msg=m)


# ---- launches per step ----


def update_launches(b: api.Build) -> int:
    """The launches of the optimiser's updates in `b`'s planned train step (each parameter's one or two)."""
    from deepdsl.memory.launches import planned_launches
    from deepdsl.passes.multi_tensor import is_update

    return sum(1 for launch in planned_launches(b.train_plan) if all(is_update(s) for g in launch for s in g))


RESNET50_KERNELS = 379  # `deepdsl ir --stats networks/resnet50.ddsl --set N=64`: 778 before the multi-tensor
# launch (-160), the ReLU masks joining the convolutions' backward-data epilogues (-31), batch norm's one-pass
# reductions (ir/reductions.py: 623 without the multi-tensor launch) and a split pass in one launch, its last block
# finishing (463 with a finishing launch of its own: -84)
RESNET50_KERNELS_N2 = 379  # at N=2: a pass is one launch whether its range is split over blocks or not (453 before)


def test_resnet50_train_step_kernel_count() -> None:
    c = api.compile_file(ROOT / "networks" / "resnet50.ddsl", {"N": 64}, stop_at="opt")
    assert kernel_count(c.opt) == RESNET50_KERNELS
    without = api.compile_file(ROOT / "networks" / "resnet50.ddsl", {"N": 64}, stop_at="opt",
                               options=api.Options(disabled=("multi_tensor",)))  # fmt: skip
    assert kernel_count(without.opt) == RESNET50_KERNELS + 160  # 161 parameters: 161 kernels become 1


def test_the_pycuda_runner_launches_what_the_count_says(tmp_path: Path) -> None:
    """The PyCUDA runner's train program (own kernels: no vendor library) launches one kernel per counted kernel of
    the planned program, plus one for each epilogue it runs after its library kernel (the own convolutions run the
    epilogue as a second launch, and a filter gradient split over its reduction a finishing launch, which a vendor
    routine serving the statement drops): ResNet-50 at N=2 (a split reduction's two launches depend on the batch)."""
    c = api.compile_file(ROOT / "networks" / "resnet50.ddsl", {"N": 2}, stop_at="plan")
    prog = translation.program(c.plan)
    epilogues = sum(1 for s in c.plan.graph.stmts if "epilogue" in s.a)
    finishes = sum(1 for x in prog.launches if x.finishes)
    assert len(prog.launches) == kernel_count(c.plan.graph) + epilogues + finishes
    assert kernel_count(c.plan.graph) == kernel_count(c.opt) == RESNET50_KERNELS_N2
    assert sum(1 for x in prog.launches if x.loop == "multi-tensor") == 1


@pytest.mark.slow  # the slow tier: the default suite's four-minute budget
@needs_gxx
def test_the_pycuda_runner_launches_one_kernel_per_counted_launch(tmp_path: Path) -> None:
    """A step run call for call on the emulated driver makes exactly the program's launches; the multi-tensor pass
    takes the updates' launches down by the parameters' groups less one."""
    launched = {}
    for disabled in ((), ("multi_tensor",)):
        b = api.build(api.compile_source(NET.replace("TRAIN", OPTIMISERS["sgd_momentum"]), "m.ddsl").program,
                      api.Options(disabled=disabled))  # fmt: skip
        driver = EmulatedDriver(tmp_path / "_".join(disabled or ("multi",)))
        got = run_training(b, iters=1, device="cpu", driver=driver, graphs=False)
        prog = translation.program(b.train_plan)
        epilogues = sum(1 for s in b.train_plan.graph.stmts if "epilogue" in s.a)
        assert len(prog.launches) == kernel_count(b.train_plan.graph) + epilogues
        assert b.eval_plan is not None and "test_loss" in got  # the step, then the test loss over the test batches
        tests = len(translation.program(b.eval_plan).launches)
        assert driver.launches > len(prog.launches) and (driver.launches - len(prog.launches)) % tests == 0
        launched[disabled] = len(prog.launches)
        if disabled:
            assert launched[disabled] - launched[()] == update_launches(b) - 1


# ---- the Java program's CUDA device on the stand-in driver ----


def _java_marks(fn):  # noqa: ANN001, ANN202
    from java_env import JAVA_MARKS

    for mark in JAVA_MARKS:
        fn = mark(fn)
    return fn


@pytest.mark.slow  # the slow tier: the default suite's four-minute budget
@_java_marks
@needs_gxx
def test_the_java_cuda_device_launches_the_updates_once(tmp_path: Path) -> None:
    """The Java program's CUDA device on the stand-in driver: with the multi-tensor launch each replayed train step
    runs as many fewer launches as the count says (the parameters less one), and the losses are the same bit for
    bit (each segment computes what its own kernel computed)."""
    import json
    import os
    import subprocess

    from click.testing import CliRunner
    from cuda_emulator import TILED, emulate, fake_driver, kernel_names
    from java_env import javac, jcuda_jars

    from deepdsl.cli import cli

    source = tmp_path / "m.ddsl"
    source.write_text(NET.replace("TRAIN", OPTIMISERS["nesterov"]))
    fake = fake_driver(tmp_path / "fake")
    results, counts = {}, {}
    for label, flags in (("multi", []), ("single", ["--no-pass", "multi_tensor"])):
        src, build = tmp_path / label / "src", tmp_path / label / "build"
        r = CliRunner().invoke(cli, ["compile", str(source), *flags, "-o", str(src), "--ptx", "--arch", "sm_90"])
        assert r.exit_code == 0, r.output
        unit = (src / "M.cu").read_text()
        names = kernel_names(unit)
        assert any("multiTensor" in k for k in names) == (label == "multi")
        emulate(unit, names, tmp_path / label, [k for k in names if k not in TILED])
        javac(src, [*src.glob("*.java"), *(src / "deepdsl" / "runtime").glob("*.java")], build)
        watch = tmp_path / label / "launches"
        env = {**os.environ, "LD_LIBRARY_PATH": str(fake), "FAKE_CUDA_GRAPH_LAUNCHES": str(watch),
               "DEEPDSL_FAKE_CUDA_KERNELS": str(tmp_path / label / "emulated.so")}  # fmt: skip
        cmd = ["java", "-cp", f"{build}:{src}:{jcuda_jars()}/*", "M", "--data", "synthetic", "--device", "cuda",
               "--iters", "3", "--json"]  # fmt: skip
        done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env, check=False)
        assert done.returncode == 0, done.stderr
        results[label] = json.loads(done.stdout)
        replays, nodes = map(int, watch.read_text().split())
        assert replays == 2  # steps 2 and 3
        counts[label] = nodes // replays
    assert results["multi"]["losses"] == results["single"]["losses"]
    program = api.compile_source(source.read_text(), "m.ddsl").program
    single = api.build(program, api.Options(disabled=("multi_tensor",)))
    multi = api.build(program)
    # each device launches what the PyCUDA runner's program does; with the pass, the updates are one launch
    assert counts["multi"] == len(translation.program(multi.train_plan).launches)
    assert counts["single"] == len(translation.program(single.train_plan).launches)
    assert update_launches(multi) == 1 and update_launches(single) == 9
    # without the pass, the fusion puts bn.gamma's momentum update into its gradient's reduction, so batch norm's
    # dgamma and dbeta are two passes, not the one-pass pair: one launch more than the updates alone
    pair = [[x.kernel.startswith("channel_sum_channel_sum__bn") for x in translation.program(b.train_plan).launches]
            for b in (multi, single)]  # fmt: skip
    assert any(pair[0]) and not any(pair[1])
    assert counts["single"] - counts["multi"] == (update_launches(single) - 1) + 1
