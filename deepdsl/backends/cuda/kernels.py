"""A Plan as one CUDA C translation unit: one `extern "C" __global__` kernel per statement, and its launches.

Statements with an index expression (element-wise, fused and `indexed` ones, every op with a registry
`index_form`, and the shape ops written here as index expressions) become kernels written from that
expression, with the meaning of `ops.indexed.evaluate`: a read outside its input is 0, `Reduce` sums or
maximises over its ranges, comparisons are C booleans. One thread computes one output element in a
grid-stride loop; a body whose outermost work is a reduction (channel statistics, `sum`, a mean) runs one
block per output element instead, its threads sharing the reduction through `dd_block_sum` / `dd_block_max`.
A large sum (ir/reductions.py: batch-norm statistics, dgamma and dbeta, bias gradients, sums over the batch) is
split over blocks instead: a 2-D grid (blockIdx.y a piece of the range: batch rows outer, the rest inner and
contiguous, no division per element, the inner loop unrolled), partial sums in double in the statement's planned
workspace, and in the same launch the last block to finish (library.cu `dd_last_block`: a fence, then a count on a
counter of the module) adds each output's partial sums in slice order (the same bits every run, whichever block is
last) and writes the results; reductions over the same range run in one such pass (a batch norm's mean and
variance, its sum and sum of squares, with the running statistics' updates done by that last block; dgamma with
dbeta).
The other ops call a hand-written function of library.cu with the statement's shapes as constants: their
registry entries' `cuda` field (ops.py), as the shape ops' `cuda_form` is their index expression here.

Each kernel's launch is data (`Launch`): grid, block, shared memory and where each pointer argument lives
(an arena offset from the plan, or a program tensor by name).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib.resources import files
from typing import Any

import numpy as np

from deepdsl.backends import cexpr
from deepdsl.backends.cexpr import Locals, cuda_dialect
from deepdsl.backends.collapse import collapse
from deepdsl.backends.escape import c_comment
from deepdsl.backends.loops import LoopGen
from deepdsl.backends.sizes import Sizes
from deepdsl.ir import REGISTRY, Stmt
from deepdsl.ir.analysis import index_form, output_indices, own_index, top_reductions
from deepdsl.ir.graph import Value
from deepdsl.ir.groups import group_form, is_flat
from deepdsl.ir.indexexpr import (
    IE,
    Affine,
    Apply,
    Const,
    Read,
    Reduce,
    Var,
    format_ie,
    reads,
    renumber,
    shared_subexpressions,
)  # fmt: skip
from deepdsl.ir.printer import format_stmt
from deepdsl.ir.reductions import THREADS, ReductionGroup, is_total, reduction_group, reduction_groups
from deepdsl.ir.types import DType
from deepdsl.ir.vendor import VendorCall, vendor_call
from deepdsl.memory.groups import planned_groups
from deepdsl.memory.launches import pass_scratch, planned_launches
from deepdsl.memory.plan import Plan
from deepdsl.ops.conv import OWN_TILE

BLOCK = 256  # threads per block of the element-wise and row kernels
TILE = 16  # the threads of a tiled kernel's block: TILE x TILE (library.cu dd_tiled)
TILE_M, TILE_N, TILE_K = OWN_TILE  # a tiled kernel's block tile: rows, columns, a step (DD_BM, DD_BN, DD_BK)
MAX_GRID = 1 << 16  # blocks of a grid-stride launch at most (its loop covers the rest)
VECTOR = 4  # floats in one vector load or store (float4)
VECTOR_ALIGN = 16  # bytes: the alignment a float4 access needs (every planned buffer has ALIGN, memory/plan.py)
SEGMENT_BLOCKS = 1024  # blocks of one segment of a multi-tensor launch at most (its loop covers the rest)
MAX_THREADS = 1024  # device limits the launches are checked against
MAX_STATIC_SMEM = 48 * 1024
GRID_LIMITS = (2**31 - 1, 65535, 65535)
BLOCK_SMEM = 32 * 4  # dd_block_sum / dd_block_max: one float per warp
GEMM_SMEM = 2 * TILE_K * (TILE_M + 4 + TILE_N + 4) * 4  # dd_tiled's two buffers of A's and B's tiles (padded rows)
SPLIT_SMEM = 1024 * 8 + 4  # dd_block_sum_double: one double per thread; dd_last_block: its flag (a bool, padded)


@dataclass(frozen=True)
class Arg:
    """A pointer argument: an arena region (byte offset from the plan) or a program tensor by name."""

    value: str  # the IR value passed
    storage: str  # "arena" or "tensor" (an input, parameter or state tensor, which lives outside the arena)
    name: str  # the tensor's name (storage "tensor"), else the value whose buffer holds it (a view's base)
    offset: int  # byte offset in the arena (0 for a tensor)
    ctype: str  # "float" or "long long"


@dataclass(frozen=True)
class Launch:
    kernel: str
    stmt: str  # the statement's result value
    op: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int  # dynamic shared memory (0: the kernels use static shared memory only)
    static_smem: int  # bytes of static shared memory the kernel declares
    args: tuple[Arg, ...]  # the output first
    covers: int  # output elements the kernel's loops write, by construction
    loop: str  # "grid-stride" (threads over elements), "block-stride" (blocks over rows), "one-block", "tiles"
    tiles: tuple[int, int, int] = (0, 0, 0)  # loop "tiles": (N, M, batch) of the GEMM
    also: tuple[str, ...] = ()  # the other statements the kernel computes (ir/groups.py); their results follow the
    # first output among the arguments
    vendor: VendorCall | None = None  # the vendor routine that may run instead, on the same arguments (ir/vendor.py)
    # a multi-tensor launch (loop "multi-tensor", ir/launches.py): per segment (first block, blocks, elements, kind,
    # pointers), in order; `args` holds every segment's pointers one after the other, and the kernel takes one
    # argument instead, a table the runner fills once (`multi_table`): the segment count, then a row of `width`
    # 64-bit numbers per segment, its table entries then its pointers
    table: tuple[tuple[int, int, int, int, int], ...] = ()
    width: int = 0
    finishes: bool = False  # the finishing launch of the statement's own kernel: none where a vendor routine serves it


@dataclass(frozen=True)
class CudaProgram:
    source: str  # the translation unit
    kernels: tuple[str, ...]  # kernel names, in launch order
    launches: tuple[Launch, ...]  # in program order
    body: str = ""  # the program's kernels alone (source without the library)
    # after the launches: (result, tensor, bytes) for each update not computed in place, copied into its tensor
    copies: tuple[tuple[Arg, str, int], ...] = ()
    results: tuple[tuple[str, Arg], ...] = ()  # the program's outputs (loss, predict, ...) and where they are


def library_source() -> str:
    return files("deepdsl.backends.cuda").joinpath("library.cu").read_text()


def entries_source() -> str:
    """entries.cu: the library's ops as kernels taking their sizes as arguments (the Java CUDA device's)."""
    return files("deepdsl.backends.cuda").joinpath("entries.cu").read_text()


# ---- scalar expressions ----

_KEYWORDS = {"e", "t", "out", "auto", "int", "float", "double", "long", "if", "else", "for", "while", "do", "return",
             "char", "short", "signed", "unsigned", "const", "void", "case", "switch", "break", "continue", "goto",
             "static", "struct", "union", "enum", "register", "extern", "volatile", "new", "delete", "this",
             "class", "template", "typename", "default", "sizeof", "inline", "bool", "true", "false"}  # fmt: skip


def float_literal(v: float) -> str:
    """The C float literal of `v` rounded to float32."""
    with np.errstate(over="ignore"):
        f = np.float32(v)
    if math.isnan(f):
        return "__int_as_float(0x7fffffff)"
    if math.isinf(f):
        return "__int_as_float(0x7f800000)" if f > 0 else "__int_as_float(0xff800000)"
    text = str(f)  # the shortest decimal that reads back as this float32
    return f"{text}f" if any(ch in text for ch in ".e") else f"{text}.0f"


CUDA = cuda_dialect(float_literal)


@dataclass
class Gen(LoopGen):
    """A CUDA kernel being printed (backends/loops.py): reads through the kernel's pointer arguments (`in0[i]`, a
    flat kernel's `in0[e]`), integer inputs cast to float, and a body whose outermost work is a reduction shared by
    the block's threads where `cooperative`."""

    DIALECT = CUDA
    RESERVED = re.compile(r"(in|s|no|sto)\d+|(n|st)\d+_\d+")

    taken: set[str] = field(default_factory=lambda: set(_KEYWORDS))
    own: tuple[tuple[Affine, ...], tuple[int, ...]] | None = None  # the output's index and shape (read as [e])
    ctypes: tuple[str, ...] = ()
    cooperative: bool = False  # top-level reductions are shared by the block's threads

    def usable(self, var: str) -> bool:
        return re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", var) is not None and not var.startswith("dd_")

    def numbered(self, base: str, k: int) -> str:
        return f"{base}_{k}"

    def read(self, r: Read) -> str:
        if r.input in self.registers:
            return self.registers[r.input]
        cast = "(float) " if self.ctypes and self.ctypes[r.input] != "float" else ""
        if self.flat:
            return f"{cast}in{r.input}[{'e' if r.index else '0'}]"
        if self.own and r.index == self.own[0] and self.shapes[r.input] == self.own[1]:
            return f"{cast}in{r.input}[e]"  # the output's own element
        if self.sizes is not None:  # each axis's index times its stride, tested against its dim
            element = f"{cast}in{r.input}[{self.sizes.offset(r.input, r.index, self.names)}]"
            return self.guarded(self.generic_tests(r), element)
        offset, tests = self.strided(r)
        return self.guarded(tests, f"{cast}in{r.input}[{offset}]")

    def special_reduce(self, e: Reduce, acc: str, pre: list[str], indent: str, top: bool) -> str | None:
        """A reduction at the top of a cooperative kernel: the block's threads share its flattened range, then
        combine their sums (dd_block_sum / dd_block_max)."""
        if not (self.cooperative and top):
            return None
        pre.append(f"{indent}float {acc} = {self.start(e)};")
        total = math.prod(n for _, n in e.vars)
        bounds = [self.range_of(var, size, e.body) for var, size in e.vars]
        pre.append(f"{indent}for (int t = threadIdx.x; t < {_product(bounds)}; t += blockDim.x) {{")
        inner = indent + "  "
        rest = total
        for k, (var, size) in enumerate(e.vars):
            rest //= size
            v = self.bind(var, size)
            after = _product(bounds[k + 1 :])
            div = (f"t / ({after})" if " " in after else f"t / {after}") if rest > 1 else "t"
            if size * rest < total:
                pre.append(f"{inner}int {v} = {div} % {bounds[k]};")
            else:
                pre.append(f"{inner}int {v} = {div};")
        body_pre: list[str] = []
        value = as_float(self.expr(e.body, body_pre, inner, False))
        pre.extend(body_pre)
        pre.append(f"{inner}{self.accumulate(e, acc, value)}")
        pre.append(f"{indent}}}")
        pre.append(f"{indent}{acc} = dd_block_{e.kind}({acc});")
        return acc


