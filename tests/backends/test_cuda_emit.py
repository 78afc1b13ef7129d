"""CUDA emission without a GPU: every kernel of every network compiles with NVRTC (sm_90 and sm_80, one program
per network, no warnings), every launch covers its output within the device limits, LeNet's kernels match
their golden file, the index-expression → CUDA translation reads as expected, and (with g++) the kernels run
on the CPU agree with the NumPy kernels."""

from __future__ import annotations

import math
import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from deepdsl import api
from deepdsl.autodiff import infer_program
from deepdsl.backends import cuda
from deepdsl.backends.cuda import expressions, kernels, nvrtc, translation
from deepdsl.backends.cuda.launch import (
    GRID_LIMITS,
    MAX_STATIC_SMEM,
    MAX_THREADS,
    SEGMENT_BLOCKS,
    TILE,
    TILE_M,
    TILE_N,
    CudaProgram,
    Launch,
    multi_table,
)
from deepdsl.ir import REGISTRY, GraphBuilder, Init, InputDef, ParamDef, TensorType, Value
from deepdsl.ir.indexexpr import Affine, Apply, Const, Read, Reduce, Var
from deepdsl.ir.types import DType
from deepdsl.memory import Plan, plan

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from cuda_emulator import emulate, run_launch  # noqa: E402
from helpers import (  # noqa: E402
    GOLDEN,  # noqa: E402
    REDUCED,
    with_slow,
)

# every network at a reduced size (ResNet-50 and GoogLeNet at N=2), and SMALL: batch norm, a residual add, concat,
# dropout and a tensor function in one small network, the default suite's stand-in for the big ones (slow)
SIZES = {**{net: sets for net, (sets, _) in REDUCED.items()}, "resnet50": {"N": 2}, "googlenet": {"N": 2}}


def _have_compiler() -> bool:
    try:
        nvrtc.compiler()
    except nvrtc.NoCudaCompiler:
        return False
    return True


# CI installs NVRTC with the test extra, so there a missing compiler fails instead of skipping
needs_compiler = pytest.mark.skipif(
    not _have_compiler() and not os.environ.get("CI"),
    reason=f"no CUDA compiler: pip install '{nvrtc.PINNED_NVRTC}' (the test extra has it)",
)


# ---- launch configurations ----


