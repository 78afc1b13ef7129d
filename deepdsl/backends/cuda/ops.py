"""The CUDA code of the ops without an index form, attached to their registry entries.

`cuda_kernel` entries call a hand-written function of library.cu with the statement's shapes as constants,
and say how to launch it; `cuda_form` entries are shape ops the CUDA backend writes as index expressions
(transpose, slice, concat, ...), whose kernels `kernels.ie_kernel` writes like those of the element-wise ops.
Importing the package `deepdsl.backends.cuda` fills these fields.
"""

from __future__ import annotations

import itertools
import math

import deepdsl.ops  # noqa: F401 — the registry's entries, which this module attaches its CUDA fields to
from deepdsl.backends.cuda.expressions import float_literal
from deepdsl.backends.cuda.kernels import Form, library_call
from deepdsl.backends.cuda.launch import (
    GEMM_SMEM,
    TILE,
    TILE_M,
    TILE_N,
    Kernel,
    c_ints,
    elementwise_launch,
    one_block_launch,
    row_launch,
)
from deepdsl.backends.escape import c_comment
from deepdsl.initializers import stream_seed
from deepdsl.ir import Stmt
from deepdsl.ir.analysis import output_indices
from deepdsl.ir.indexexpr import IE, Affine, Apply, Const, Read, Reduce, Var
from deepdsl.ir.printer import format_stmt
from deepdsl.ir.registry import cuda_form, cuda_kernel
from deepdsl.ir.vendor import Gemm, vendor_call
from deepdsl.ops.conv import filter_gradient_splits

# ---- library calls ----


def _conv_geometry(s: Stmt) -> tuple[int, ...]:
    a = s.a
    if s.op == "conv2d":
        x, w, y = s.inputs[0].type.shape, s.inputs[1].type.shape, s.out.type.shape
    elif s.op == "conv2d_backward_data":
        g, w, x = s.inputs[0].type.shape, s.inputs[1].type.shape, tuple(a["in_shape"])
        y = g
    else:
        x, y, w = s.inputs[0].type.shape, s.inputs[1].type.shape, tuple(a["w_shape"])
    n, c, h, wd = x
    f, _, kh, kw = w
    (sh, sw), (ph, pw), (dh, dw) = a["stride"], a["pad"], a.get("dilation", (1, 1))
    return n, c, h, wd, f, kh, kw, y[2], y[3], sh, sw, ph, pw, a["groups"], dh, dw