def _product(factors: list[str]) -> str:
    """`a * b * 4` with the numbers multiplied out; "1" for none."""
    number = math.prod(int(f) for f in factors if f.isdigit())
    names = [f for f in factors if not f.isdigit()]
    return " * ".join(names + ([str(number)] if number != 1 or not names else []))


def as_float(arg: tuple[str, str]) -> str:
    return cexpr.as_float(arg, CUDA)


def cuda_expr(e: IE, out: tuple[tuple[str, int], ...], shapes: tuple[tuple[int, ...], ...]) -> str:
    """The C expression of a reduction-free `e` at output indices named as in `out` (for tests and reading)."""
    g = Gen(shapes)
    for var, size in out:
        g.bind(var, size)
    pre: list[str] = []
    text = as_float(g.expr(e, pre, ""))
    if pre:
        raise ValueError("cuda_expr takes an expression without reductions")
    return text


@dataclass(frozen=True)
class Kernel:
    """A kernel's text and how to launch it (its arguments are filled in by the caller)."""

    text: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    static_smem: int
    covers: int
    loop: str
    tiles: tuple[int, int, int] = (0, 0, 0)
    # bytes of the statement's planned workspace the kernel takes as its last argument (float* ws); `finish`, a kernel
    # launched after it on (out, ws) (the filter gradient's split reduction: its partial sums, then their sum)
    scratch: int = 0
    finish: Kernel | None = None
    # an element-wise kernel's float4 loop: its only one, or a shape-generic kernel's beside its scalar loop, taken at
    # run time where the size is a multiple of 4 and the pointers it reads four at a time are 16-byte aligned
    float4: bool = False


def _params(out_ctype: str, ctypes: tuple[str, ...], restrict: bool) -> str:
    r = "__restrict__ " if restrict else ""
    return ", ".join([f"{out_ctype}* {r}out", *(f"const {t}* {r}in{k}" for k, t in enumerate(ctypes))])


