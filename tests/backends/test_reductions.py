"""Large reductions on the CUDA path (ir/reductions.py, backends/cuda/passes.py `pass_kernels`): split over enough
blocks to fill a GPU, ONE launch whose last block to finish adds the partial sums in slice order (the same bits every
run, whatever order the blocks run in, the block counter back at zero after every pass and every graph replay), a
batch norm's statistics and its dgamma/dbeta in one pass each with the running updates done by that last block, the
partial sums in the memory plan (checked exact), and the kernels agreeing with NumPy under the CPU emulator."""

from __future__ import annotations

import ctypes
import math
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from deepdsl import api
from deepdsl.backends.cuda import launch, translation
from deepdsl.ir.reductions import SPLIT_MIN, TARGET_BLOCKS, is_total, reduction_group, split_of
from deepdsl.memory.check import check_plan
from deepdsl.passes.pipeline import kernels as kernel_count

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from cuda_emulator import emulate, run_launch  # noqa: E402
from test_cuda_emit import _values, check_launches, needs_compiler  # noqa: E402

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ to run the kernels on the CPU")

# batch norm over [32, 6, 16, 16] (49,152 values a statistic's pass, under SPLIT_MIN) and [32, 8, 32, 32] (262,144:
# split) in one network: the split and the one-launch forms side by side
BN = """network B
const N = 32
input x : [N, 3, 32, 32]
label y : [N] classes 10
layer c1 = conv(8, kernel=3, pad=1)
layer c2 = conv(6, kernel=3, pad=1, stride=2)
layer fc = full(10)
net = fc o flatten o max_pool(4, stride=4) o relu o batch_norm o c2 o relu o batch_norm o c1
loss = softmax_cross_entropy(net(x), y)
predict = net(x)
train { optimizer = sgd(lr=0.1, momentum=0.9) iterations = 1 seed = 1 }
"""


@pytest.fixture(scope="module")
def bn_plan():  # noqa: ANN201
    return api.compile_source(BN, "bn.ddsl", stop_at="plan").plan


def _split_launches(prog: launch.CudaProgram) -> list[launch.Launch]:
    """The partial-sum launches of split passes (a pass over a small range is one launch of the same form)."""
    return [x for x in prog.launches if x.loop == "split" and x.grid[1] > 1]


@pytest.mark.parametrize(
    "numel,vars_",
    [
        (64, (("n", 64), ("hw", 112 * 112))),  # ResNet-50's stem at batch 64
        (2048, (("n", 64), ("hw", 49))),  # its last stage
        (16, (("n", 16), ("hw", 1024))),
        (6, (("n", 32), ("hw", 1024))),
        (1, (("n", 1), ("hw", 70_000))),  # a sum over everything, one image
        (10, (("n", 8192),)),  # a bias gradient over a batch: one variable
        (3, (("n", 2), ("h", 300), ("w", 300))),
    ],
)
def test_a_large_reduction_fills_the_gpu(numel: int, vars_: tuple) -> None:
    split = split_of(numel, vars_)
    assert numel * math.prod(n for _, n in vars_) > SPLIT_MIN
    assert split.blocks >= TARGET_BLOCKS == 528
    assert split.outer <= vars_[0][1]  # no empty piece of the batch
    assert split.inner <= max(1, math.prod(n for _, n in vars_[1:]))


def test_a_small_reduction_is_one_launch() -> None:
    assert split_of(6, (("n", 4), ("hw", 64))).slices == 1


def test_the_launches_fill_the_gpu(bn_plan) -> None:  # noqa: ANN001
    prog = translation.program(bn_plan)
    check_launches(bn_plan, prog)
    split = _split_launches(prog)
    assert split, "no reduction was split"
    for x in split:
        assert x.grid[0] * x.grid[1] >= TARGET_BLOCKS, x.kernel
        assert x.block[0] % 32 == 0 and x.block[0] & (x.block[0] - 1) == 0  # dd_block_sum_double's tree
    # a split pass is one launch: its last block adds the partial sums (no finishing launch follows), so it takes
    # the running statistics the updates read besides the partial sums and the inputs
    # (a split-K filter gradient's own finishing launch, `finishes`, is the convolution's: not a pass)
    assert not [x for x in prog.launches if x.kernel.endswith("_finish") and not x.finishes]
    for x in split:
        assert f"{x.kernel}_finish" not in prog.source
        text = prog.source[prog.source.index(f"void {x.kernel}(") :]
        text = text[: text.index("\n}\n")]
        assert "if (dd_last_block()) {" in text, x.kernel
        assert any(a.value.startswith("workspace:") for a in x.args), x.kernel
    library = translation.library_source()
    assert "__device__ unsigned int dd_pass_count = 0;" in library  # zeroed when the module loads
    assert "__threadfence();" in library and "atomicInc(&dd_pass_count, blocks - 1)" in library


