"""The kernels of statements: one `extern "C" __global__` kernel per statement, group or multi-tensor launch.

Statements with an index expression (element-wise, fused and `indexed` ones, every op with a registry `index_form`,
and the shape ops written as index expressions, their `cuda_form`) become kernels written from that expression
(expressions.py). One thread computes one output element in a grid-stride loop (float4s where every read allows
it); a body whose outermost work is a reduction (channel statistics, `sum`, a mean) runs one block per output
element instead, its threads sharing the reduction. The statements of a group (ir/groups.py) share one loop; a
multi-tensor launch (ir/launches.py) runs many groups' loops, each a segment of a table. A large sum is a pass of
its own (passes.py). The other ops call a hand-written function of library.cu with the statement's shapes as
constants (`library_call`): their registry entries' `cuda` field (ops.py).
"""

from __future__ import annotations

import math
import re
from typing import Any

from deepdsl.backends.cexpr import Locals
from deepdsl.backends.cuda.expressions import Gen, as_float, c_product
from deepdsl.backends.cuda.launch import BLOCK, BLOCK_SMEM, VECTOR, Kernel, check_size, grid_for
from deepdsl.backends.escape import c_comment
from deepdsl.backends.sizes import Sizes
from deepdsl.ir import Stmt
from deepdsl.ir.analysis import own_index, top_reductions
from deepdsl.ir.groups import is_flat
from deepdsl.ir.indexexpr import (
    IE,
    Affine,
    reads,
    shared_subexpressions,
)  # fmt: skip
from deepdsl.ir.printer import format_stmt
from deepdsl.ir.types import DType

Form = tuple[IE, tuple[tuple[str, int], ...]]  # an index expression over the output's indices (name, size)


def _params(out_ctype: str, ctypes: tuple[str, ...], restrict: bool) -> str:
    r = "__restrict__ " if restrict else ""
    return ", ".join([f"{out_ctype}* {r}out", *(f"const {t}* {r}in{k}" for k, t in enumerate(ctypes))])


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
    check_size(name, numel, *(math.prod(s) for s in shapes))
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
                return Kernel(text, (grid_for(numel, BLOCK), 1, 1), (BLOCK, 1, 1), 0, numel, "grid-stride",
                              float4=True)  # fmt: skip
        if vector and out_ctype == "float" and not generic and vectorisable(body, out, shapes):
            vector_lines = _vector_loop(g, body, numel, shapes, ctypes)
            if vector_lines:
                return Kernel("\n".join(head + vector_lines + ["}"]), (grid_for(numel // VECTOR, BLOCK), 1, 1),
                              (BLOCK, 1, 1), 0, numel, "grid-stride", float4=True)  # fmt: skip
        pre: list[str] = []
        value = as_float(g.expr(body, pre, "    "))
        lines += [f"  DD_GRID_STRIDE(e, {'n' if generic else numel}) {{", *pre, f"    out[e] = {value};", "  }"]
        return Kernel("\n".join(head + lines + ["}"]), (grid_for(numel, BLOCK), 1, 1), (BLOCK, 1, 1), 0, numel,
                       "grid-stride")  # fmt: skip
    sizes = Sizes(tuple(n for _, n in out), shapes) if generic else None
    g.sizes = sizes
    names = [g.bind(var, size) for var, size in out]
    g.own = tuple(Affine.var(v) for v, _ in out), tuple(n for _, n in out)
    loop = "DD_BLOCK_STRIDE" if cooperative else "DD_GRID_STRIDE"
    total = c_product([Sizes.out_dim(j) for j in range(len(out))]) if sizes is not None else str(numel)
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
        return Kernel(text, (grid_for(numel, 1), 1, 1), (block, 1, 1), BLOCK_SMEM, numel, "block-stride")
    return Kernel(text, (grid_for(numel, BLOCK), 1, 1), (BLOCK, 1, 1), 0, numel, "grid-stride")


def group_kernel(
    name: str, bodies: tuple[IE, ...], numel: int, shapes: tuple[tuple[int, ...], ...], ctypes: tuple[str, ...],
    readers: tuple[dict[int, int], ...], comments: tuple[str, ...], generic: bool = False,
    out_ctypes: tuple[str, ...] = (),
) -> Kernel:  # fmt: skip
    """One grid-stride kernel computing out0[e] = bodies[0], out1[e] = bodies[1], ... element by element: the
    statements of one group (ir/groups.py). Body j reads the shared inputs in0, in1, ... (`shapes`, `ctypes`), and
    `readers[j]` maps an input index of its own to the earlier result m it reads instead (held in the local r{m}).
    `out_ctypes`: each result's storage (default float); a later body reads an earlier result as it is stored."""
    check_size(name, numel, *(math.prod(x) for x in shapes))
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
    return Kernel("\n".join(lines), (grid_for(numel, BLOCK), 1, 1), (BLOCK, 1, 1), 0, numel, "grid-stride")


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