def _grid_for(n: int, block: int) -> int:
    return max(1, min(MAX_GRID, -(-n // block)))


def _flat_params(ctypes: tuple[str, ...], restrict: tuple[bool, ...], out_ctype: str = "float") -> str:
    """An element-wise kernel's pointers: `restrict[0]` for the output, `restrict[1 + k]` for input k (memory no
    other pointer of the kernel writes: `const __restrict__`, read through the read-only cache)."""
    r = ["__restrict__ " if x else "" for x in restrict]
    return ", ".join([f"{out_ctype}* {r[0]}out", *(f"const {t}* {r[1 + k]}in{k}" for k, t in enumerate(ctypes))])


def vectorisable(body: IE, out: tuple[tuple[str, int], ...], shapes: tuple[tuple[int, ...], ...],
                 any_size: bool = False) -> bool:  # fmt: skip
    """A flat body that float4 loads and stores can compute four elements at a time: its output's size a multiple of
    4 (unless `any_size`: a shape-generic kernel tests its size at run time), every read its input's own element (an
    input of the output's shape) or a scalar input's one value."""
    numel = math.prod(n for _, n in out)
    if not any_size and (numel % VECTOR or not numel):
        return False
    own, shape = own_index(out), tuple(n for _, n in out)
    rs = list(reads(body))
    return all((r.index == own and shapes[r.input] == shape) or (r.index == () and shapes[r.input] == ()) for r in rs)


def _vector_loop(g: Gen, body: IE, numel: int, shapes: tuple[tuple[int, ...], ...], ctypes: tuple[str, ...]) -> list:
    """The lines of a grid-stride loop over float4 groups: each element input loaded as one float4 (`v{k}`), the
    body computed for each of the four lanes, the result stored as one float4."""
    loaded = sorted({r.input for r in reads(body) if r.index != ()})
    lines = [f"  DD_GRID_STRIDE(q, {numel // VECTOR}) {{"]
    for k in loaded:
        if ctypes[k] != "float":  # an integer input is read element by element, never as a vector
            return []
        lines.append(f"    const float4 v{k} = reinterpret_cast<const float4*>(in{k})[q];")
    lines.append("    float4 r;")
    for lane in "xyzw":
        g.registers = {k: f"v{k}.{lane}" for k in loaded}
        g.locals = Locals(shared_subexpressions(body), set(g.taken))
        pre: list[str] = []
        value = as_float(g.expr(body, pre, "      "))
        lines += ["    {", *pre, f"      r.{lane} = {value};", "    }"] if pre else [f"    r.{lane} = {value.strip()};"]
    lines += ["    reinterpret_cast<float4*>(out)[q] = r;", "  }"]
    return lines


def _either_loop(g: Gen, name: str, body: IE, ctypes: tuple[str, ...], head: list[str]) -> str | None:
    """The text of a shape-generic element-wise kernel (`head`: its comments and signature, `n` its element count)
    with two loops: float4s, four elements a thread each step, where `n` is a multiple of 4 and every pointer read or
    written four at a time is 16-byte aligned (tested in the kernel: a statement's tensors may be a slice at any
    offset), else one element a thread. Both call the element function `NAME_element` before the kernel, `body` of
    the values it reads (`in0`, ... of the elements); None where an input read four at a time is an integer one."""
    read = sorted({r.input for r in reads(body)})
    loaded = sorted({r.input for r in reads(body) if r.index != ()})
    if any(ctypes[k] != "float" for k in loaded):  # an integer input is read element by element, never as a vector
        return None
    g.registers = {k: f"in{k}" for k in read}
    pre: list[str] = []
    value = as_float(g.expr(body, pre, "  "))
    g.registers = {}
    function = f"{name}_element"
    params = ", ".join(f"float in{k}" for k in read)
    scalar = {k: f"{'(float) ' if ctypes[k] != 'float' else ''}in{k}[0]" for k in read if k not in loaded}

    def call(lane: str) -> str:
        return f"{function}({', '.join(scalar.get(k) or lane.format(k) for k in read)})"

    pointers = " | ".join(f"(size_t) {p}" for p in ["out", *(f"in{k}" for k in loaded)])
    lines = [
        *head[:-1], f"static __device__ __forceinline__ float {function}({params}) {{", *pre, f"  return {value};",
        "}", head[-1],
        f"  if (n % 4 == 0 && (({pointers}) & 15) == 0) {{  // float4s: four elements a thread each step",
        "    DD_GRID_STRIDE(q, n / 4) {",
        *(f"      const float4 v{k} = reinterpret_cast<const float4*>(in{k})[q];" for k in loaded),
        "      float4 r;",
        *(f"      r.{lane} = {call('v{}.' + lane)};" for lane in "xyzw"),
        "      reinterpret_cast<float4*>(out)[q] = r;",
        "    }",
        "    return;",
        "  }",
        "  DD_GRID_STRIDE(e, n) {",
        f"    out[e] = {call('in{}[e]')};",
        "  }",
        "}",
    ]  # fmt: skip
    return "\n".join(lines)


def ie_kernel(
    name: str, body: IE, out: tuple[tuple[str, int], ...], shapes: tuple[tuple[int, ...], ...],
    ctypes: tuple[str, ...] | None = None, comments: tuple[str, ...] = (), generic: bool = False,
    restrict: tuple[bool, ...] | None = None, vector: bool = False, out_ctype: str = "float",
) -> Kernel:  # fmt: skip
    """The kernel computing out[idx] = body over `out`'s grid, under one comment line for each of `comments`.
    `generic` takes the sizes as arguments, so that one kernel serves every statement of the same text: an
    element-wise kernel its element count `n`, another every dim of its output and of its inputs in order
    (backends/sizes.py names them). An element-wise kernel takes its pointers `__restrict__` where `restrict` says
    (the output first: memory no other pointer of the kernel writes) and, with `vector`, reads and writes float4s
    where `vectorisable` allows: four elements a thread each step of its loop. Of one program (not `generic`) it is
    that loop alone, `vector` saying every pointer is 16-byte aligned; a `generic` kernel has it beside the scalar
    loop and takes it where `n` is a multiple of 4 and every pointer it reads or writes four at a time is 16-byte
    aligned, tested in the kernel (the launch's grid is the caller's: either loop strides over what it covers).
    `out_ctype`: the output's storage, "dd_bf16" for a value the plan stores in bf16 (computed in float, rounded by
    the store; never float4)."""
    ctypes = ctypes or ("float",) * len(shapes)
    numel = math.prod(n for _, n in out)
    _check_size(name, numel, *(math.prod(s) for s in shapes))
    head = [f"// {c_comment(line)}" for line in comments]
    tops = top_reductions(body)
    reduced = max((math.prod(n for _, n in r.vars) for r in tops), default=0)
    cooperative = reduced >= 64 and reduced >= numel // 64
    g = Gen(shapes, ctypes=ctypes, cooperative=cooperative)
    g.locals = Locals(shared_subexpressions(body), g.taken)
    lines: list[str] = []
    params = _params(out_ctype, ctypes, False)
    if not cooperative and is_flat(body, out, shapes):
        g.flat = True
        if restrict is not None:
            params = _flat_params(ctypes, restrict, out_ctype)
        head.append(f'extern "C" __global__ void {name}({params}{", int n" if generic else ""}) {{')
        if vector and generic and out_ctype == "float" and vectorisable(body, out, shapes, any_size=True):
            text = _either_loop(g, name, body, ctypes, head)
            if text is not None:
                return Kernel(text, (_grid_for(numel, BLOCK), 1, 1), (BLOCK, 1, 1), 0, numel, "grid-stride",
                              float4=True)  # fmt: skip
        if vector and out_ctype == "float" and not generic and vectorisable(body, out, shapes):
            vector_lines = _vector_loop(g, body, numel, shapes, ctypes)
            if vector_lines:
                return Kernel("\n".join(head + vector_lines + ["}"]), (_grid_for(numel // VECTOR, BLOCK), 1, 1),
                              (BLOCK, 1, 1), 0, numel, "grid-stride", float4=True)  # fmt: skip
        pre: list[str] = []
        value = as_float(g.expr(body, pre, "    "))
        lines += [f"  DD_GRID_STRIDE(e, {'n' if generic else numel}) {{", *pre, f"    out[e] = {value};", "  }"]
        return Kernel("\n".join(head + lines + ["}"]), (_grid_for(numel, BLOCK), 1, 1), (BLOCK, 1, 1), 0, numel,
                       "grid-stride")  # fmt: skip
    sizes = Sizes(tuple(n for _, n in out), shapes) if generic else None
    g.sizes = sizes
    names = [g.bind(var, size) for var, size in out]
    g.own = tuple(Affine.var(v) for v, _ in out), tuple(n for _, n in out)
    loop = "DD_BLOCK_STRIDE" if cooperative else "DD_GRID_STRIDE"
    total = _product([Sizes.out_dim(j) for j in range(len(out))]) if sizes is not None else str(numel)
    pre = []
    value = as_float(g.expr(body, pre, "    "))
    used = "\n".join([*pre, value])
    rest = numel
    index = []
    for j, (v, (_, size)) in enumerate(zip(names, out)):  # the output's indices that the body uses, from e
        rest //= size
        if not re.search(rf"\b{v}\b", used):
            continue
        if sizes is not None:
            div = f"e / {sizes.out_stride(j)}" if j < len(out) - 1 else "e"
            index.append(f"    int {v} = {div} % {sizes.out_dim(j)};" if j else f"    int {v} = {div};")
        elif size == 1:
            index.append(f"    const int {v} = 0;")
        else:
            div = f"e / {rest}" if rest > 1 else "e"
            index.append(f"    int {v} = {div} % {size};" if size * rest < numel else f"    int {v} = {div};")
    body_lines = [f"  {loop}(e, {total}) {{", *index, *pre]
    body_lines.append(f"    if (threadIdx.x == 0) out[e] = {value};" if cooperative else f"    out[e] = {value};")
    body_lines.append("  }")
    if sizes is not None:
        dims = ", ".join(f"int {d}" for d in sizes.all_dims())
        head.append(f'extern "C" __global__ void {name}({params}{", " + dims if dims else ""}) {{')
        lines += [f"  const int {n} = {v};" for n, v in sizes.locals("\n".join(body_lines))]
    else:
        head.append(f'extern "C" __global__ void {name}({params}) {{')
    text = "\n".join(head + lines + body_lines + ["}"])
    if cooperative:
        block = min(BLOCK, max(32, 1 << (reduced - 1).bit_length()))
        return Kernel(text, (_grid_for(numel, 1), 1, 1), (block, 1, 1), BLOCK_SMEM, numel, "block-stride")
    return Kernel(text, (_grid_for(numel, BLOCK), 1, 1), (BLOCK, 1, 1), 0, numel, "grid-stride")


def group_kernel(
    name: str, bodies: tuple[IE, ...], numel: int, shapes: tuple[tuple[int, ...], ...], ctypes: tuple[str, ...],
    readers: tuple[dict[int, int], ...], comments: tuple[str, ...], generic: bool = False,
    out_ctypes: tuple[str, ...] = (),
) -> Kernel:  # fmt: skip
    """One grid-stride kernel computing out0[e] = bodies[0], out1[e] = bodies[1], ... element by element: the
    statements of one group (ir/groups.py). Body j reads the shared inputs in0, in1, ... (`shapes`, `ctypes`), and
    `readers[j]` maps an input index of its own to the earlier result m it reads instead (held in the local r{m}).
    `out_ctypes`: each result's storage (default float); a later body reads an earlier result as it is stored."""
    _check_size(name, numel, *(math.prod(x) for x in shapes))
    out_ctypes = out_ctypes or ("float",) * len(bodies)
    outs = [f"{t}* out{m}" for m, t in enumerate(out_ctypes)]
    ins = [f"const {t}* in{k}" for k, t in enumerate(ctypes)]
    lines = [f"// {c_comment(line)}" for line in comments]
    size = ["int n"] if generic else []  # the element count as an argument: one kernel for every shape
    lines += [f'extern "C" __global__ void {name}({", ".join(outs + ins + size)}) {{',
              f"  DD_GRID_STRIDE(e, {'n' if generic else numel}) {{"]  # fmt: skip
    taken = {f"r{j}" for j in range(len(bodies))}  # the locals of every body in the one loop
    for j, body in enumerate(bodies):
        g = Gen(shapes, ctypes=ctypes, flat=True, registers={k: f"r{m}" for k, m in readers[j].items()})
        g.locals = Locals(shared_subexpressions(body), taken)
        pre: list[str] = []
        value = as_float(g.expr(body, pre, "    "))
        lines += pre + [f"    const float r{j} = {_stored(value, out_ctypes[j])};", f"    out{j}[e] = r{j};"]
    lines += ["  }", "}"]
    return Kernel("\n".join(lines), (_grid_for(numel, BLOCK), 1, 1), (BLOCK, 1, 1), 0, numel, "grid-stride")


def multi_kernel(
    name: str, kinds: tuple[tuple[tuple[IE, ...], tuple[dict[int, int], ...], tuple[str, ...]], ...], width: int,
    comments: tuple[str, ...], out_ctypes: tuple[tuple[str, ...], ...] = (),
) -> str:  # fmt: skip
    """The kernel of a multi-tensor launch (ir/launches.py): one table argument `t` (t[0] the segment count, then one
    row of `width` numbers per segment: its first block, its blocks, its elements, its kind, then its outputs' and
    inputs' pointers). Each block finds its segment (a binary search over the rows' first blocks) and runs that
    segment's group loop (group_kernel's body) over the segment's elements, the segment's blocks striding together.
    `kinds`: per kind, its bodies, what each reads of the earlier results (as group_kernel's `readers`) and its
    inputs' C types; segments of one kind differ only in their sizes and pointers. `out_ctypes`: per kind, its
    results' storage (default float)."""
    lines = [f"// {c_comment(line)}" for line in comments]
    lines += [
        f'extern "C" __global__ void {name}(const long long* __restrict__ t) {{',
        "  int lo = 0, hi = (int) t[0] - 1;  // the block's segment: the last whose first block is not after it",
        "  while (lo < hi) {",
        "    const int mid = (lo + hi + 1) / 2;",
        f"    if (t[1 + mid * {width}] <= (long long) blockIdx.x) lo = mid; else hi = mid - 1;",
        "  }",
        f"  const long long* row = t + 1 + lo * {width};",
        "  const int n = (int) row[2];",
        "  const int stride = (int) row[1] * blockDim.x;",
        "  const int first = ((int) blockIdx.x - (int) row[0]) * blockDim.x + threadIdx.x;",
        "  switch ((int) row[3]) {",
    ]
    for kind, (bodies, readers, ctypes) in enumerate(kinds):
        outs = out_ctypes[kind] if out_ctypes else ("float",) * len(bodies)
        lines.append(f"  case {kind}: {{")
        lines += [f"    {t}* out{m} = ({t}*) row[{4 + m}];" for m, t in enumerate(outs)]
        lines += [f"    const {t}* in{k} = (const {t}*) row[{4 + len(bodies) + k}];" for k, t in enumerate(ctypes)]
        lines.append("    for (int e = first; e < n; e += stride) {")
        taken = {f"r{j}" for j in range(len(bodies))}
        shapes = tuple((1,) for _ in ctypes)  # a flat body reads in{k}[e] or, a scalar, in{k}[0]: no shapes needed
        for j, body in enumerate(bodies):
            g = Gen(shapes, ctypes=ctypes, flat=True, registers={k: f"r{m}" for k, m in readers[j].items()})
            g.locals = Locals(shared_subexpressions(body), taken)
            pre: list[str] = []
            value = as_float(g.expr(body, pre, "      "))
            lines += pre + [f"      const float r{j} = {_stored(value, outs[j])};", f"      out{j}[e] = r{j};"]
        lines += ["    }", "    break;", "  }"]
    lines += ["  }", "}"]
    return "\n".join(lines)


def _stored(value: str, ctype: str) -> str:
    """A group's result `value` as its store leaves it: rounded to bf16 where it is stored in bf16, so that a later
    statement of the group reads what a kernel of its own would read from memory."""
    return f"dd_bf16_float(dd_bf16_bits({value}))" if ctype == "dd_bf16" else value


def segment_blocks(n: int) -> int:
    """The blocks one segment of `n` elements gets in a multi-tensor launch."""
    return max(1, min(SEGMENT_BLOCKS, -(-n // BLOCK)))


def multi_table(launch: Launch, pointers: Sequence[int]) -> np.ndarray:
    """The table a multi-tensor launch's kernel reads (multi_kernel), with the device addresses of its arguments
    (`pointers`, in the order of `launch.args`)."""
    t = np.zeros(1 + len(launch.table) * launch.width, np.int64)
    t[0] = len(launch.table)
    at = 0
    for k, (first, blocks, n, kind, count) in enumerate(launch.table):
        row = 1 + k * launch.width
        t[row : row + 4] = (first, blocks, n, kind)
        t[row + 4 : row + 4 + count] = np.array(pointers[at : at + count], np.uint64).view(np.int64)
        at += count
    return t


def _check_size(name: str, *sizes: int) -> None:
    if max(sizes, default=0) >= 2**31:
        raise ValueError(
            f"kernel {name}: a tensor of {max(sizes)} elements is beyond the 32-bit indices of the kernels"
        )


# ---- large sums split over blocks, reductions in one pass (ir/reductions.py) ----


def _rename(e: IE, names: dict[str, str]) -> IE:
    """`e` with its index variables renamed (reductions' and the output's)."""
    if isinstance(e, Read):
        return Read(e.input, tuple(Affine(tuple((names.get(v, v), c) for v, c in a.terms), a.const)
                                   for a in e.index))  # fmt: skip
    if isinstance(e, Var):
        return Var(names.get(e.name, e.name))
    if isinstance(e, Apply):
        return Apply(e.fn, tuple(_rename(a, names) for a in e.args))
    if isinstance(e, Reduce):
        return Reduce(e.kind, tuple((names.get(v, v), n) for v, n in e.vars), _rename(e.body, names))
    return e


def _invariants(e: IE, reduced: set[str]) -> list[IE]:
    """The largest parts of a sum's body that read memory but none of the sum's variables: the same for every term."""

    def uses(x: IE) -> bool:
        if isinstance(x, Read):
            return any(v in reduced for a in x.index for v, _ in a.terms)
        if isinstance(x, Var):
            return x.name in reduced
        if isinstance(x, Apply):
            return any(uses(a) for a in x.args)
        return isinstance(x, Reduce)

    def reads(x: IE) -> bool:
        return isinstance(x, Read) or isinstance(x, Apply) and any(reads(a) for a in x.args)

    if isinstance(e, Apply) and not uses(e) and reads(e):
        return [e]
    if isinstance(e, Apply):
        return [x for a in e.args for x in _invariants(a, reduced)]
    return []


def _replace_total(e: IE, by: IE) -> IE:
    if is_total(e):
        return by
    if isinstance(e, Apply):
        return Apply(e.fn, tuple(_replace_total(a, by) for a in e.args))
    return e


_PACK = "dd_pack"  # the sums' bodies side by side under one reduction, so that collapse merges their axes alike
TOTAL = 100000  # input numbers from here on stand for a sum's total, held in a local


@dataclass(frozen=True)
class PassKernel:
    """The one kernel of a pass (ir/reductions.py), split over blocks or not."""

    kernel: Kernel
    split: bool  # partial sums in scratch, the last block to finish adding them up (else one block an output)
    inputs: tuple[Value, ...]  # what the kernel reads after its outputs (and scratch)


def pass_kernels(name: str, rg: ReductionGroup, comments: tuple[str, ...]) -> PassKernel:
    """The kernel of `rg`: see the module docstring. Its arguments: every result (the sums', then the per-element
    statements'), then where the range is split one double array of `slices x numel` partial sums per sum, then the
    inputs, then the inputs of the per-element statements (the running statistics)."""
    split = rg.split
    numel = split.numel
    first = rg.sums[0]
    out_names = [v for v, _ in first.out]
    red_names = [v for v, _ in first.reduce.vars]
    inputs: list[Value] = []
    bodies: list[IE] = []
    squares = {var: mean for mean, var in rg.moments}
    for k, f in enumerate(rg.sums):
        if k in squares:  # one pass: the sum of squares of what its mean sums (below), not what it reads itself
            bodies.append(Const(0.0))
            continue
        names = {v: out_names[j] for j, (v, _) in enumerate(f.out)}
        names.update({v: red_names[j] for j, (v, _) in enumerate(f.reduce.vars)})
        mapping = {}
        for j, v in enumerate(f.stmt.inputs):
            if v not in inputs:
                inputs.append(v)
            mapping[j] = inputs.index(v)
        body = renumber(_rename(f.reduce.body, names), mapping)
        bodies.append(body)
    for var, mean in squares.items():  # one pass: the sum of squares, the variance from it and the mean
        bodies[var] = Apply("*", (bodies[mean], bodies[mean]))
    shapes = tuple(v.type.shape for v in inputs)
    ctypes = tuple(_ctype(v.type.dtype) for v in inputs)
    # the first variable (the batch) a reduction of its own around the rest, so that collapse merges only the rest
    # (h, w into one contiguous range): the pieces stay those of the split (ir/reductions.py `split_of`)
    head, *tail = first.reduce.vars
    inner_sum: IE = Reduce("sum", tuple(tail), Apply(_PACK, tuple(bodies))) if tail else Apply(_PACK, tuple(bodies))
    packed = Reduce("sum", (head,), inner_sum)
    c = collapse(Apply(_PACK, (packed,)), first.out, shapes)
    rvars: tuple[tuple[str, int], ...] = tuple(first.reduce.vars)
    c_shapes = shapes
    got = c.body.args[0] if isinstance(c.body, Apply) and c.body.args else None
    if c.out == first.out and isinstance(got, Reduce) and got.vars == (head,):  # the output axes stay as they are
        inside = got.body
        if isinstance(inside, Reduce) and isinstance(inside.body, Apply) and inside.body.fn == _PACK:
            rvars, bodies, c_shapes = (head, *inside.vars), list(inside.body.args), c.shapes
        elif not tail and isinstance(inside, Apply) and inside.fn == _PACK:
            bodies, c_shapes = list(inside.args), c.shapes
    assert rvars[0] == head and math.prod(n for _, n in rvars[1:]) == math.prod(n for _, n in tail)
    g = Gen(c_shapes, ctypes=ctypes)
    g.locals = None
    (v0, n0), rest = rvars[0], rvars[1:]
    n_rest = math.prod(n for _, n in rest)
    direct = split.slices == 1
    lines = [f"// {c_comment(line)}" for line in comments]
    shown = tuple(f"in{k}" for k in range(len(inputs)))
    for k, b in enumerate(bodies):  # what each accumulator adds up, over the (collapsed) range
        lines.append(f"// a{k} = {c_comment(format_ie(Reduce('sum', rvars, b), shown))}")
    results = [f"float* out{m}" for m in range(len(rg.sums) + len(rg.updates))]
    parts = [f"double* part{k}" for k in range(len(rg.sums))]
    ins = [f"const {t}* in{k}" for k, t in enumerate(ctypes)]
    running = [f"const float* run{u}" for u in range(len(rg.updates))]
    params = results + ([] if direct else parts) + ins + running  # the results first, as every launch
    lines.append(f'extern "C" __global__ void {name}({", ".join(params)}) {{')
    if split.inner > 1:
        lines.append(f"  const int yo = blockIdx.y / {split.inner}, yi = blockIdx.y % {split.inner};")
    elif rest:
        lines.append("  const int yo = blockIdx.y, yi = 0;")
    else:
        lines.append("  const int yo = blockIdx.y;")
    lines.append(f"  const int lo0 = (int) ((long long) yo * {n0} / {split.outer}), "
                 f"hi0 = (int) ((long long) (yo + 1) * {n0} / {split.outer});")  # fmt: skip
    if rest:
        lines.append(f"  const int lo1 = (int) ((long long) yi * {n_rest} / {split.inner}), "
                     f"hi1 = (int) ((long long) (yi + 1) * {n_rest} / {split.inner});")  # fmt: skip
    lines.append(f"  DD_BLOCK_STRIDE(e, {numel}) {{")
    rest_n = numel
    for v, size in first.out:  # the output's indices from e, once per block
        rest_n //= size
        name_v = g.bind(v, size)
        div = f"e / {rest_n}" if rest_n > 1 else "e"
        lines.append(f"    const int {name_v} = {div} % {size};" if size * rest_n < numel else
                     f"    const int {name_v} = {div};")  # fmt: skip
    reduced = {v for v, _ in rvars}
    for k, part in enumerate(dict.fromkeys(x for b in bodies for x in _invariants(b, reduced))):
        pre_h: list[str] = []
        value = g.expr(part, pre_h, "    ")
        if value[1] == "f" and not pre_h:  # computed once per block, not once per element (an rsqrt, a scale)
            lines.append(f"    const float h{k} = {value[0]};")
            g.hoisted[part] = (f"h{k}", "f")
    accs = [f"a{k}" for k in range(len(bodies))]
    lines += [f"    double {a} = 0.0;" for a in accs]
    outer_v = g.bind(v0, n0)
    lines.append(f"    for (int {outer_v} = lo0; {outer_v} < hi0; {outer_v}++) {{")
    inner = "      "
    if not rest:  # one variable: the block's threads share each piece of it
        lines[-1] = "    #pragma unroll 4"
        lines.append(f"    for (int {outer_v} = lo0 + threadIdx.x; {outer_v} < hi0; {outer_v} += blockDim.x) {{")
    elif len(rest) == 1:
        iv = g.bind(rest[0][0], rest[0][1])
        lines.append("      #pragma unroll 4")
        lines.append(f"      for (int {iv} = lo1 + threadIdx.x; {iv} < hi1; {iv} += blockDim.x) {{")
        inner = "        "
    else:  # axes collapse could not merge: the flat inner position, its indices by division
        lines.append("      #pragma unroll 4")
        lines.append("      for (int t = lo1 + threadIdx.x; t < hi1; t += blockDim.x) {")
        inner = "        "
        after = n_rest
        for v, size in rest:
            after //= size
            name_v = g.bind(v, size)
            div = f"t / {after}" if after > 1 else "t"
            lines.append(f"{inner}const int {name_v} = {div} % {size};")
    pre: list[str] = []
    values = [as_float(g.expr(b, pre, inner, False)) for b in bodies]
    lines += pre
    lines += [f"{inner}{a} += (double) ({v});" for a, v in zip(accs, values)]
    if rest:
        lines.append("      }")
    lines.append("    }")
    lines += [f"    {a} = dd_block_sum_double({a});" for a in accs]
    finish = _finish_lines(rg, [f"{a}" for a in accs], "      ", direct)
    if direct:
        lines += ["    if (threadIdx.x == 0) {", *finish, "    }"]
    else:
        lines.append("    if (threadIdx.x == 0) {")
        lines += [f"      part{k}[blockIdx.y * {numel} + e] = {a};" for k, a in enumerate(accs)]
        lines.append("    }")
    lines.append("  }")
    if not direct:  # the last block to finish: each output's partial sums in slice order, its threads over outputs
        lines.append("  if (dd_last_block()) {")
        lines.append(f"    for (int e = threadIdx.x; e < {numel}; e += blockDim.x) {{")
        for k in range(len(rg.sums)):
            lines.append(f"      double t{k} = 0.0;")
            lines.append(f"      for (int y = 0; y < {split.slices}; y++) t{k} += __ldcg(&part{k}[y * {numel} + e]);")
        lines += _finish_lines(rg, [f"t{k}" for k in range(len(rg.sums))], "      ", True)
        lines += ["    }", "  }"]
    lines.append("}")
    piece = -(-n_rest // split.inner) if rest else -(-n0 // split.outer)  # the values a block's threads share
    block = min(THREADS, max(32, 1 << (piece - 1).bit_length()))  # a power of two (dd_block_sum_double)
    kernel = Kernel("\n".join(lines), (_grid_for(numel, 1), split.slices, 1), (block, 1, 1), SPLIT_SMEM, numel,
                    "split")  # fmt: skip
    return PassKernel(kernel, not direct, tuple(inputs))


def _finish_lines(rg: ReductionGroup, totals: list[str], indent: str, write: bool) -> list[str]:
    """Each sum's result from its total (`totals`, doubles), written to out0, out1, ..., then each per-element
    statement of the pass (a running update, an inverse deviation) from it or from its input `run{u}`."""
    lines: list[str] = []
    squares = {var: mean for mean, var in rg.moments}
    for k, f in enumerate(rg.sums):
        count = math.prod(n for _, n in f.reduce.vars)
        if k in squares:  # the variance from the sum of squares and the sum, in double
            m = squares[k]
            lines.append(f"{indent}const double mu{k} = {totals[m]} / {count}.0;")
            lines.append(f"{indent}const double va{k} = {totals[k]} / {count}.0 - mu{k} * mu{k};")
            lines.append(f"{indent}const float r{k} = (float) (va{k} > 0.0 ? va{k} : 0.0);")
        else:
            g = Gen((), registers={TOTAL: f"((float) {totals[k]})"})
            value = as_float(g.expr(_replace_total(f.outside, Read(TOTAL, ())), [], indent))
            lines.append(f"{indent}const float r{k} = {value};")
        lines.append(f"{indent}out{k}[e] = r{k};")
    for u, (s, k) in enumerate(rg.updates):
        if s.op == "bn_invstd":  # as the element-wise kernel of its index form writes it
            v = f"r{k}" if k >= 0 else f"run{u}[e]"
            lines.append(f"{indent}out{len(rg.sums) + u}[e] = (1.0f / sqrtf(({v} + {float_literal(s.a['eps'])})));")
            continue
        keep = float_literal(1 - s.a["momentum"])
        take = float_literal(s.a["momentum"] * s.a["correction"])
        lines.append(f"{indent}out{len(rg.sums) + u}[e] = ({keep} * run{u}[e]) + ({take} * r{k});")
    return lines


# ---- ops without an index form ----


def library_call(name: str, s: Stmt, ctypes: tuple[str, ...], out_ctype: str, call: str, **launch: Any) -> Kernel:
    """The kernel `name` whose one line is `call`, a function of library.cu, launched as `launch` says (the
    keywords of `Kernel`: grid, block, static_smem, covers, loop; with `scratch` its last parameter is float* ws).
    A float result the plan stores in bf16 is a dd_bf16 pointer (library.cu's functions take either)."""
    if out_ctype == "float" and s.out.type.dtype is DType.BF16:
        out_ctype = "dd_bf16"
    params = _params(out_ctype, ctypes, True) + (", float* __restrict__ ws" if launch.get("scratch") else "")
    text = "\n".join([
        f"// {c_comment(format_stmt(s))}",
        f'extern "C" __global__ void {name}({params}) {{',
        f"  {call};",
        "}",
    ])  # fmt: skip
    return Kernel(text, **launch)


def elementwise_launch(n: int) -> dict[str, Any]:
    """The launch of a grid-stride loop over `n` elements, one thread an element."""
    return {"grid": (_grid_for(n, BLOCK), 1, 1), "block": (BLOCK, 1, 1), "static_smem": 0, "covers": n,
            "loop": "grid-stride"}  # fmt: skip


def row_launch(rows: int, covers: int) -> dict[str, Any]:
    """The launch of a block-stride loop: one block a row, its threads sharing the row (`covers` elements in all)."""
    return {"grid": (_grid_for(rows, 1), 1, 1), "block": (BLOCK, 1, 1), "static_smem": BLOCK_SMEM, "covers": covers,
            "loop": "block-stride"}  # fmt: skip


def one_block_launch(covers: int) -> dict[str, Any]:
    """The launch of one block that covers all `covers` elements."""
    return {"grid": (1, 1, 1), "block": (BLOCK, 1, 1), "static_smem": BLOCK_SMEM, "covers": covers, "loop": "one-block"}


def c_ints(*xs: Any) -> str:
    """Integers as a C argument list: `2, 3, 4`."""
    return ", ".join(str(int(x)) for x in xs)


# ---- the program ----

Form = tuple[IE, tuple[tuple[str, int], ...]]  # an index expression over the output's indices (name, size)


def _ctype(dtype: DType) -> str:
    """The C type a value is stored as: float, bf16 storage (library.cu dd_bf16: --precision bf16) or int64."""
    return {DType.F32: "float", DType.BF16: "dd_bf16"}.get(dtype, "long long")


def _ident(text: str) -> str:
    return re.sub(r"_+", "_", re.sub(r"[^A-Za-z0-9_]", "_", text)).strip("_")


@dataclass
class _Program:
    plan: Plan
    prefix: str = ""
    updates: dict[str, str] = field(default_factory=dict)  # update value -> the tensor it replaces
    tensors: dict[str, str] = field(default_factory=dict)  # value -> program tensor (input, parameter, state)
    views: dict[str, str] = field(default_factory=dict)  # view value -> its base value
    # a view that starts inside its base (a reduced gradient, `bucket_slice`): value -> its byte offset there
    view_offsets: dict[str, int] = field(default_factory=dict)
    taken: set[str] = field(default_factory=set)
    texts: list[str] = field(default_factory=list)
    seen: dict[str, str] = field(default_factory=dict)  # kernel code with its name blanked -> its name
    also: dict[str, list[str]] = field(default_factory=dict)  # kernel -> the later statements it serves
    launches: list[Launch] = field(default_factory=list)

    def name(self, s: Stmt, suffix: str = "", what: str = "") -> str:
        what = what or ("_".join(s.a["ops"]) if s.op == "fused" and s.a.get("ops") else s.op)
        where = s.layer or self.updates.get(s.out.name, "")  # an update is named after its parameter
        parts = [self.prefix + what, _ident(where), "v" + _ident(s.out.name) + suffix]
        base = "__".join(p for p in parts if p)
        name, k = base, 2
        while name in self.taken:
            name, k = f"{base}_{k}", k + 1
        self.taken.add(name)
        return name

    def arg(self, value: str, ctype: str) -> Arg:
        """Where `value` lives: a view in its base's storage, an update written in place in its tensor's."""
        base, within = value, 0
        while base in self.views:
            within += self.view_offsets.get(base, 0)
            base = self.views[base]
        base = self.plan.in_state.get(base, base)
        if base in self.tensors:
            assert within == 0, f"%{value}: a view inside a tensor"
            return Arg(value, "tensor", self.tensors[base], 0, ctype)
        return Arg(value, "arena", base, self.plan.buffer_of(base).offset + within, ctype)

    def add(self, s: Stmt, kernel: str, k: Kernel, values: tuple[str, ...], ctypes: tuple[str, ...],
            also: tuple[str, ...] = (), vendor: VendorCall | None = None, scratch: Arg | None = None,
            finishes: bool = False) -> None:  # fmt: skip
        """Launch `k`; a kernel identical to an earlier one but for its name is not written again: the launch
        uses the earlier kernel, whose comment lists the statements it serves. `scratch`: the statement's planned
        workspace, the last argument."""
        code = "\n".join(line for line in k.text.split("\n") if not line.startswith("//"))
        key = code.replace(f" {kernel}(", " KERNEL(", 1)
        if key in self.seen:
            kernel = self.seen[key]
            self.also[kernel].append(f"%{s.out.name}")
        else:
            self.seen[key] = kernel
            self.also[kernel] = []
            self.texts.append(k.text)
        args = tuple(self.arg(v, t) for v, t in zip(values, ctypes)) + ((scratch,) if scratch is not None else ())
        self.launches.append(Launch(kernel, s.out.name, s.op, k.grid, k.block, 0, k.static_smem, args, k.covers,
                                    k.loop, k.tiles, also, vendor, finishes=finishes))  # fmt: skip

    def group(self, stmts: tuple[Stmt, ...]) -> None:
        """One kernel for the statements of a group (ir/groups.py): every result written in the same loop."""
        form = group_form(stmts)
        shared = form.inputs
        what = "_".join(s.a["ops"][0] if s.op == "fused" and s.a.get("ops") else s.op for s in stmts)
        name = self.name(stmts[-1], what=what)  # after the last result: an update's parameter
        comments = tuple(format_stmt(s) for s in stmts)
        ctypes = tuple(_ctype(v.type.dtype) for v in shared)
        shapes = tuple(v.type.shape for v in shared)
        outs = tuple(_ctype(s.out.type.dtype) for s in stmts)
        k = group_kernel(name, form.bodies, stmts[0].out.type.numel, shapes, ctypes, form.held, comments,
                         out_ctypes=outs)  # fmt: skip
        values = (*(s.out.name for s in stmts), *(v.name for v in shared))
        self.add(stmts[0], name, k, values, outs + ctypes, tuple(s.out.name for s in stmts[1:]))

    def reductions(self, stmts: tuple[Stmt, ...]) -> bool:
        """The kernels of a pass (ir/reductions.py): a large sum, or reductions over the same range with the running
        statistics' updates; False (nothing launched) where the plan gave it no scratch (a workspace limit)."""
        rg = reduction_group(stmts)
        if rg is None:
            return False
        planned = pass_scratch(self.plan, stmts, rg)
        if planned is None:
            return False
        scratch = [Arg(f"workspace:{f.stmt.out.name}", "arena", f.stmt.out.name, ws.offset, "double")
                   for f, ws in zip(rg.sums, planned)]  # fmt: skip
        what = "_".join(f.stmt.a["ops"][-1] if f.stmt.op == "fused" and f.stmt.a.get("ops") else f.stmt.op
                        for f in rg.sums)  # fmt: skip
        head = rg.sums[0].stmt  # the first result: what the launches are named and listed by
        name = self.name(head, what=what)
        k = pass_kernels(name, rg, tuple(format_stmt(s) for s in stmts))
        results = [f.stmt.out.name for f in rg.sums] + [u.out.name for u, _ in rg.updates]
        running = [u.inputs[0].name for u, _ in rg.updates]  # a state tensor, or the input of an inverse deviation
        ins = [v.name for v in k.inputs]
        in_types = [_ctype(v.type.dtype) for v in k.inputs]
        also = tuple(results[1:])  # in the order of the kernel's outputs
        outs = tuple(self.arg(v, "float") for v in results)
        reads = (*(self.arg(v, t) for v, t in zip(ins, in_types)), *(self.arg(v, "float") for v in running))
        self.add(head, name, k.kernel, (), (), also)
        # the results, the partial sums (split passes), the inputs, the running statistics; no vendor routine serves it
        self.launches[-1] = dataclasses.replace(self.launches[-1], smem=0, args=(*outs, *scratch, *reads), vendor=None)
        return True

    def memory(self, values: tuple[str, ...], ctypes: tuple[str, ...]) -> tuple[tuple[bool, ...], bool]:
        """For a kernel writing values[0] from values[1:]: which of its pointers may be `__restrict__` (the output
        when no input shares its memory, an input when it is not the output's memory), and whether every pointer is
        16-byte aligned for float4 accesses (arena offsets are; a tensor is an allocation of its own)."""
        args = [self.arg(v, t) for v, t in zip(values, ctypes)]
        where = [(a.storage, a.name if a.storage == "tensor" else a.offset) for a in args]
        out_shared = any(w == where[0] for w in where[1:])
        restrict = (not out_shared, *(w != where[0] for w in where[1:]))
        aligned = all(a.storage == "tensor" or a.offset % VECTOR_ALIGN == 0 for a in args)
        return restrict, aligned

    def multi(self, launch: tuple[tuple[Stmt, ...], ...]) -> None:
        """One kernel for the groups of a multi-tensor launch (ir/launches.py): each group a segment of a table."""
        kinds: dict[tuple, int] = {}
        rows = []
        values: list[str] = []
        ctypes_all: list[str] = []
        first = 0
        for stmts in launch:
            form = group_form(stmts)
            ctypes = tuple(_ctype(v.type.dtype) for v in form.inputs)
            outs = tuple(_ctype(s.out.type.dtype) for s in stmts)
            key = (form.bodies, tuple(tuple(sorted(h.items())) for h in form.held), ctypes, outs)
            kind = kinds.setdefault(key, len(kinds))
            numel = stmts[0].out.type.numel
            _check_size(stmts[-1].out.name, numel, *(v.type.numel for v in form.inputs))
            blocks = segment_blocks(numel)
            count = len(stmts) + len(form.inputs)
            rows.append((first, blocks, numel, kind, count))
            first += blocks
            values += [*(s.out.name for s in stmts), *(v.name for v in form.inputs)]
            ctypes_all += list(outs) + list(ctypes)
        width = 4 + max(r[4] for r in rows)
        ops = dict.fromkeys(s.a["ops"][-1] if s.op == "fused" and s.a.get("ops") else s.op for g in launch for s in g)
        name = self.name(launch[0][0], what="multi_tensor_" + "_".join(ops), suffix="")
        parameters = [self.updates.get(g[-1].out.name, f"%{g[-1].out.name}") for g in launch]
        comments = (f"one launch for the updates of {len(launch)} tensors ({len(kinds)} kind"
                    f"{'s' if len(kinds) > 1 else ''} of loop): {', '.join(parameters)}",)  # fmt: skip
        text = multi_kernel(name, tuple((key[0], tuple(dict(h) for h in key[1]), key[2]) for key in kinds), width,
                            comments, tuple(key[3] for key in kinds))  # fmt: skip
        self.taken.add(name)
        self.seen[text] = name
        self.also[name] = []
        self.texts.append(text)
        args = tuple(self.arg(v, t) for v, t in zip(values, ctypes_all))
        total = sum(r[2] for r in rows)
        also = tuple(s.out.name for g in launch for s in g)[1:]
        grid = (first, 1, 1)
        self.launches.append(Launch(name, launch[0][0].out.name, "multi_tensor", grid, (BLOCK, 1, 1), 0, 0, args,
                                    total, "multi-tensor", also=also, table=tuple(rows), width=width))  # fmt: skip

    def statement(self, s: Stmt) -> None:
        op = REGISTRY[s.op]
        if op.view:
            self.views[s.out.name] = s.inputs[0].name
            if s.op == "bucket_slice":  # elements [offset, ...) of a reduced bucket (ops/collective.py)
                self.view_offsets[s.out.name] = 4 * s.a["offset"]
            return
        in_types = tuple(_ctype(v.type.dtype) for v in s.inputs)
        out_type = _ctype(s.out.type.dtype)
        values = (s.out.name, *(v.name for v in s.inputs))
        own = index_form(s)
        form: Form | None = (own.body, own.out) if own is not None else None
        if form is None and op.cuda_form is not None:
            form = op.cuda_form(s)
        arity = op.arity if op.arity is not None else len(s.inputs)
        if form is not None:
            if out_type not in ("float", "dd_bf16"):
                raise ValueError(f"%{s.out.name} = {s.op}: index-expression kernels write float32 (or bf16) only")
            if own is not None:  # an op's own index form takes no epilogue: every input is the body's
                arity = len(s.inputs)
            body, out = form
            name = self.name(s)
            shapes = tuple(v.type.shape for v in s.inputs[:arity])
            meaning = (
                f"out[{', '.join(v for v, _ in out)}] = {format_ie(body, tuple(f'in{k}' for k in range(len(shapes))))}"
            )
            restrict, vector = self.memory(values[: 1 + arity], (out_type, *in_types[:arity]))
            k = ie_kernel(name, body, out, shapes, in_types[:arity], (format_stmt(s), meaning), restrict=restrict,
                          vector=vector, out_ctype=out_type)  # fmt: skip
            # an op written from its index form (channel_sum) or CUDA form (avg_pool2d) may have a vendor routine too
            self.add(s, name, k, values[: 1 + arity], (out_type, *in_types[:arity]), vendor=vendor_call(s))
        elif op.cuda is None:
            raise ValueError(f"no CUDA kernel for op {s.op!r} (statement %{s.out.name})")
        else:
            name = self.name(s)
            ws = self.plan.workspace.get(s.out.name)
            if op.workspace is None:
                k = op.cuda(name, s, in_types[:arity])
            else:  # the kernel may take (a part of) the statement's planned workspace
                k = op.cuda(name, s, in_types[:arity], workspace=ws.nbytes if ws is not None else 0)
            scratch = None
            if k.scratch:
                assert ws is not None and k.scratch <= ws.nbytes, f"%{s.out.name}: more scratch than planned"
                scratch = Arg(f"workspace:{s.out.name}", "arena", s.out.name, ws.offset, "float")
            self.add(s, name, k, values[: 1 + arity], (out_type, *in_types[:arity]), vendor=vendor_call(s),
                     scratch=scratch)  # fmt: skip
            if k.finish is not None:  # named {name}_finish by the op's kernel; on the output and the scratch
                self.taken.add(f"{name}_finish")
                self.add(s, f"{name}_finish", k.finish, (s.out.name,), (out_type,), scratch=scratch, finishes=True)
        if "epilogue" in s.a:
            extras = s.inputs[arity:]
            out = output_indices(s.out.type)
            shapes = (s.out.type.shape, *(v.type.shape for v in extras))
            epi = s.a["epilogue"]
            ename = self.name(s, "_epilogue")
            names = ("out", *(f"in{k}" for k in range(1, len(shapes))))
            meaning = f"out[{', '.join(v for v, _ in out)}] = {format_ie(epi, names)}"
            evalues = (s.out.name, s.out.name, *(v.name for v in extras))
            restrict, vector = self.memory(evalues, (out_type, out_type, *in_types[arity:]))
            ek = ie_kernel(ename, epi, out, shapes, (out_type, *in_types[arity:]),
                           (f"epilogue of %{s.out.name}: {meaning}",), restrict=restrict, vector=vector,
                           out_ctype=out_type)  # fmt: skip
            self.add(s, ename, ek, evalues, (out_type, out_type, *in_types[arity:]))


def program(plan: Plan, prefix: str = "") -> CudaProgram:
    """The CUDA translation unit of a plan, and its launches in program order; `prefix` starts every kernel's
    name (two programs in one module)."""
    g = plan.graph
    p = _Program(plan, prefix, {v.name: name for name, v in g.updates})
    for d in g.inputs:
        p.tensors[d.value.name] = d.value.name
    for d in g.params:
        p.tensors[d.value.name] = d.value.name
    # the plan's kernels (memory/groups.py), a batch norm's reductions merged into one pass (ir/reductions.py),
    # and the optimiser's updates joined into one multi-tensor launch (memory/launches.py)
    for launch in planned_launches(plan, reduction_groups(planned_groups(plan))):
        if len(launch) > 1:
            p.multi(launch)
            continue
        group = launch[0]
        if p.reductions(group):
            continue
        if reduction_group(group) is not None and len(group) > 1:  # no scratch for the pass: each on its own
            for s in group:
                p.statement(s)
        elif len(group) == 1:
            p.statement(group[0])
        else:
            p.group(launch[0])
    texts = []
    for text in p.texts:
        name = re.search(r"__global__ void (\w+)\(", text)
        served = p.also.get(name[1], []) if name else []
        if served:  # a comment line before the signature
            head, sig = text.rsplit("\nextern", 1) if "\nextern" in text else ("", text[len("extern") :])
            note = f"// also serves {c_comment(', '.join(served))}"
            text = f"{head}\n{note}\nextern{sig}" if head else f"{note}\nextern{sig}"
        texts.append(text)
    body = "\n\n".join(texts) + "\n"
    copies = []
    for name, v in g.updates:
        src = p.arg(v.name, _ctype(v.type.dtype))
        if not (src.storage == "tensor" and src.name == name):  # computed in the arena: copied after the step
            copies.append((src, name, v.type.nbytes))
    results = tuple((name, p.arg(v.name, _ctype(v.type.dtype))) for name, v in g.outputs)
    return CudaProgram(translation_unit(g.name, body), tuple(dict.fromkeys(x.kernel for x in p.launches)),
                       tuple(p.launches), body, tuple(copies), results)  # fmt: skip


def translation_unit(name: str, *bodies: str) -> str:
    """The library followed by the kernels of one or more programs."""
    head = (
        f"// deepdsl: the CUDA kernels of {c_comment(name)}. Generated; the hand-written library (library.cu) comes"
        " first.\n\n"
    )
    return head + library_source() + "\n// ---- the program's kernels ----\n\n" + "\n".join(bodies)