def test_no_division_per_element_and_an_unrolled_loop(bn_plan) -> None:  # noqa: ANN001
    prog = translation.program(bn_plan)
    for x in [x for x in prog.launches if x.loop == "split"]:
        text = prog.source[prog.source.index(f"void {x.kernel}(") :]
        text = text[: text.index("\n}\n")]
        loop = text[text.index("#pragma unroll") : text.index("dd_block_sum_double")]
        assert not re.search(r"[/%]", loop), loop  # the index arithmetic is per block, not per element


def test_statistics_and_running_updates_are_one_pass(bn_plan) -> None:  # noqa: ANN001
    """channel_mean, channel_var and both running updates: one launch, split over blocks (the first batch norm) or
    not (the second); dgamma, dbeta and the inverse deviation likewise."""
    prog = translation.program(bn_plan)
    ops = {s.out.name: s.op for s in bn_plan.graph.stmts}
    stats = [x for x in prog.launches if x.op == "channel_mean"]
    assert len(stats) == 2  # split + not split: one launch each
    for x in stats:
        assert sorted(ops[v] for v in (x.stmt, *x.also)) == sorted(
            ["channel_mean", "channel_var", "running_update", "running_update"]
        )
    assert not [x for x in prog.launches if x.op in ("channel_var", "running_update")]
    # dgamma (fused sum(g xhat)), dbeta (channel_sum) and the inverse deviation the backward reads: one pass each
    backward = [x for x in prog.launches if sorted(ops[v] for v in (x.stmt, *x.also)) == ["bn_invstd", "channel_sum",
                                                                                          "fused"]]  # fmt: skip
    assert len(backward) == 2  # split + not split: one launch each
    assert not [x for x in prog.launches if x.op == "bn_invstd"]


def test_the_partial_sums_are_in_the_checked_plan(bn_plan) -> None:  # noqa: ANN001
    check_plan(bn_plan)  # workspace spans the pass, no buffer overlaps it (memory/check.py)
    prog = translation.program(bn_plan)
    for x in _split_launches(prog):
        for a in x.args:
            if a.value.startswith("workspace:"):
                ws = bn_plan.workspace[a.name]
                assert ws.offset == a.offset and ws.offset + ws.nbytes <= bn_plan.arena_bytes


def _run_pass(lib, prog, p, env, stmt: str, order: int = 0, scratch: dict | None = None) -> dict[str, np.ndarray]:  # noqa: ANN001
    """The launches of the pass of `stmt`, run on the CPU with every block and slice, the blocks in `order` (the
    emulator's `dd_set_block_order`): its results (NaN before), its partial sums in `scratch` (garbage before)."""
    launches = [x for x in prog.launches if x.stmt == stmt]
    results = (stmt, *launches[0].also)
    arrays = {r: np.full_like(env[r], np.nan) for r in results}
    lib.dd_set_block_order(order)
    try:
        for x in launches:
            ptrs = []
            for k, a in enumerate(x.args):
                if k < len(results):
                    ptrs.append(arrays[results[k]].ctypes.data)
                elif a.value.startswith("workspace:"):
                    ws = arrays.setdefault(a.value, np.full(p.workspace[a.name].nbytes, 0xFF, np.uint8))
                    ptrs.append(ws.ctypes.data)
                else:
                    ptrs.append(arrays.setdefault(a.value, np.array(env[a.value], order="C")).ctypes.data)
            run_launch(lib, x, ptrs, small=False)
    finally:
        lib.dd_set_block_order(0)
    if scratch is not None:
        scratch.update({k: v for k, v in arrays.items() if k.startswith("workspace:")})
    return {r: arrays[r] for r in results}


def _pass_count(lib) -> int:  # noqa: ANN001
    """The block counter of every split pass (library.cu `dd_pass_count`) as the emulated module holds it."""
    return ctypes.c_uint.in_dll(lib, "dd_pass_count").value