def check_launches(p: Plan, prog: CudaProgram) -> None:
    """Every launch: within the device limits, covering its output exactly once by construction, with
    arguments that match the kernel's signature and lie inside the arena."""
    values = {s.out.name: s.out for s in p.graph.stmts}
    signatures = dict(re.findall(r'extern "C" __global__ void (\w+)\(([^)]*)\)', prog.source))
    for launch in prog.launches:
        where = f"{launch.kernel} ({launch.op} %{launch.stmt})"
        assert math.prod(launch.block) <= MAX_THREADS, where
        assert all(1 <= g <= lim for g, lim in zip(launch.grid, GRID_LIMITS)), where
        assert all(b >= 1 for b in launch.block) and launch.block[2] == 1, where
        assert launch.smem == 0 and launch.static_smem <= MAX_STATIC_SMEM, where
        out = values[launch.stmt].type
        if launch.loop == "multi-tensor":  # one launch of every update: its segments' blocks in order, then the table
            check_multi_tensor(p, launch, signatures[launch.kernel])
            continue
        assert launch.covers == out.numel, where
        if launch.loop == "tiles":  # register tiles of TILE_M x TILE_N, per batch: the GEMM's batch or the groups
            n, m, batch = launch.tiles
            assert launch.block == (TILE, TILE, 1), where
            # a filter gradient's slices of its reduction, or a strided data gradient's phases (each a part of the n
            # columns), multiply the batch
            parts = launch.grid[2] // batch
            assert launch.grid[2] % batch == 0 and launch.grid[1] == -(-m // TILE_M), where
            assert launch.grid[0] <= -(-n // TILE_N) and launch.grid[0] * TILE_N * parts >= n, where
            assert n * m * batch == out.numel, where
        else:
            assert launch.loop in ("grid-stride", "block-stride", "one-block", "split"), where
            if launch.loop != "grid-stride":  # block reductions need whole warps
                assert launch.block[0] % 32 == 0 and launch.block[1] == 1, where
            if launch.loop == "one-block":
                assert launch.grid == (1, 1, 1), where
        params = [x.strip() for x in signatures[launch.kernel].split(",")]
        assert len(params) == len(launch.args), where
        for param, arg in zip(params, launch.args):
            assert param.startswith(("float*", "const float*")) == (arg.ctype == "float"), (where, param, arg)
            if arg.storage == "arena":
                assert 0 <= arg.offset < p.arena_bytes, where
            else:
                assert arg.name in {d.value.name for d in p.graph.inputs} | {d.value.name for d in p.graph.params}
        assert launch.args[0].value == launch.stmt, where


def check_multi_tensor(p: Plan, launch: Launch, signature: str) -> None:
    """A multi-tensor launch: its segments' blocks follow each other and make its grid, each segment covers its
    statements' elements, and its arguments (the table's pointers) are those statements' results and inputs."""
    values = {s.out.name: s for s in p.graph.stmts}
    members = [launch.stmt, *launch.also]
    assert signature.strip() == "const long long* __restrict__ t"
    assert all(values[m].a.get("multi_tensor") for m in members)
    first, at = 0, 0
    for start, blocks, n, kind, count in launch.table:
        assert start == first and 1 <= blocks <= SEGMENT_BLOCKS and kind >= 0 and count <= launch.width - 4
        assert blocks == min(SEGMENT_BLOCKS, -(-n // launch.block[0]))
        first += blocks
        outs = [a.value for a in launch.args[at : at + count] if a.value in members]
        assert outs and all(values[o].out.type.numel == n for o in outs)
        at += count
    assert launch.grid == (first, 1, 1) and at == len(launch.args)
    assert launch.covers == sum(n for _, _, n, _, _ in launch.table)


@needs_compiler
@pytest.mark.parametrize("net", with_slow(sorted(SIZES)))
def test_every_kernel_of_every_network_compiles(net: str, compiled) -> None:  # noqa: ANN001
    b = compiled(net, SIZES[net], stop_at="plan").build
    assert b is not None
    progs = cuda.programs(b.train_plan, b.infer_plan)
    check_launches(b.train_plan, progs["train"])
    if "infer" in progs:
        infer = plan(api.optimise(infer_program(b.program.graph), api.Options())[0])
        check_launches(infer, progs["infer"])
    found = cuda.ptx_for(b.train_plan, b.infer_plan, ("sm_90", "sm_80"))  # one NVRTC program per network and arch
    for arch, text in found.items():
        assert f".target {arch}" in text
        version = re.search(r"^\.version (\d+)\.(\d+)", text, re.M)
        assert version and (int(version[1]), int(version[2])) <= (9, 0), "PTX newer than a CUDA 13.0 driver takes"
        entries = set(re.findall(r"\.entry (\w+)\(", text))
        for prog in progs.values():
            assert set(prog.kernels) <= entries


# ---- every op has a CUDA kernel ----


def test_every_registry_op_has_a_cuda_form() -> None:
    # (the data-parallel statements too: allreduce_start packs its bucket in a kernel, the *_at draws read the
    # shard's offset; the waits and slices are views, the all-reduces the runner's, backends/cuda/parallel.py)
    for name, op in REGISTRY.items():
        covered = (
            op.view or op.lower is not None or op.index_form is not None or name in ("fused", "indexed")
            or name == "cast_bf16"  # --precision bf16's cast: the NumPy runner's alone (the GPU runner refuses bf16)
            or op.cuda is not None or op.cuda_form is not None
        )  # fmt: skip
        assert covered, f"op {name} has no CUDA kernel"


def _neg_inf_pad(top: int, left: int, h: int, w: int):  # noqa: ANN202
    """The body of max pooling's explicit padding (frontend/convs.py): x placed at (top, left), -inf around it."""
    from deepdsl.ir.indexexpr import Affine, Apply, Const, Read, Var

    index = (Affine.var("n"), Affine.var("c"), Affine((("h", 1),), -top), Affine((("w", 1),), -left))
    inside = Apply("and", (
        Apply("and", (Apply(">=", (Var("h"), Const(top))), Apply("<", (Var("h"), Const(top + h))))),
        Apply("and", (Apply(">=", (Var("w"), Const(left))), Apply("<", (Var("w"), Const(left + w))))),
    ))  # fmt: skip
    return Apply("select", (inside, Read(0, index), Const(float("-inf"))))


def _op_plan() -> Plan:
    """One graph holding each op without an index form that the networks do not use."""
    b = GraphBuilder("Ops")
    f = lambda name, *shape: b.add_param(ParamDef(Value(name, TensorType(shape)), Init("constant", (0.0,))))  # noqa: E731
    labels = b.add_input(InputDef(Value("y", TensorType((4,), DType.I64)), "label", 10))
    x, g, s = f("x", 4, 10), f("g", 4, 10), f("s")
    step = b.add_input(InputDef(Value("step", TensorType((), DType.I64)), "step"))
    img, w3 = f("img", 2, 3, 9, 9), f("w", 6, 1, 3, 3)
    outs = [
        b.emit("softmax", x), b.emit("log_softmax", x), b.emit("softmax_backward", x, g),
        b.emit("log_softmax_backward", x, g), b.emit("cross_entropy", x, labels),
        b.emit("cross_entropy_backward", x, labels, s), b.emit("mse", x, g), b.emit("argmax", x),
        b.emit("accuracy", x, labels), b.emit("transpose", x, perm=(1, 0)),
        b.emit("pad_axis", x, axis=1, start=3, size=15), b.emit("sum_axes", img, axes=(0, 2)),
        b.emit("avg_pool2d", img, kernel=(3, 3), stride=(2, 2), pad=(1, 1)),
        b.emit("avg_pool2d_backward", f("gp", 2, 3, 5, 5), kernel=(3, 3), stride=(2, 2), pad=(1, 1),
               in_shape=(2, 3, 9, 9)),
        b.emit("conv2d", img, w3, stride=(2, 2), pad=(1, 1), groups=3),
        b.emit("conv2d_backward_data", f("gy", 2, 6, 5, 5), w3, stride=(2, 2), pad=(1, 1), groups=3,
               in_shape=(2, 3, 9, 9)),
        b.emit("conv2d_backward_filter", img, f("gy2", 2, 6, 5, 5), stride=(2, 2), pad=(1, 1), groups=3,
               w_shape=(6, 1, 3, 3)),
        b.emit("batch_matmul", f("a", 3, 4, 5), f("bb", 3, 6, 5), transpose_b=True),
        b.emit("matmul", f("m1", 5, 4), f("m2", 6, 5), transpose_a=True, transpose_b=True),
        b.emit("global_avg_pool", img),
        # the Transformer ops (issue 20): attention's softmax, causal (2 heads of 2 queries) and not; GELU
        b.emit("masked_softmax", x, scale=0.5, causal=True, period=2),
        b.emit("masked_softmax", x, scale=2.0, causal=False, period=1),
        b.emit("gelu", x), b.emit("gelu_grad", g, x),
        b.emit("layer_norm_rows", x, eps=1e-5), b.emit("layer_norm_rows_backward", x, g, eps=1e-5),
        # along axes (issue 34): a slice, explicit broadcasting, maxima along some axes and all, the arg-max mask
        b.emit("slice", img, axis=2, start=2, stop=7), b.emit("expand", f("e", 4, 1), shape=(4, 10)),
        b.emit("max_axes", img, axes=(1, 3)), b.emit("max_axes", x, axes=(0, 1)), b.emit("equal_mask", x, g),
        # the convolution family (issue 34): dilated convolutions, groups and unequal strides; a data gradient onto
        # an image larger than the convolution reads (conv_transpose's output padding); max pooling's -inf padding
        b.emit("conv2d", img, w3, stride=(1, 2), pad=(2, 1), groups=3, dilation=(2, 3)),
        b.emit("conv2d_backward_data", f("gyd", 2, 6, 9, 3), w3, stride=(1, 2), pad=(2, 1), groups=3,
               dilation=(2, 3), in_shape=(2, 3, 9, 10)),
        b.emit("conv2d_backward_filter", img, f("gyd2", 2, 6, 9, 3), stride=(1, 2), pad=(2, 1), groups=3,
               dilation=(2, 3), w_shape=(6, 1, 3, 3)),
        b.emit("indexed", img, out=(("n", 2), ("c", 3), ("h", 11), ("w", 10)), body=_neg_inf_pad(1, 0, 9, 9)),
        # sampling in the graph (issue 34): the draws of step 3
        b.emit("random_normal", step, shape=(4, 10), site="z", seed=5),
        b.emit("random_uniform", step, shape=(3, 7), site="u", seed=5, low=-0.5, high=2.0),
        # activations and adaptive pooling (issue 34)
        b.emit("hard_swish", x), b.emit("hard_swish_grad", g, x),
        b.emit("clip", x, low=-0.5, high=1.0), b.emit("clip_grad", g, x, low=-0.5, high=1.0),
        b.emit("silu", x), b.emit("silu_grad", g, x),
        b.emit("adaptive_pool_axis", img, axis=2, size=4), b.emit("adaptive_pool_axis", img, axis=3, size=5),
        b.emit("adaptive_pool_axis_backward", f("ga", 2, 3, 4, 9), axis=2, size=9),
    ]  # fmt: skip
    for k, v in enumerate(outs):
        b.output(f"o{k}", v)
    return plan(b.build())


@needs_compiler
def test_ops_outside_the_networks_compile() -> None:
    p = _op_plan()
    prog = translation.program(p)
    check_launches(p, prog)
    for arch in ("sm_90", "sm_80"):
        assert ".entry softmax__v" in nvrtc.ptx(prog.source, arch)


# ---- golden source ----


def test_lenet_golden(golden, compiled) -> None:  # noqa: ANN001
    c = compiled("lenet", stop_at="plan")
    prog = translation.program(c.plan)
    golden(GOLDEN / "cuda" / "lenet.train.cu", prog.body)
    rows = []
    for x in prog.launches:
        args = ", ".join(f"{a.name}" if a.storage == "tensor" else f"arena+{a.offset}" for a in x.args)
        rows.append(f"{x.kernel}<<<{x.grid}, {x.block}, smem {x.static_smem}>>>({args})  # {x.loop}, {x.covers}")
    golden(GOLDEN / "cuda" / "lenet.launches.txt", "\n".join(rows) + "\n")


# ---- index expression → CUDA, structurally ----


def _v(name: str, c: int = 1, const: int = 0) -> Affine:
    return Affine(((name, c),), const)


OUT = (("i0", 4), ("i1", 8))


@pytest.mark.parametrize(
    ("ie", "shapes", "text"),
    [
        (Apply("+", (Read(0, (_v("i0"), _v("i1"))), Read(1, (_v("i1"),)))), ((4, 8), (8,)),
         "(in0[8 * i0 + i1] + in1[i1])"),
        (Read(0, (_v("i0"), _v("i1", 1, -1))), ((4, 8),), "(i1 - 1 >= 0 ? in0[8 * i0 + i1 - 1] : 0.0f)"),
        (Read(0, (_v("i0"), _v("i1", 2, 1))), ((4, 8),), "(2 * i1 + 1 < 8 ? in0[8 * i0 + 2 * i1 + 1] : 0.0f)"),
        (Apply("select", (Apply(">", (Read(0, ()), Const(0.0))), Var("i1"), Const(-1.5))), ((),),
         "((in0[0] > 0.0f) ? (float) i1 : -1.5f)"),
        (Apply("sigmoid", (Read(0, ()),)), ((),), "(0.5f * (1.0f + tanhf(0.5f * in0[0])))"),
        (Apply("rsqrt", (Apply("+", (Read(0, ()), Const(1e-5))),)), ((),), "(1.0f / sqrtf((in0[0] + 1e-05f)))"),
        (Apply("max", (Read(0, ()), Const(float("-inf")))), ((),), "fmaxf(in0[0], __int_as_float(0xff800000))"),
        (Apply("and", (Apply("<", (Var("i0"), Const(2.0))), Apply("not", (Read(0, ()),)))), ((),),
         "((((float) i0 < 2.0f) && !(in0[0] != 0.0f)) ? 1.0f : 0.0f)"),
        (Apply("^", (Read(0, ()), Const(0.75))), ((),), "powf(in0[0], 0.75f)"),
    ],
)  # fmt: skip
def test_expression_text(ie, shapes, text) -> None:  # noqa: ANN001
    assert expressions.cuda_expr(ie, OUT, shapes) == text


def test_elementwise_kernel_is_one_flat_loop() -> None:
    body = Apply("max", (Apply("+", (Read(0, (_v("i0"), _v("i1"))), Read(1, ()))), Const(0.0)))
    k = kernels.ie_kernel("relu_add", body, OUT, ((4, 8), ()))
    assert "DD_GRID_STRIDE(e, 32) {\n    out[e] = fmaxf((in0[e] + in1[0]), 0.0f);\n  }" in k.text
    assert (k.grid, k.block, k.covers, k.loop) == ((1, 1, 1), (256, 1, 1), 32, "grid-stride")


def test_a_subexpression_used_again_is_computed_once() -> None:
    t = TensorType((4, 8))
    body = REGISTRY["gelu_grad"].index_form((t, t), t, {})  # t six times, the exponential twice (cexpr.Locals)
    k = kernels.ie_kernel("gelu_grad", body, OUT, ((4, 8), (4, 8)))
    assert k.text.count("expf(") == 1 and k.text.count("fabsf(") == 1 and k.text.count("(c1 * ") == 5
    assert (
        "    const float c0 = 0.70710677f * fabsf(in1[e]);\n    const float c1 = 1.0f / (1.0f + (0.3275911f * c0));"
        in k.text
    )
    twice = Reduce("sum", (("j", 3),), Read(0, (_v("i0"), _v("j"))))
    k = kernels.ie_kernel("sum_twice", Apply("*", (twice, twice)), OUT, ((4, 3),))
    assert k.text.count("for (int j") == 1 and "out[e] = (s0 * s0);" in k.text


def test_small_reduction_is_a_loop_per_thread() -> None:
    body = Reduce("max", (("j", 3),), Read(0, (_v("i0"), Affine((("i1", 1), ("j", 1)), -1))))
    k = kernels.ie_kernel("window_max", body, OUT, ((4, 8),))
    assert "float s0 = __int_as_float(0xff800000);" in k.text
    assert "for (int j = 0; j < 3; j++) {" in k.text
    assert "s0 = fmaxf(s0, (i1 + j - 1 >= 0 && i1 + j - 1 < 8 ? in0[8 * i0 + i1 + j - 1] : 0.0f));" in k.text
    assert k.loop == "grid-stride"


def test_large_reduction_is_shared_by_a_block() -> None:
    out = (("c", 16),)
    body = Apply("/", (Reduce("sum", (("n", 8), ("p", 100)), Read(0, (_v("n"), _v("c"), _v("p")))), Const(800.0)))
    k = kernels.ie_kernel("channel_mean", body, out, ((8, 16, 100),))
    assert "DD_BLOCK_STRIDE(e, 16) {" in k.text
    assert "for (int t = threadIdx.x; t < 800; t += blockDim.x) {" in k.text
    assert "int n = t / 100;" in k.text and "int p = t % 100;" in k.text
    assert "s0 = dd_block_sum(s0);" in k.text and "if (threadIdx.x == 0) out[e] = (s0 / 800.0f);" in k.text
    assert (k.grid, k.block, k.loop, k.static_smem) == ((16, 1, 1), (256, 1, 1), "block-stride", 128)


def test_index_names_that_clash_with_c_are_renamed() -> None:
    out = (("int", 3), ("e", 2))
    k = kernels.ie_kernel("k", Apply("+", (Var("int"), Var("e"))), out, ())
    assert "int int_2 = e / 2;" in k.text and "int e_2 = e % 2;" in k.text


def test_float_literals() -> None:
    assert expressions.float_literal(1.0) == "1.0f"
    assert expressions.float_literal(0.1) == "0.1f"
    assert expressions.float_literal(1e-5) == "1e-05f"
    assert expressions.float_literal(float("nan")) == "__int_as_float(0x7fffffff)"
    assert expressions.float_literal(1e39) == "__int_as_float(0x7f800000)"  # beyond float32


def test_dropout_mask_uses_the_splitmix_stream(compiled) -> None:  # noqa: ANN001
    from deepdsl import initializers
    from deepdsl.ops.random import STEP_MIX

    lib = translation.library_source()
    for const in (initializers.GAMMA, initializers._MUL1, initializers._MUL2, STEP_MIX):
        assert f"0x{const:016X}ull" in lib
    assert "z >> 40" in lib and "1.0 / 16777216.0" in lib and initializers._U24 == 1.0 / 16777216.0
    c = compiled("alexnet", SIZES["alexnet"], stop_at="plan")
    s = next(s for s in c.plan.graph.stmts if s.op == "dropout_mask")
    seed = initializers.stream_seed(s.a["site"] + "#dropout", s.a["seed"])
    assert (
        f"0x{seed:016X}ull, {s.a['p']!r}, {expressions.float_literal(1 / (1 - s.a['p']))})"
        in translation.program(c.plan).body
    )


# ---- the compiler ----


@needs_compiler
def test_a_warning_is_an_error() -> None:
    with pytest.raises(nvrtc.CudaCompileError, match="(?s)warned.*declared but never referenced"):
        nvrtc.ptx('extern "C" __global__ void f(float* o) { int unused; o[0] = 1.0f; }', "sm_80")
    with pytest.raises(nvrtc.CudaCompileError, match="could not compile"):
        nvrtc.ptx('extern "C" __global__ void f(float* o) { o[0] = ; }', "sm_90")


def test_no_compiler_is_a_clear_message(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvrtc, "_library", lambda: None)
    monkeypatch.setattr(nvrtc.shutil, "which", lambda name: None)
    with pytest.raises(nvrtc.NoCudaCompiler, match=r"no CUDA compiler found: install NVRTC"):
        nvrtc.ptx("", "sm_90")


@needs_compiler
def test_pinned_nvrtc_emits_ptx_old_drivers_take() -> None:
    version = nvrtc.nvrtc_version()
    if version is not None:  # 12.x emits PTX ISA 8.x, which every driver from CUDA 12.x's on takes (580 included)
        assert version[0] == 12, f"NVRTC {version}: pin nvidia-cuda-nvrtc-cu12 (docs/gpu.md, The CUDA kernels)"
    text = nvrtc.ptx('extern "C" __global__ void f(float* o) { o[threadIdx.x] = 0.0f; }', "sm_90")
    assert re.search(r"^\.version 8\.\d+$", text, re.M)


# ---- every kernel run on the CPU (g++, tests/backends/cuda_emulator.py) ----


def _values(p: Plan, seed: int = 0) -> dict:
    """Every value of the program, computed statement by statement with the NumPy kernels (float32)."""
    import numpy as np
    from oracle_inputs import draw

    from deepdsl.ops.indexed import apply_epilogue

    rng = np.random.default_rng(seed)
    g = p.graph
    env: dict = {}
    for d in g.inputs:
        t = d.value.type
        env[d.value.name] = (
            draw(t, rng, dtype=np.float32) if d.kind == "input"  # both signs and zeros (tests/oracle_inputs.py)
            else rng.integers(0, d.classes, t.shape) if d.kind == "label" else np.asarray(3, dtype=np.int64)
        )  # fmt: skip
    for d in g.params:
        env[d.value.name] = rng.uniform(-1.0, 1.5, d.value.type.shape).astype(np.float32)  # both signs, mostly +
    with np.errstate(all="ignore"):
        for s in g.stmts:
            op = REGISTRY[s.op]
            xs = tuple(env[v.name] for v in s.inputs)
            if "epilogue" in s.a:
                out = apply_epilogue(op.numpy(xs[: op.arity], s.a), xs[op.arity :], s.a["epilogue"])
            else:
                out = op.numpy(xs, s.a)
            dtype = np.int64 if s.out.type.dtype is DType.I64 else np.float32
            env[s.out.name] = np.ascontiguousarray(out, dtype=dtype)
    return env


TINY_BN = """network T
const N = 4
input x : [N, 3, 8, 8]
label y : [N] classes 10
layer cv = conv(6, kernel=3, pad=1)
layer fc = full(10)
net = fc o flatten o max_pool(2, stride=2) o relu o batch_norm o cv
loss = softmax_cross_entropy(net(x), y)
predict = net(x)
train { optimizer = sgd(lr=0.1, momentum=0.9) iterations = 1 seed = 1 }
"""


def _emulation_plan(case: str, compiled) -> Plan:  # noqa: ANN001
    if case == "ops":
        return _op_plan()
    if case == "tiny_bn":
        return api.compile_source(TINY_BN, "tiny.ddsl", stop_at="plan").plan
    return compiled(case, REDUCED[case][0], stop_at="plan").plan


needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ to run the kernels on the CPU")


@needs_gxx
@pytest.mark.parametrize("case", with_slow(["ops", "tiny_bn", "lenet", "small", "alexnet", "googlenet"]))
def test_kernels_agree_with_numpy(case: str, tmp_path: Path, compiled) -> None:  # noqa: ANN001
    """Every statement's launches, run on the CPU, give the NumPy kernel's result (dropout masks bit for bit).
    Block-stride launches (and in the networks the grid-stride ones) run with fewer blocks and threads, which
    their loops allow, so that the test stays quick; the tiled ones as planned."""

    import numpy as np

    p = _emulation_plan(case, compiled)
    prog = translation.program(p)
    lib = emulate(prog.source, prog.kernels, tmp_path)
    env = _values(p)
    by_stmt: dict[str, list] = {}
    for x in prog.launches:
        by_stmt.setdefault(x.stmt, []).append(x)
    big = case in ("lenet", "small", "alexnet", "googlenet")
    ops = set()
    grouped = 0
    for stmt, launches in by_stmt.items():
        first = launches[0]
        slow = any(x.loop not in ("grid-stride", "multi-tensor") for x in launches) and (
            first.op in ops or first.covers > 4096
        )
        if big and (slow or any(x.loop == "tiles" and math.prod(x.grid) > 16 for x in launches)):
            continue  # a few small statements of each op: cooperative kernels are slow as fibers
        # a group's kernel computes several statements (ir/groups.py), a multi-tensor launch every update
        results = (stmt, *first.also)
        arrays = {r: np.zeros_like(env[r]) for r in results}
        for x in launches:
            ptrs = []
            for k, arg in enumerate(x.args):
                if (k < len(results) and not x.table) or arg.value in results:
                    ptrs.append(arrays[results[k] if k < len(results) and not x.table else arg.value].ctypes.data)
                elif arg.value.startswith("workspace:"):  # a statement's planned scratch (a split sum's partial
                    # sums, ir/reductions.py; a split filter gradient's), NaN until written
                    ws = p.workspace[arg.value.split(":", 1)[1]]
                    ptrs.append(arrays.setdefault(arg.value, np.full(ws.nbytes, 0xFF, np.uint8)).ctypes.data)
                else:
                    ptrs.append(arrays.setdefault(arg.value, np.array(env[arg.value], order="C")).ctypes.data)
            if x.table:  # the kernel's one argument: the table of its segments' sizes and pointers
                table = multi_table(x, ptrs)
                ptrs = [table.ctypes.data]
            run_launch(lib, x, ptrs, small=big)
        for r in results:
            out, want = arrays[r], env[r]
            if first.op == "dropout_mask":
                assert np.array_equal(out, want), stmt
            else:
                finite = np.abs(want[np.isfinite(want)])
                scale = float(finite.max(initial=1.0))  # sums of many terms: the error is relative to their size
                np.testing.assert_allclose(
                    out, want, rtol=2e-4, atol=1e-5 * scale, equal_nan=True, err_msg=first.kernel
                )
        ops.add(first.op)
        grouped += len(first.also)
    assert len(ops) >= 5
    assert grouped > 0 or case == "ops"  # the networks' momentum and step run as one kernel
