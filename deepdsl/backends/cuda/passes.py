"""Large sums split over blocks, and reductions over one range in one pass (ir/reductions.py).

A large sum (batch-norm statistics, dgamma and dbeta, bias gradients, sums over the batch) is split over blocks: a
2-D grid (blockIdx.y a piece of the range: batch rows outer, the rest inner and contiguous, no division per element,
the inner loop unrolled), partial sums in double in the statement's planned workspace, and in the same launch the
last block to finish (library.cu `dd_last_block`: a fence, then a count on a counter of the module) adds each
output's partial sums in slice order (the same bits every run, whichever block is last) and writes the results;
reductions over the same range run in one such pass (a batch norm's mean and variance, its sum and sum of squares,
with the running statistics' updates done by that last block; dgamma with dbeta). Both CUDA devices launch these
kernels: the PyCUDA runner's program (translation.py) and the Java program's `ReductionPass` constants.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from deepdsl.backends.collapse import collapse
from deepdsl.backends.cuda.expressions import Gen, as_float, ctype_of, float_literal
from deepdsl.backends.cuda.launch import SPLIT_SMEM, Kernel, grid_for
from deepdsl.backends.escape import c_comment
from deepdsl.ir.graph import Value
from deepdsl.ir.indexexpr import (
    IE,
    Affine,
    Apply,
    Const,
    Read,
    Reduce,
    Var,
    format_ie,
    renumber,
)  # fmt: skip
from deepdsl.ir.reductions import THREADS, ReductionGroup, is_total


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
    ctypes = tuple(ctype_of(v.type.dtype) for v in inputs)
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
    kernel = Kernel("\n".join(lines), (grid_for(numel, 1), split.slices, 1), (block, 1, 1), SPLIT_SMEM, numel,
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