def _in_slice_order(p, x: launch.Launch, got: dict, scratch: dict) -> list[str]:  # noqa: ANN001
    """What the last block of the split pass `x` must have written, recomputed from the partial sums it left in its
    scratch added in slice order (Python floats are IEEE doubles added one at a time, as the kernel's loop): each sum
    that is its total (a channel sum, dgamma), a mean (its total over the count, in float) or a variance (from the
    sums in double) bit for bit; the problems found."""
    results = (x.stmt, *x.also)
    stmts = tuple(s for s in p.graph.stmts if s.out.name in results)
    rg = reduction_group(stmts)
    assert rg is not None and [f.stmt.out.name for f in rg.sums] == list(results[: len(rg.sums)])
    parts = [a.value for a in x.args if a.value.startswith("workspace:")]
    slices, numel = rg.split.slices, rg.split.numel
    assert len(parts) == len(rg.sums) and x.grid[1] == slices
    totals = []
    for w in parts:
        partial = scratch[w][: 8 * slices * numel].view(np.float64).reshape(slices, numel)
        row = []
        for e in range(numel):
            t = 0.0
            for y in range(slices):
                t += float(partial[y, e])
            row.append(t)
        totals.append(row)
    variance = {v: m for m, v in rg.moments}
    problems = []
    for k, f in enumerate(rg.sums):
        count = math.prod(n for _, n in f.reduce.vars)
        if k in variance:
            mean = [t / count for t in totals[variance[k]]]
            want = np.array([max(t / count - mu * mu, 0.0) for t, mu in zip(totals[k], mean)]).astype(np.float32)
        elif is_total(f.outside):
            want = np.array(totals[k]).astype(np.float32)
        elif f.stmt.op == "channel_mean":
            want = np.array(totals[k]).astype(np.float32) / np.float32(count)
        else:
            continue
        out = got[f.stmt.out.name].reshape(-1)
        if out.tobytes() != want.tobytes():
            problems.append(f"%{f.stmt.out.name} ({f.stmt.op}): not its partial sums added in slice order")
    return problems


BLOCK_ORDERS = (0, 1, 7)  # in order, reversed, shuffled (the emulator's dd_set_block_order)


def _spiky(env: dict, seed: int = 5) -> dict:
    """`env` with every float tensor of two or more axes made small (times 2^-20) but for spikes of +-2^40 that cancel
    in each channel (axis 1): sums of float32 values in double are exact unless their magnitudes spread this far, so
    that only such values make the order the partial sums are added in show in the results."""
    rng = np.random.default_rng(seed)
    out = dict(env)
    for k, v in env.items():
        if isinstance(v, np.ndarray) and v.dtype == np.float32 and v.ndim >= 2:
            w = (v * np.float32(2.0**-20)).astype(np.float32)
            flat = w.reshape(v.shape[0], v.shape[1], -1)
            for c in range(v.shape[1]):
                for sign in (1, -1) * 4:
                    flat[rng.integers(v.shape[0]), c, rng.integers(flat.shape[2])] = sign * 2.0**40
            out[k] = w
    return out


def _split_pass_problems(lib, prog, p, env, stop: bool = False) -> list[str]:  # noqa: ANN001
    """Each split pass of `prog` run with its blocks in each of BLOCK_ORDERS, one run after another on the same
    module, on `env` and on `_spiky(env)`: the same bits every run, its sums its partial sums added in slice order,
    the block counter back at 0 after every run, NumPy's values (on `env`); the problems found (none: it holds), with
    `stop` those of the first run that has any."""
    ops = {s.out.name: s.op for s in p.graph.stmts}
    problems = []
    if _pass_count(lib) != 0:
        problems.append(f"the block counter is {_pass_count(lib)} before any pass, not 0")
    spiky = _spiky(env)
    for x, data in ((x, data) for x in _split_launches(prog) for data in (env, spiky)):
        first = None
        for order in BLOCK_ORDERS:
            if stop and problems:
                return problems
            scratch: dict = {}
            got = _run_pass(lib, prog, p, data, x.stmt, order, scratch)
            if _pass_count(lib) != 0:
                problems.append(f"{x.kernel}, block order {order}: the block counter is {_pass_count(lib)} after it")
                ctypes.c_uint.in_dll(lib, "dd_pass_count").value = 0
            problems += [f"{x.kernel}, block order {order}: {w}" for w in _in_slice_order(p, x, got, scratch)]
            if first is None:
                first = got
                for r, out in got.items() if data is env else ():
                    want = env[r]
                    scale = float(np.abs(want).max(initial=1.0))
                    if not np.allclose(out, want, rtol=2e-4, atol=1e-5 * scale):
                        problems.append(f"{x.kernel}: {ops[r]} %{r} is not NumPy's")
            elif any(out.tobytes() != first[r].tobytes() for r, out in got.items()):
                problems.append(f"{x.kernel}, block order {order}: other bits than the first run")
    return problems


