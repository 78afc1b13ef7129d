"""Large reductions on the CUDA path (ir/reductions.py, backends/cuda/kernels.py `pass_kernels`): split over enough
blocks to fill a GPU, two launches in a fixed order (the same bits every run), a batch norm's statistics and its
dgamma/dbeta in one pass each with the running updates in the finishing launch, the partial sums in the memory
plan (checked exact), and the kernels agreeing with NumPy under the CPU emulator."""

from __future__ import annotations

import math
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from deepdsl import api
from deepdsl.backends.cuda import kernels
from deepdsl.ir.reductions import SPLIT_MIN, TARGET_BLOCKS, split_of
from deepdsl.memory.check import check_plan
from deepdsl.passes.pipeline import kernels as kernel_count

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from cuda_emulator import emulate, run_launch  # noqa: E402
from test_cuda_emit import _values, check_launches  # noqa: E402

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


def _split_launches(prog: kernels.CudaProgram) -> list[kernels.Launch]:
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
    prog = kernels.program(bn_plan)
    check_launches(bn_plan, prog)
    split = _split_launches(prog)
    assert split, "no reduction was split"
    for x in split:
        assert x.grid[0] * x.grid[1] >= TARGET_BLOCKS, x.kernel
        assert x.block[0] % 32 == 0 and x.block[0] & (x.block[0] - 1) == 0  # dd_block_sum_double's tree
    # every split launch is followed by its finishing launch, which reads the same partial sums
    launches = list(prog.launches)
    for x in split:
        if any(a.value.startswith("workspace:") for a in x.args):
            after = launches[launches.index(x) + 1]
            assert after.kernel == f"{x.kernel}_finish" or after.kernel.endswith("_finish"), after.kernel
            assert [a for a in after.args if a.value.startswith("workspace:")] == [
                a for a in x.args if a.value.startswith("workspace:")
            ]


def test_no_division_per_element_and_an_unrolled_loop(bn_plan) -> None:  # noqa: ANN001
    prog = kernels.program(bn_plan)
    for x in [x for x in prog.launches if x.loop == "split"]:
        text = prog.source[prog.source.index(f"void {x.kernel}(") :]
        text = text[: text.index("\n}\n")]
        loop = text[text.index("#pragma unroll") : text.index("dd_block_sum_double")]
        assert not re.search(r"[/%]", loop), loop  # the index arithmetic is per block, not per element


def test_statistics_and_running_updates_are_one_pass(bn_plan) -> None:  # noqa: ANN001
    """channel_mean, channel_var and both running updates: one partial-sum launch and one finishing launch (the
    first batch norm) or one launch (the second); dgamma, dbeta and the inverse deviation likewise."""
    prog = kernels.program(bn_plan)
    ops = {s.out.name: s.op for s in bn_plan.graph.stmts}
    stats = [x for x in prog.launches if x.op == "channel_mean"]
    assert len(stats) == 3  # split (2 launches) + one launch
    for x in stats:
        assert sorted(ops[v] for v in (x.stmt, *x.also)) == sorted(
            ["channel_mean", "channel_var", "running_update", "running_update"]
        )
    assert not [x for x in prog.launches if x.op in ("channel_var", "running_update")]
    # dgamma (fused sum(g xhat)), dbeta (channel_sum) and the inverse deviation the backward reads: one pass each
    backward = [x for x in prog.launches if sorted(ops[v] for v in (x.stmt, *x.also)) == ["bn_invstd", "channel_sum",
                                                                                          "fused"]]  # fmt: skip
    assert len(backward) == 3  # split (partial + finish) and one launch
    assert not [x for x in prog.launches if x.op == "bn_invstd"]


def test_the_partial_sums_are_in_the_checked_plan(bn_plan) -> None:  # noqa: ANN001
    check_plan(bn_plan)  # workspace spans the pass, no buffer overlaps it (memory/check.py)
    prog = kernels.program(bn_plan)
    for x in _split_launches(prog):
        for a in x.args:
            if a.value.startswith("workspace:"):
                ws = bn_plan.workspace[a.name]
                assert ws.offset == a.offset and ws.offset + ws.nbytes <= bn_plan.arena_bytes


def _run_pass(lib, prog, p, env, stmt: str) -> dict[str, np.ndarray]:  # noqa: ANN001
    """The launches of the pass of `stmt`, run on the CPU with every block and slice: its results."""
    launches = [x for x in prog.launches if x.stmt == stmt]
    results = (stmt, *launches[0].also)
    arrays = {r: np.full_like(env[r], np.nan) for r in results}
    for x in launches:
        ptrs = []
        for k, a in enumerate(x.args):
            if k < len(results):
                ptrs.append(arrays[results[k]].ctypes.data)
            elif a.value.startswith("workspace:"):
                ptrs.append(arrays.setdefault(a.value, np.full(p.workspace[a.name].nbytes, 0xFF, np.uint8)).ctypes.data)
            else:
                ptrs.append(arrays.setdefault(a.value, np.array(env[a.value], order="C")).ctypes.data)
        run_launch(lib, x, ptrs, small=False)
    return {r: arrays[r] for r in results}


@needs_gxx
def test_split_passes_agree_with_numpy_and_give_the_same_bits_twice(bn_plan, tmp_path: Path) -> None:  # noqa: ANN001
    prog = kernels.program(bn_plan)
    lib = emulate(prog.source, prog.kernels, tmp_path)
    env = _values(bn_plan)
    ops = {s.out.name: s.op for s in bn_plan.graph.stmts}
    passes = [x.stmt for x in prog.launches if x.loop == "split"]
    assert len(passes) >= 4
    for stmt in passes:
        first = _run_pass(lib, prog, bn_plan, env, stmt)
        again = _run_pass(lib, prog, bn_plan, env, stmt)
        for r, out in first.items():
            assert out.tobytes() == again[r].tobytes(), (stmt, r)  # fixed order: the same bits every run
            want = env[r]
            scale = float(np.abs(want).max(initial=1.0))
            np.testing.assert_allclose(out, want, rtol=2e-4, atol=1e-5 * scale, err_msg=f"{ops[r]} %{r}")


def test_resnet50_launches_fewer_kernels() -> None:
    """`deepdsl ir --stats`'s count for ResNet-50 at batch 64: 778 before the one-pass statistics (four launches
    per batch norm forward, now two)."""
    c = api.compile_file(Path(__file__).resolve().parents[2] / "networks" / "resnet50.ddsl", stop_at="opt")
    assert c.opt is not None
    assert kernel_count(c.opt) <= 778 - 106


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
    prog = kernels.program(build.train_plan)
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
    prog = kernels.program(p)
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
    prog = kernels.program(p)
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
