"""A Plan as one CUDA C translation unit: one `extern "C" __global__` kernel per statement, and its launches.

Statements with an index expression (element-wise, fused and `indexed` ones, every op with a registry
`index_form`, and the shape ops written here as index expressions) become kernels written from that
expression, with the meaning of `ops.indexed.evaluate`: a read outside its input is 0, `Reduce` sums or
maximises over its ranges, comparisons are C booleans. One thread computes one output element in a
grid-stride loop; a body whose outermost work is a reduction (channel statistics, `sum`, a mean) runs one
block per output element instead, its threads sharing the reduction through `dd_block_sum` / `dd_block_max`.
The other ops call a hand-written function of library.cu with the statement's shapes as constants: their
registry entries' `cuda` field (ops.py), as the shape ops' `cuda_form` is their index expression here.

Each kernel's launch is data (`Launch`): grid, block, shared memory and where each pointer argument lives
(an arena offset from the plan, or a program tensor by name).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from importlib.resources import files
from typing import Any

import numpy as np

from deepdsl.backends import cexpr
from deepdsl.backends.cexpr import Locals, cuda_dialect
from deepdsl.backends.escape import c_comment
from deepdsl.backends.loops import LoopGen
from deepdsl.backends.sizes import Sizes
from deepdsl.ir import REGISTRY, Stmt
from deepdsl.ir.analysis import index_form, output_indices, top_reductions
from deepdsl.ir.groups import group_form, is_flat
from deepdsl.ir.indexexpr import IE, Affine, Read, Reduce, format_ie, shared_subexpressions
from deepdsl.ir.printer import format_stmt
from deepdsl.ir.types import DType
from deepdsl.ir.vendor import VendorCall, vendor_call
from deepdsl.memory.groups import planned_groups
from deepdsl.memory.plan import Plan
from deepdsl.ops.conv import OWN_TILE

BLOCK = 256  # threads per block of the element-wise and row kernels
TILE = 16  # the threads of a tiled kernel's block: TILE x TILE (library.cu dd_tiled)
TILE_M, TILE_N, TILE_K = OWN_TILE  # a tiled kernel's block tile: rows, columns, a step (DD_BM, DD_BN, DD_BK)
MAX_GRID = 1 << 16  # blocks of a grid-stride launch at most (its loop covers the rest)
MAX_THREADS = 1024  # device limits the launches are checked against
MAX_STATIC_SMEM = 48 * 1024
GRID_LIMITS = (2**31 - 1, 65535, 65535)
BLOCK_SMEM = 32 * 4  # dd_block_sum / dd_block_max: one float per warp
GEMM_SMEM = 2 * TILE_K * (TILE_M + 4 + TILE_N + 4) * 4  # dd_tiled's two buffers of A's and B's tiles (padded rows)


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


def _params(out_ctype: str, ctypes: tuple[str, ...], restrict: bool) -> str:
    r = "__restrict__ " if restrict else ""
    return ", ".join([f"{out_ctype}* {r}out", *(f"const {t}* {r}in{k}" for k, t in enumerate(ctypes))])


def _grid_for(n: int, block: int) -> int:
    return max(1, min(MAX_GRID, -(-n // block)))


def ie_kernel(
    name: str, body: IE, out: tuple[tuple[str, int], ...], shapes: tuple[tuple[int, ...], ...],
    ctypes: tuple[str, ...] | None = None, comments: tuple[str, ...] = (), generic: bool = False,
) -> Kernel:  # fmt: skip
    """The kernel computing out[idx] = body over `out`'s grid, under one comment line for each of `comments`.
    `generic` takes the sizes as arguments, so that one kernel serves every statement of the same text: an
    element-wise kernel its element count `n`, another every dim of its output and of its inputs in order
    (backends/sizes.py names them)."""
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
    params = _params("float", ctypes, False)
    if not cooperative and is_flat(body, out, shapes):
        g.flat = True
        pre: list[str] = []
        value = as_float(g.expr(body, pre, "    "))
        head.append(f'extern "C" __global__ void {name}({params}{", int n" if generic else ""}) {{')
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
) -> Kernel:  # fmt: skip
    """One grid-stride kernel computing out0[e] = bodies[0], out1[e] = bodies[1], ... element by element: the
    statements of one group (ir/groups.py). Body j reads the shared inputs in0, in1, ... (`shapes`, `ctypes`), and
    `readers[j]` maps an input index of its own to the earlier result m it reads instead (held in the local r{m})."""
    _check_size(name, numel, *(math.prod(x) for x in shapes))
    outs = [f"float* out{m}" for m in range(len(bodies))]
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
        lines += pre + [f"    const float r{j} = {value};", f"    out{j}[e] = r{j};"]
    lines += ["  }", "}"]
    return Kernel("\n".join(lines), (_grid_for(numel, BLOCK), 1, 1), (BLOCK, 1, 1), 0, numel, "grid-stride")


def _check_size(name: str, *sizes: int) -> None:
    if max(sizes, default=0) >= 2**31:
        raise ValueError(
            f"kernel {name}: a tensor of {max(sizes)} elements is beyond the 32-bit indices of the kernels"
        )


# ---- ops without an index form ----


def library_call(name: str, s: Stmt, ctypes: tuple[str, ...], out_ctype: str, call: str, **launch: Any) -> Kernel:
    """The kernel `name` whose one line is `call`, a function of library.cu, launched as `launch` says (the
    keywords of `Kernel`: grid, block, static_smem, covers, loop; with `scratch` its last parameter is float* ws)."""
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
    return "float" if dtype is DType.F32 else "long long"


def _ident(text: str) -> str:
    return re.sub(r"_+", "_", re.sub(r"[^A-Za-z0-9_]", "_", text)).strip("_")


@dataclass
class _Program:
    plan: Plan
    prefix: str = ""
    updates: dict[str, str] = field(default_factory=dict)  # update value -> the tensor it replaces
    tensors: dict[str, str] = field(default_factory=dict)  # value -> program tensor (input, parameter, state)
    views: dict[str, str] = field(default_factory=dict)  # view value -> its base value
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
        base = value
        while base in self.views:
            base = self.views[base]
        base = self.plan.in_state.get(base, base)
        if base in self.tensors:
            return Arg(value, "tensor", self.tensors[base], 0, ctype)
        return Arg(value, "arena", base, self.plan.buffer_of(base).offset, ctype)

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
                                    k.loop, k.tiles, also, vendor, finishes))  # fmt: skip

    def group(self, stmts: tuple[Stmt, ...]) -> None:
        """One kernel for the statements of a group (ir/groups.py): every result written in the same loop."""
        form = group_form(stmts)
        shared = form.inputs
        what = "_".join(s.a["ops"][0] if s.op == "fused" and s.a.get("ops") else s.op for s in stmts)
        name = self.name(stmts[-1], what=what)  # after the last result: an update's parameter
        comments = tuple(format_stmt(s) for s in stmts)
        ctypes = tuple(_ctype(v.type.dtype) for v in shared)
        shapes = tuple(v.type.shape for v in shared)
        k = group_kernel(name, form.bodies, stmts[0].out.type.numel, shapes, ctypes, form.held, comments)
        values = (*(s.out.name for s in stmts), *(v.name for v in shared))
        self.add(stmts[0], name, k, values, ("float",) * len(stmts) + ctypes, tuple(s.out.name for s in stmts[1:]))

    def statement(self, s: Stmt) -> None:
        op = REGISTRY[s.op]
        if op.view:
            self.views[s.out.name] = s.inputs[0].name
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
            if out_type != "float":
                raise ValueError(f"%{s.out.name} = {s.op}: index-expression kernels write float32 only")
            if own is not None:  # an op's own index form takes no epilogue: every input is the body's
                arity = len(s.inputs)
            body, out = form
            name = self.name(s)
            shapes = tuple(v.type.shape for v in s.inputs[:arity])
            meaning = (
                f"out[{', '.join(v for v, _ in out)}] = {format_ie(body, tuple(f'in{k}' for k in range(len(shapes))))}"
            )
            k = ie_kernel(name, body, out, shapes, in_types[:arity], (format_stmt(s), meaning))
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
                self.add(s, f"{name}_finish", k.finish, (s.out.name,), ("float",), scratch=scratch, finishes=True)
        if "epilogue" in s.a:
            extras = s.inputs[arity:]
            out = output_indices(s.out.type)
            shapes = (s.out.type.shape, *(v.type.shape for v in extras))
            epi = s.a["epilogue"]
            ename = self.name(s, "_epilogue")
            names = ("out", *(f"in{k}" for k in range(1, len(shapes))))
            meaning = f"out[{', '.join(v for v, _ in out)}] = {format_ie(epi, names)}"
            ek = ie_kernel(
                ename, epi, out, shapes, ("float", *in_types[arity:]), (f"epilogue of %{s.out.name}: {meaning}",)
            )
            evalues = (s.out.name, s.out.name, *(v.name for v in extras))
            self.add(s, ename, ek, evalues, ("float", "float", *in_types[arity:]))


def program(plan: Plan, prefix: str = "") -> CudaProgram:
    """The CUDA translation unit of a plan, and its launches in program order; `prefix` starts every kernel's
    name (two programs in one module)."""
    g = plan.graph
    p = _Program(plan, prefix, {v.name: name for name, v in g.updates})
    for d in g.inputs:
        p.tensors[d.value.name] = d.value.name
    for d in g.params:
        p.tensors[d.value.name] = d.value.name
    for group in planned_groups(plan):
        if len(group) == 1:
            p.statement(group[0])
        else:
            p.group(group)
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