@needs_gxx
def test_split_passes_agree_with_numpy_and_give_the_same_bits_twice(bn_plan, tmp_path: Path) -> None:  # noqa: ANN001
    """Every pass (the one-launch form too) twice: the same bits; every split pass in several block orders, one run
    after another: the same bits, its partial sums added in slice order, the counter reset (`_split_pass_problems`)."""
    prog = translation.program(bn_plan)
    lib = emulate(prog.source, prog.kernels, tmp_path)
    env = _values(bn_plan)
    ops = {s.out.name: s.op for s in bn_plan.graph.stmts}
    passes = [x.stmt for x in prog.launches if x.loop == "split"]
    assert len(passes) >= 4 and len(_split_launches(prog)) >= 3
    for stmt in passes:
        first = _run_pass(lib, prog, bn_plan, env, stmt)
        again = _run_pass(lib, prog, bn_plan, env, stmt)
        for r, out in first.items():
            assert out.tobytes() == again[r].tobytes(), (stmt, r)  # fixed order: the same bits every run
            want = env[r]
            scale = float(np.abs(want).max(initial=1.0))
            np.testing.assert_allclose(out, want, rtol=2e-4, atol=1e-5 * scale, err_msg=f"{ops[r]} %{r}")
    assert _split_pass_problems(lib, prog, bn_plan, env) == []


@needs_gxx
@pytest.mark.parametrize(
    "mutation",
    [
        # the counter never reset: the next pass's blocks count on from where this one left it
        ("reset", "atomicInc(&dd_pass_count, blocks - 1)", "atomicAdd(&dd_pass_count, 1u)"),
        # the last block adding the partial sums backwards (the slow tier: each mutation compiles the program again)
        pytest.param(
            ("order", r"for \(int y = 0; y < (\d+); y\+\+\)", r"for (int y = \1 - 1; y >= 0; y--)"),
            marks=pytest.mark.slow,
        ),
        # the last block the one whose blockIdx.y is the last slice, not the last to finish (right in order only)
        pytest.param(
            (
                "last",
                "last = atomicInc(&dd_pass_count, blocks - 1) == blocks - 1;",
                "atomicInc(&dd_pass_count, blocks - 1); "
                "last = blockIdx.x == gridDim.x - 1 && blockIdx.y == gridDim.y - 1;",
            ),
            marks=pytest.mark.slow,
        ),
    ],
    ids=lambda m: m[0],
)
def test_the_check_catches_a_wrong_reset_or_order(bn_plan, tmp_path: Path, mutation: tuple) -> None:  # noqa: ANN001
    """`_split_pass_problems` finds a kernel whose last block does not reset the counter, adds the partial sums in
    another order, or is not the last to finish: the checks above can fail."""
    prog = translation.program(bn_plan)
    _, pattern, replacement = mutation
    source, n = re.subn(pattern if mutation[0] == "order" else re.escape(pattern), replacement, prog.source)
    assert n >= 1, "the mutated code is not in the source"
    lib = emulate(source, prog.kernels, tmp_path)
    assert _split_pass_problems(lib, prog, bn_plan, _values(bn_plan), stop=True) != []


# a batch norm over the input [16, 4, 32, 32] (65,536 values: its statistics and dgamma/dbeta split), no convolution:
# cheap enough to train four steps on the emulator in the default suite
REPLAY_NET = """network R
const N = 16
input x : [N, 4, 32, 32]
label y : [N] classes 10
layer fc = full(10)
net = fc o flatten o avg_pool(8, stride=8) o relu o batch_norm
loss = softmax_cross_entropy(net(x), y)
predict = net(x)
train { data = synthetic(seed=3) optimizer = sgd(lr=0.05, momentum=0.9) iterations = 4 seed = 1 }
"""