def _conv(name: str, s: Stmt, ct: tuple[str, ...], workspace: int = 0) -> Kernel:
    """Implicit GEMMs on library.cu's register tiles (dd_tiled), per group: forward and backward-data over the output
    pixels, backward-filter over the weights with its reduction over N*OH*OW split into slices (blockIdx.z: group and
    slice) whose partial sums go to the statement's planned `workspace` bytes, then a finishing kernel adds them up
    in slice order. Without enough workspace (over the plan's limit) it does not split."""
    geometry = _conv_geometry(s)
    n, c, h, w, f, kh, kw = geometry[:7]
    oh, ow, groups = geometry[7], geometry[8], geometry[13]
    numel = s.out.type.numel
    tiled = {"block": (TILE, TILE, 1), "static_smem": GEMM_SMEM, "covers": numel, "loop": "tiles"}
    if s.op == "conv2d_backward_filter":
        cols = c // groups * kh * kw
        splits = filter_gradient_splits(f // groups, cols, groups, n * oh * ow)
        scratch = splits * numel * 4 if splits > 1 else 0
        if scratch > workspace:
            splits, scratch = 1, 0
        grid = (-(-cols // TILE_N), -(-(f // groups) // TILE_M), groups * splits)
        ws = "ws" if scratch else "nullptr"
        call = f"dd_conv2d_backward_filter(out, in0, in1, {ws}, {splits}, {c_ints(*geometry)})"
        finish = None
        if scratch:
            finish = library_call(f"{name}_finish", s, ("float",), "float",
                                  f"dd_conv2d_backward_filter_finish(out, in0, {c_ints(numel, splits)})",
                                  **elementwise_launch(numel))  # fmt: skip
        return library_call(name, s, ct[:2], "float", call, grid=grid, tiles=(cols, f // groups, groups),
                            scratch=scratch, finish=finish, **tiled)  # fmt: skip
    if s.op == "conv2d":
        fn, rows, cols = "dd_conv2d_igemm", f // groups, n * oh * ow
        grid = (-(-cols // TILE_N), -(-rows // TILE_M), groups)
    else:  # with a stride, one block z per group and phase of the input pixels (the taps that reach them)
        fn, rows, cols = "dd_conv2d_backward_data_igemm", c // groups, n * h * w
        sh, sw = geometry[9], geometry[10]
        grid = (-(-n * -(-h // sh) * -(-w // sw) // TILE_N), -(-rows // TILE_M), groups * sh * sw)
    call = f"{fn}(out, in0, in1, {c_ints(*geometry)})"
    return library_call(name, s, ct[:2], "float", call, grid=grid, tiles=(cols, rows, groups), **tiled)


def _pool_geometry(s: Stmt) -> str:
    x = s.inputs[0].type.shape if s.op != "avg_pool2d_backward" else tuple(s.a["in_shape"])
    y = s.out.type.shape if s.op == "max_pool2d" else s.inputs[-1].type.shape
    (kh, kw), (sh, sw), (ph, pw) = s.a["kernel"], s.a["stride"], s.a["pad"]
    return c_ints(x[0] * x[1], x[2], x[3], y[2], y[3], kh, kw, sh, sw, ph, pw)


def _max_pool(name: str, s: Stmt, ct: tuple[str, ...]) -> Kernel:
    return library_call(
        name, s, ct, "float", f"dd_max_pool2d(out, in0, {_pool_geometry(s)})", **elementwise_launch(s.out.type.numel)
    )


def _max_pool_backward(name: str, s: Stmt, ct: tuple[str, ...]) -> Kernel:
    call = f"dd_max_pool2d_backward(out, in0, in1, in2, {_pool_geometry(s)})"
    return library_call(name, s, ct, "float", call, **elementwise_launch(s.out.type.numel))


def _avg_pool_backward(name: str, s: Stmt, ct: tuple[str, ...]) -> Kernel:
    call = f"dd_avg_pool2d_backward(out, in0, {_pool_geometry(s)})"
    return library_call(name, s, ct, "float", call, **elementwise_launch(s.out.type.numel))


def _gemm(name: str, s: Stmt, ct: tuple[str, ...]) -> Kernel:
    """Our register-tiled SGEMM (library.cu dd_tiled), for the GEMM the entry's vendor fact describes (the same one
    cuBLAS would run)."""
    g = vendor_call(s)
    assert isinstance(g, Gemm), f"%{s.out.name} = {s.op}: its vendor fact is not a GEMM"
    grid = (-(-g.n // TILE_N), -(-g.m // TILE_M), g.batch)
    call = f"dd_gemm(out, in0, in1, {c_ints(g.m, g.n, g.k, g.transpose_a, g.transpose_b)})"
    return library_call(name, s, ct[:2], "float", call, grid=grid, block=(TILE, TILE, 1), static_smem=GEMM_SMEM,
                        covers=s.out.type.numel, loop="tiles", tiles=(g.n, g.m, g.batch))  # fmt: skip


def _axis1(shape: tuple[int, ...]) -> tuple[int, int, int]:
    return shape[0], shape[1], math.prod(shape[2:])


def _softmax(name: str, s: Stmt, ct: tuple[str, ...]) -> Kernel:
    a, d, b = _axis1(s.inputs[0].type.shape)
    log = int(s.op.startswith("log_"))
    if s.op.endswith("_backward"):
        call = f"dd_softmax_backward(out, in0, in1, {c_ints(a, d, b, log)})"
    else:
        call = f"dd_softmax(out, in0, {c_ints(a, d, b, log)})"
    return library_call(name, s, ct, "float", call, **row_launch(a * b, s.out.type.numel))


def _masked_softmax(name: str, s: Stmt, ct: tuple[str, ...]) -> Kernel:
    rows, cols = s.inputs[0].type.shape
    flags = c_ints(rows, cols, s.a["period"], int(bool(s.a["causal"])))
    call = f"dd_masked_softmax(out, in0, {flags}, {float_literal(s.a['scale'])})"
    return library_call(name, s, ct, "float", call, **row_launch(rows, s.out.type.numel))


def _loss(name: str, s: Stmt, ct: tuple[str, ...]) -> Kernel:
    k = s.inputs[0].type.shape[-1]
    n = s.inputs[0].type.numel // k  # every position a row: scores [N, K] or [N, T, K]
    if s.op == "softmax_cross_entropy_backward":
        launch = row_launch(n, n * k)
    elif s.op == "cross_entropy_backward":
        launch = elementwise_launch(n * k)
    else:
        launch = one_block_launch(1)
    ins = "in0, in1, in2" if s.op.endswith("_backward") else "in0, in1"
    return library_call(name, s, ct, "float", f"dd_{s.op}(out, {ins}, {c_ints(n, k)})", **launch)


def _argmax(name: str, s: Stmt, ct: tuple[str, ...]) -> Kernel:
    n, k = s.inputs[0].type.shape
    return library_call(name, s, ct, "long long", f"dd_argmax(out, in0, {c_ints(n, k)})", **elementwise_launch(n))


def _accuracy(name: str, s: Stmt, ct: tuple[str, ...]) -> Kernel:
    n, k = s.inputs[0].type.shape
    return library_call(name, s, ct, "float", f"dd_accuracy(out, in0, in1, {c_ints(n, k)})", **one_block_launch(1))


def _lrn(name: str, s: Stmt, ct: tuple[str, ...]) -> Kernel:
    n, c, h, w = s.inputs[0].type.shape
    a = s.a
    consts = f"{c_ints(n, c, h * w, a['size'])}, {float_literal(a['k'])}, {float_literal(a['alpha'])}, " \
             f"{float_literal(a['beta'])}"  # fmt: skip
    ins = "in0, in1, in2" if s.op == "lrn_backward" else "in0"
    return library_call(
        name, s, ct, "float", f"dd_{s.op}(out, {ins}, {consts})", **elementwise_launch(s.out.type.numel)
    )


def _layer_norm_rows(name: str, s: Stmt, ct: tuple[str, ...]) -> Kernel:
    rows, d = s.inputs[0].type.shape
    ins = "in0, in1" if s.op.endswith("_backward") else "in0"
    call = f"dd_{s.op}(out, {ins}, {c_ints(rows, d)}, {float_literal(s.a['eps'])})"
    return library_call(name, s, ct, "float", call, **row_launch(rows, s.out.type.numel))


def _bn_train_backward(name: str, s: Stmt, ct: tuple[str, ...]) -> Kernel:
    _, c, *rest = s.inputs[0].type.shape
    n = s.out.type.numel
    call = f"dd_bn_train_backward(out, in0, in1, in2, in3, in4, in5, in6, {c_ints(n, c, math.prod(rest))}, " \
           f"{float_literal(s.a['eps'])})"  # fmt: skip
    return library_call(name, s, ct, "float", call, **elementwise_launch(n))


def _dropout_mask(name: str, s: Stmt, ct: tuple[str, ...]) -> Kernel:
    a = s.a
    n = s.out.type.numel
    stream = stream_seed(a["site"] + "#dropout", a["seed"])
    keep = float_literal(1.0 / (1.0 - a["p"]))
    call = f"dd_dropout_mask(out, in0, {n}, 0x{stream:016X}ull, {float(a['p'])!r}, {keep})"
    return library_call(name, s, ct, "float", call, **elementwise_launch(n))


def _random(name: str, s: Stmt, ct: tuple[str, ...]) -> Kernel:
    # normal(shape) and uniform(shape, low, high) of ops/random.py: the draws of the step in in0
    a = s.a
    n = s.out.type.numel
    stream = stream_seed(a["site"] + "#sample", a["seed"])
    extra = "" if s.op == "random_normal" else f", {float(a['low'])!r}, {float(a['high'])!r}"
    call = f"dd_{s.op}(out, in0, {n}, 0x{stream:016X}ull{extra})"
    return library_call(name, s, ct, "float", call, **elementwise_launch(n))


def _draws_at(name: str, s: Stmt, ct: tuple[str, ...]) -> Kernel:
    """dropout_mask_at / random_normal_at / random_uniform_at (ops/collective.py): a data-parallel shard's draws,
    from its first sample's place in the global batch (in1, the shard's offset) on."""
    a = s.a
    shape = tuple(a["shape"])
    n, per = math.prod(shape), math.prod(shape[1:])
    if s.op == "dropout_mask_at":
        stream = stream_seed(a["site"] + "#dropout", a["seed"])
        keep = float_literal(1.0 / (1.0 - a["p"]))
        extra = f", {float(a['p'])!r}, {keep}"
    else:
        stream = stream_seed(a["site"] + "#sample", a["seed"])
        extra = "" if s.op == "random_normal_at" else f", {float(a['low'])!r}, {float(a['high'])!r}"
    call = f"dd_{s.op}(out, in0, in1[0] * {per}LL, {n}, 0x{stream:016X}ull{extra})"
    return library_call(name, s, ct, "float", call, **elementwise_launch(n))


def _pack(name: str, s: Stmt, ct: tuple[str, ...]) -> Kernel:
    """allreduce_start's pack (ops/collective.py): the bucket's tensors (in1, in2, ...) flattened one after the other,
    each element times the scale in0[0], one float32 product as the NumPy kernel's. An element finds its tensor by a
    binary search of the tensors' ends. Under --precision bf16 a weight's gradient is stored in bf16 and its bucket
    in float32: such a tensor is read widened (its entry of `half` set)."""
    sizes = tuple(int(n) for n in s.a["sizes"])
    ends = list(itertools.accumulate(sizes))
    k, total = len(sizes), ends[-1]
    mixed = any(t != "float" for t in ct[1:])
    pointers = ", ".join(f"{'(const void*) ' if mixed else ''}in{j + 1}" for j in range(k))
    params = ", ".join(f"const {t}* __restrict__ in{j}" for j, t in enumerate(ct))
    parts = [f"  const void* parts[{k}] = {{{pointers}}};",
             f"  const bool half[{k}] = {{{', '.join('true' if t != 'float' else 'false' for t in ct[1:])}}};"] \
        if mixed else [f"  const float* parts[{k}] = {{{pointers}}};"]  # fmt: skip
    at = "e - (lo ? ends[lo - 1] : 0)"
    read = (f"(half[lo] ? (float) static_cast<const dd_bf16*>(parts[lo])[{at}] : "
            f"static_cast<const float*>(parts[lo])[{at}])") if mixed else f"parts[lo][{at}]"  # fmt: skip
    text = "\n".join([
        f"// {c_comment(format_stmt(s))}",
        f'extern "C" __global__ void {name}(float* __restrict__ out, {params}) {{',
        *parts,
        f"  const int ends[{k}] = {{{c_ints(*ends)}}};",
        "  const float scale = in0[0];",
        f"  DD_GRID_STRIDE(e, {total}) {{",
        f"    int lo = 0, hi = {k - 1};",
        "    while (lo < hi) { int mid = (lo + hi) >> 1; if (e < ends[mid]) hi = mid; else lo = mid + 1; }",
        f"    out[e] = {read} * scale;",
        "  }",
        "}",
    ])  # fmt: skip
    return Kernel(text, **elementwise_launch(total))


cuda_kernel("conv2d", "conv2d_backward_data", "conv2d_backward_filter")(_conv)
cuda_kernel("max_pool2d")(_max_pool)
cuda_kernel("max_pool2d_backward")(_max_pool_backward)
cuda_kernel("avg_pool2d_backward")(_avg_pool_backward)
cuda_kernel("linear", "matmul", "batch_matmul")(_gemm)
cuda_kernel("softmax", "log_softmax", "softmax_backward", "log_softmax_backward")(_softmax)
cuda_kernel("masked_softmax")(_masked_softmax)
cuda_kernel("softmax_cross_entropy", "softmax_cross_entropy_backward", "cross_entropy", "cross_entropy_backward")(_loss)
cuda_kernel("argmax")(_argmax)
cuda_kernel("accuracy")(_accuracy)
cuda_kernel("lrn", "lrn_backward")(_lrn)
cuda_kernel("layer_norm_rows", "layer_norm_rows_backward")(_layer_norm_rows)
cuda_kernel("bn_train_backward")(_bn_train_backward)
cuda_kernel("dropout_mask")(_dropout_mask)
cuda_kernel("random_normal", "random_uniform")(_random)
cuda_kernel("dropout_mask_at", "random_normal_at", "random_uniform_at")(_draws_at)
cuda_kernel("allreduce_start")(_pack)


# ---- ops the CUDA backend writes as index expressions (they have no index form of their own) ----


def _var(name: str) -> Affine:
    return Affine.var(name)


def _transpose_form(s: Stmt) -> Form:
    perm = tuple(s.a["perm"])
    index = [Affine((), 0)] * len(perm)
    for k, p in enumerate(perm):
        index[p] = _var(f"i{k}")
    return Read(0, tuple(index)), output_indices(s.out.type)


def _shifted(rank: int, axis: int, shift: int) -> tuple[Affine, ...]:
    return tuple(Affine(((f"i{k}", 1),), shift if k == axis else 0) for k in range(rank))


def _slice_form(s: Stmt) -> Form:
    return Read(0, _shifted(s.out.type.rank, s.a["axis"], s.a["start"])), output_indices(s.out.type)


def _pad_axis_form(s: Stmt) -> Form:
    return Read(0, _shifted(s.out.type.rank, s.a["axis"], -s.a["start"])), output_indices(s.out.type)


def _concat_form(s: Stmt) -> Form:
    axis, rank = s.a["axis"], s.out.type.rank
    starts, at = [], 0
    for v in s.inputs:
        starts.append(at)
        at += v.type.shape[axis]
    body: IE = Read(len(s.inputs) - 1, _shifted(rank, axis, -starts[-1]))
    for k in reversed(range(len(s.inputs) - 1)):
        test = Apply("<", (Var(f"i{axis}"), Const(float(starts[k + 1]))))
        body = Apply("select", (test, Read(k, _shifted(rank, axis, -starts[k])), body))
    return body, output_indices(s.out.type)


def _sum_axes_form(s: Stmt) -> Form:
    shape = s.inputs[0].type.shape
    axes = set(s.a["axes"])
    kept = [k for k in range(len(shape)) if k not in axes]
    out = tuple((f"i{j}", shape[k]) for j, k in enumerate(kept))
    index = tuple(_var(f"i{kept.index(k)}") if k in kept else _var(f"r{k}") for k in range(len(shape)))
    body = Reduce("sum", tuple((f"r{k}", shape[k]) for k in sorted(axes)), Read(0, index))
    return body, out


def _global_avg_pool_form(s: Stmt) -> Form:
    h, w = s.inputs[0].type.shape[2:]
    body = Reduce("sum", (("h", h), ("w", w)), Read(0, (_var("i0"), _var("i1"), _var("h"), _var("w"))))
    return Apply("/", (body, Const(float(h * w)))), output_indices(s.out.type)


def _global_avg_pool_backward_form(s: Stmt) -> Form:
    h, w = s.out.type.shape[2:]
    zero = Affine((), 0)
    return Apply("/", (Read(0, (_var("i0"), _var("i1"), zero, zero)), Const(float(h * w)))), output_indices(s.out.type)


def _avg_pool_form(s: Stmt) -> Form:
    (kh, kw), (sh, sw), (ph, pw) = s.a["kernel"], s.a["stride"], s.a["pad"]
    index = (_var("i0"), _var("i1"), Affine((("i2", sh), ("ki", 1)), -ph), Affine((("i3", sw), ("kj", 1)), -pw))
    body = Reduce("sum", (("ki", kh), ("kj", kw)), Read(0, index))
    return Apply("/", (body, Const(float(kh * kw)))), output_indices(s.out.type)


def _mse_form(s: Stmt) -> Form:
    shape = s.inputs[0].type.shape
    rs = tuple((f"r{k}", n) for k, n in enumerate(shape))
    index = tuple(_var(v) for v, _ in rs)
    d = Apply("-", (Read(0, index), Read(1, index)))
    return Apply("/", (Reduce("sum", rs, Apply("*", (d, d))), Const(float(math.prod(shape))))), ()


cuda_form("transpose")(_transpose_form)
cuda_form("slice")(_slice_form)
cuda_form("pad_axis")(_pad_axis_form)
cuda_form("concat")(_concat_form)
cuda_form("sum_axes")(_sum_axes_form)
cuda_form("global_avg_pool")(_global_avg_pool_form)
cuda_form("global_avg_pool_backward")(_global_avg_pool_backward_form)
cuda_form("avg_pool2d")(_avg_pool_form)
cuda_form("mse")(_mse_form)


def _cast_bf16_form(s: Stmt) -> Form:
    """--precision bf16's cast: a copy whose store into the bf16 result rounds (library.cu dd_bf16)."""
    out = output_indices(s.out.type)
    return Read(0, tuple(_var(v) for v, _ in out)), out


cuda_form("cast_bf16")(_cast_bf16_form)