@needs_gxx
@pytest.mark.slow  # 3.3 s (the default suite's four minutes; test_gpu_runner's graph-replay check stays)
def test_a_graph_replayed_runs_the_split_passes_as_call_for_call(tmp_path: Path) -> None:
    """Four training steps on the emulated driver: the first call for call, the second captured as a CUDA graph and
    the graph replayed for the rest (three replays), against four steps call for call: the same losses and
    parameters bit for bit, and the block counter back at 0 (the last block of each pass resets it, so every replay
    starts from the zero the module was loaded with)."""
    from cuda_emulator import EmulatedDriver

    from deepdsl.running import run_training

    build = api.build(api.compile_source(REPLAY_NET, "r.ddsl").program)
    prog = translation.program(build.train_plan)
    assert len(_split_launches(prog)) >= 2  # the statistics, dgamma/dbeta
    runs, arrays, drivers = {}, {}, {}
    for graphs in (True, False):
        driver = drivers[graphs] = EmulatedDriver(tmp_path)  # one build of the kernels: one module, one counter
        out = tmp_path / f"{graphs}.npz"
        runs[graphs] = run_training(build, iters=4, data_flag="synthetic", device="cpu", driver=driver, graphs=graphs,
                                    save=str(out))  # fmt: skip
        arrays[graphs] = dict(np.load(out))
        assert driver.lib is not None and _pass_count(driver.lib) == 0
    assert drivers[True].captures == 1 and drivers[True].replays == 3 and drivers[False].replays == 0
    assert np.isfinite(runs[True]["losses"]).all()
    assert np.asarray(runs[True]["losses"]).tobytes() == np.asarray(runs[False]["losses"]).tobytes()
    assert arrays[True].keys() == arrays[False].keys()
    for k in arrays[True]:
        assert arrays[True][k].tobytes() == arrays[False][k].tobytes(), k


def test_resnet50_launches_fewer_kernels() -> None:
    """`deepdsl ir --stats`'s count for ResNet-50 at batch 64 (its default): 778 before the one-pass statistics (four
    launches per batch norm forward, then two, now one), 463 before a split pass was one launch; issue 30 asks for
    at most 450."""
    c = api.compile_file(Path(__file__).resolve().parents[2] / "networks" / "resnet50.ddsl", {"N": 64}, stop_at="opt")
    assert c.opt is not None
    assert kernel_count(c.opt) <= 450


# a batch norm over [128, 8, 8, 8] (65,536 values: split) trained end to end by the GPU runner on the CPU emulator
SPLIT_NET = """network S
const N = 128
input x : [N, 3, 8, 8]
label y : [N] classes 10
layer cv = conv(8, kernel=3, pad=1)
layer fc = full(10)
net = fc o flatten o max_pool(2, stride=2) o relu o batch_norm o cv
loss = softmax_cross_entropy(net(x), y)
predict = net(x)
train { data = synthetic(seed=2) optimizer = sgd(lr=0.05, momentum=0.9) iterations = 2 seed = 1 }
"""


@pytest.mark.slow
@needs_gxx
def test_the_gpu_runner_trains_with_split_passes_as_numpy_does(tmp_path: Path) -> None:
    """The runner's whole training run with the split statistics and dgamma/dbeta passes (the partial sums in the
    arena, the running updates in the finishing launch) gives the NumPy runner's losses and running statistics,
    and the GPU memory it takes is the plan's."""
    from cuda_emulator import EmulatedDriver

    from deepdsl.running import run_training

    build = api.build(api.compile_source(SPLIT_NET, "s.ddsl").program)
    prog = translation.program(build.train_plan)
    assert len([x for x in prog.launches if x.loop == "split" and x.grid[1] > 1]) >= 2  # statistics, dgamma/dbeta
    arrays: dict[str, dict] = {}
    runs = {}
    for name, driver in (("numpy", None), ("gpu", EmulatedDriver(tmp_path))):
        out = tmp_path / f"{name}.npz"
        runs[name] = run_training(build, iters=2, data_flag="synthetic", device="cpu", driver=driver,
                                  save=str(out))  # fmt: skip
        arrays[name] = dict(np.load(out))
    got, want = runs["gpu"], runs["numpy"]
    assert got["device"] == "cuda"
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-4, atol=1e-6)
    for k in ("net.batch_norm1.running_mean", "net.batch_norm1.running_var", "net.batch_norm1.gamma"):
        np.testing.assert_allclose(arrays["gpu"][k], arrays["numpy"][k], rtol=1e-4, atol=1e-6, err_msg=k)
    assert got["gpu_memory_bytes"] == got["gpu_planned_bytes"]


@needs_gxx
def test_without_scratch_a_pass_falls_back_to_a_kernel_a_statement(tmp_path: Path) -> None:
    """Under --workspace-limit 0 the plan has no room for partial sums: each reduction is its own block-per-output
    kernel again (no split launch), and they still agree with NumPy."""
    c = api.compile_source(BN, "bn.ddsl", stop_at="opt")
    p = api.planned(c.opt, workspace_limit=0)
    assert not p.workspace
    prog = translation.program(p)
    check_launches(p, prog)
    assert not [x for x in prog.launches if x.loop == "split" and x.grid[1] > 1]
    lib = emulate(prog.source, prog.kernels, tmp_path)
    env = _values(p)
    stats = [x.stmt for x in prog.launches if x.op in ("channel_mean", "channel_var")]
    assert len(stats) >= 2
    for stmt in stats:
        for r, out in _run_pass(lib, prog, p, env, stmt).items():
            np.testing.assert_allclose(out, env[r], rtol=2e-4, atol=1e-5 * float(np.abs(env[r]).max(initial=1.0)))


@needs_gxx
def test_sums_of_every_shape_split_and_agree(tmp_path: Path) -> None:
    """Sums whose range is not a batch-norm's [N, C, H, W] less C: everything of a 4-D tensor (the batch and the
    rest, one contiguous range), a bias gradient over many rows (one variable), a mean, the sum of squares, and a
    channel sum of a 3-D tensor: split, the same bits twice, NumPy's values."""
    from deepdsl.ir import GraphBuilder, Init, ParamDef, TensorType, Value
    from deepdsl.memory import plan

    b = GraphBuilder("Sums")
    f = lambda name, *shape: b.add_param(ParamDef(Value(name, TensorType(shape)), Init("constant", (0.0,))))  # noqa: E731
    x4, rows, x3 = f("x4", 16, 8, 32, 32), f("rows", 40000, 3), f("x3", 64, 4, 300)
    outs = [b.emit("sum", x4), b.emit("sum_squares", x4), b.emit("channel_sum", rows), b.emit("channel_mean", x3),
            b.emit("channel_sum", x4)]  # fmt: skip
    for k, v in enumerate(outs):
        b.output(f"o{k}", v)
    p = plan(b.build())
    prog = translation.program(p)
    check_launches(p, prog)
    split = _split_launches(prog)
    assert {r for x in split for r in (x.stmt, *x.also)} == {v.name for v in outs}  # sum and sum_squares: one pass
    assert all(x.grid[0] * x.grid[1] >= TARGET_BLOCKS for x in split)
    lib = emulate(prog.source, prog.kernels, tmp_path)
    env = _values(p)
    for x in split:
        first = _run_pass(lib, prog, p, env, x.stmt)
        again = _run_pass(lib, prog, p, env, x.stmt)
        for r, out in first.items():
            assert out.tobytes() == again[r].tobytes()
            want = env[r]
            np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5 * float(np.abs(want).max(initial=1)))


@needs_compiler
def test_nvrtc_compiles_the_one_launch_pass_with_its_counter_zero_at_module_load(bn_plan) -> None:  # noqa: ANN001
    """NVRTC compiles the split passes; the PTX declares the block counter without an initialiser, which PTX's rules
    zero when the module loads (the CUDA module's zero, on both CUDA devices: they load this unit), and each split
    pass counts its blocks with a global atomic increment after a fence and reads the partial sums past L1."""
    from deepdsl.backends.cuda import nvrtc

    prog = translation.program(bn_plan)
    text = nvrtc.ptx(prog.source, "sm_90")
    assert re.search(r"^\.global \.align 4 \.u32 dd_pass_count;$", text, re.M), "the counter: a zeroed .global"
    for x in _split_launches(prog):
        body = text[text.index(f".entry {x.kernel}(") :]
        body = body[: body.index("\n}\n")]
        assert "atom.global.inc.u32" in body and "membar.gl" in body and "ld.global.cg.f64" in body, x.kernel
