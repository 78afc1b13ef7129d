"""An index expression as Java loops (the CPU device's code for every op with an index form).

`java_kernel(body, out, shapes)` writes the Java body of a kernel (the lambda `(out, in, lo, hi) -> {...}` of its
constant) computing `out[idx] = body` over the output's grid, with the meaning of `ops.indexed.evaluate`: a read
outside its input is 0 (the bounds test is written only where the affine index can leave the input), `Reduce` is a
local accumulator over nested loops (four for a long sum, so that its additions do not wait on each other),
comparisons are Java booleans; a subexpression used more than once outside the reductions is computed once into a
local (cexpr.Locals). When every read is the output's own element (or a scalar), the kernel is one flat loop;
otherwise nested loops, innermost over the last axis, with adjacent axes that every read indexes as one contiguous
run merged into one loop (backends/collapse.py: a 4-d bias add loops over rows, channels and H*W). A kernel
computes a range of its output (elements, or rows of its first axis): the runtime's Kernel.run splits the output
over threads by the kernel's work, which `java_cost` states for the kernel's constant. A sum down columns runs with
the reduction outside and the output's last axis inside (java/column_sums.py), and what a loop does not change is
computed before it (java/invariants.py)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from deepdsl.backends import cexpr
from deepdsl.backends.cexpr import Locals, java_dialect
from deepdsl.backends.collapse import collapse
from deepdsl.backends.java.column_sums import column_form, column_loops
from deepdsl.backends.java.invariants import hoist, mentions, per_element
from deepdsl.backends.java.names import JAVA_KEYWORDS
from deepdsl.backends.java.runtime_calls import gelu_bias_call, gelu_call, plain_column_sum, split_axis
from deepdsl.backends.loops import LoopGen
from deepdsl.backends.sizes import Sizes
from deepdsl.ir.groups import is_flat
from deepdsl.ir.indexexpr import IE, Affine, Apply, Const, Read, Reduce, reads, shared_subexpressions


def float_literal(v: float) -> str:
    """The Java float literal of `v` rounded to float32 (shortest text that reads back the same)."""
    f = np.float32(v)
    if math.isnan(f):
        return "Float.NaN"
    if math.isinf(f):
        return "Float.POSITIVE_INFINITY" if f > 0 else "Float.NEGATIVE_INFINITY"
    return f"{str(f)}f"  # numpy prints the shortest decimal that reads back as this float32


JAVA = java_dialect(float_literal)


@dataclass
class Gen(LoopGen):
    """A Java kernel being printed (backends/loops.py): reads from the buffers' arrays at their offsets (`a0[p0 +
    i]`), long sums over several accumulators (lane_sum), a ReLU's gradient and small powers without a call, and
    invariants computed before the loop that does not change them (`hoisted`, java/invariants.py)."""

    DIALECT = JAVA
    RESERVED = re.compile(r"(no|sto|n\d+_|st\d+_)\d+")

    own: tuple[tuple[Affine, ...], tuple[int, ...], str] | None = None  # the output's index, shape and offset
    tail: bool = False  # lane sums for every size: a range not a multiple of the lanes finished one term a step
    chunked: bool = False  # flat, with the elements read from the chunk buffers b{k}[e] (java_group_kernel)

    def usable(self, var: str) -> bool:
        return var.isidentifier() and var.isascii() and var not in JAVA_KEYWORDS

    def numbered(self, base: str, k: int) -> str:
        # a size's name (`no0`) with a digit added would be one still: it takes `_k` (no0_2), as CUDA's names do
        return f"{base}_{k}" if self.RESERVED.fullmatch(base) else f"{base}{k}"

    def read(self, r: Read) -> str:
        if r.input in self.registers:
            return self.registers[r.input]
        if self.flat:
            if self.chunked and r.index:
                return f"b{r.input}[e]"
            return f"a{r.input}[p{r.input}{' + e' if r.index else ''}]"
        if self.sizes is not None:
            return self.generic_read(r)
        offset, tests = self.strided(r)
        base = f"p{r.input}"
        element = f"a{r.input}[{base}]" if offset == "0" else f"a{r.input}[{base} + {offset}]".replace("+ -", "- ")
        return self.guarded(tests, element)

    def generic_read(self, r: Read) -> str:
        """A read with the sizes as names: each axis's index times its stride, tested against its dim; the output's
        own element (an input of the output's shape read at the output's index) at the output's offset, so that
        its sizes are the output's (as the CUDA printer reads it at `e`)."""
        assert self.sizes is not None
        if self.own is not None and r.index == self.own[0] and self.shapes[r.input] == self.own[1]:
            return f"a{r.input}[p{r.input} + {self.own[2]}]"  # the output's own element: at the output's offset
        offset = self.sizes.offset(r.input, r.index, self.names)
        element = f"a{r.input}[p{r.input}]" if offset == "0" else f"a{r.input}[p{r.input} + {offset}]"
        return self.guarded(self.generic_tests(r), element)

    def count_bounds(self, r: Reduce) -> list[str]:
        return [self.bounds_of.get(var, str(size)) for var, size in r.vars]  # as its loops were written

    def special(self, e: Apply, pre: list[str], indent: str, top: bool) -> tuple[str, str] | None:
        test = e.args[0]
        if e.fn == "select" and _zero(e.args[2]) and isinstance(test, Apply) and test.fn == ">" and _zero(test.args[1]):
            # y > 0 ? g : 0 (a relu's gradient) without a branch, which mispredicts on activations (Kernel.java)
            y, g = self.expr(test.args[0], pre, indent), self.expr(e.args[1], pre, indent)
            if y[1] == g[1] == "f":
                return f"Kernel.whenPositive({y[0]}, {g[0]})", "f"
        return None

    def special_args(self, e: Apply, args: list[tuple[str, str]]) -> tuple[str, str] | None:
        if e.fn == "^" and isinstance(e.args[1], Const) and e.args[1].value in (1.0, 2.0) and args[0][1] == "f":
            # x and x * x: what (float) Math.pow rounds to for these exponents (a float's square is exact in
            # double), without the call
            x = args[0][0]
            if e.args[1].value == 1.0:
                return x, "f"
            if re.fullmatch(r"[\w\[\] +]+", x):  # a name or an element: read twice, not computed twice
                return f"({x} * {x})", "f"
        return None

    def special_reduce(self, e: Reduce, acc: str, pre: list[str], indent: str, top: bool) -> str | None:
        lanes = _sum_lanes(e, self.tail)
        return self.lane_sum(e, acc, lanes, pre, indent) if lanes > 1 else None

    def lane_sum(self, e: Reduce, acc: str, lanes: int, pre: list[str], indent: str) -> str:
        """A sum whose innermost loop steps by `lanes`, term j into accumulator j: independent additions
        instead of one chain, each accumulator's terms in order, the accumulators added pairwise at the end."""
        parts = [f"{acc}{chr(ord('a') + j)}" for j in range(lanes)]
        pre.append(f"{indent}float {', '.join(f'{part} = 0f' for part in parts)};")
        inner = indent
        bound = ""
        for k, (var, size) in enumerate(e.vars):
            bound = self.range_of(var, size, e.body)
            v = self.bind(var, size, bound)
            last_loop = k == len(e.vars) - 1
            step = f"{v} += {lanes}" if last_loop else f"{v}++"
            limit = f"{bound} - {lanes - 1}" if last_loop and self.tail else bound
            pre.append(f"{inner}for (int {v} = 0; {v} < {limit}; {step}) {{")
            inner += "  "
        last = e.vars[-1][0]
        v = self.names[last]
        for j, part in enumerate(parts):
            self.names[last] = f"({v} + {j})" if j else v
            pre.append(f"{inner}{part} += {as_float(self.expr(e.body, [], inner))};")
        self.names[last] = v
        pre.append(f"{inner[:-2]}}}")
        if self.tail:  # the terms after the last multiple of the lanes, in order, into the first accumulator
            pre.append(f"{inner[:-2]}for (int {v} = {bound} - {bound} % {lanes}; {v} < {bound}; {v}++) {{")
            pre.append(f"{inner}{parts[0]} += {as_float(self.expr(e.body, [], inner))};")
            pre.append(f"{inner[:-2]}}}")
        for k in range(1, len(e.vars)):
            pre.append(f"{indent}{'  ' * (len(e.vars) - 1 - k)}}}")
        while len(parts) > 1:
            parts = [f"({parts[j]} + {parts[j + 1]})" for j in range(0, len(parts), 2)]
        return parts[0]  # the accumulators added pairwise where the sum is used


SUM_LANES = 4  # accumulators of a long sum (see Gen.lane_sum)


def _zero(e: IE) -> bool:
    """Whether `e` is the constant +0."""
    return isinstance(e, Const) and e.value == 0.0 and not math.copysign(1.0, e.value) < 0


def _sum_lanes(e: Reduce, tail: bool = False) -> int:
    """SUM_LANES for a sum whose innermost loop is long and a multiple of it (with `tail`, of any length), with no
    reduction inside; else 1."""
    size = e.vars[-1][1] if e.vars else 0
    plain = not any(isinstance(x, Reduce) for x in _subexprs(e.body))
    long = tail or (size >= 2 * SUM_LANES and size % SUM_LANES == 0)
    return SUM_LANES if e.kind == "sum" and plain and e.vars and long else 1


def _subexprs(e: IE) -> list[IE]:
    return [e, *(x for a in e.args for x in _subexprs(a))] if isinstance(e, Apply) else [e]


def as_float(arg: tuple[str, str]) -> str:
    return cexpr.as_float(arg, JAVA)


def flat_form(e: IE) -> IE:
    """`e` with every read at the flat index `e`: the same element-wise kernel for any shape."""
    if isinstance(e, Read):
        return Read(e.input, (Affine.var("e"),) if e.index else ())
    if isinstance(e, Apply):
        return Apply(e.fn, tuple(flat_form(a) for a in e.args))
    return e


def _work(e: IE, seen: set[IE] | None = None) -> int:
    """Operations per output element; a subexpression used again outside a reduction's body (held in a local)
    counts once."""
    seen = set() if seen is None else seen
    if isinstance(e, Apply | Reduce):
        if e in seen:
            return 0
        seen.add(e)
    if isinstance(e, Reduce):
        return math.prod(n for _, n in e.vars) * (1 + _work(e.body, set()))
    if isinstance(e, Apply):
        return 1 + sum(_work(a, seen) for a in e.args)
    return 1


def java_kernel(body: IE, out: tuple[tuple[str, int], ...], shapes: tuple[tuple[int, ...], ...],
                tail: bool = False) -> str:  # fmt: skip
    """The statements of the Java body of a kernel computing `body` over `out`, the lambda `(out, in, lo, hi) ->
    {...}` of its constant: the elements `[lo, hi)` of `out` (a flat kernel) or its rows `[lo, hi)` (the indices
    of its first axis); the runtime's Kernel.run splits the output over threads by `java_cost`. With `tail`, its
    sums are correct for every size (unit_axes.py: a kernel shared by sizes its lanes may not divide)."""
    used = sorted({r.input for r in reads(body)})
    flat = is_flat(body, out, shapes)
    if not flat:  # contiguous axes as one (backends/collapse.py): sizes the products of the buffers' dims
        c = collapse(body, out, shapes)
        body, out, shapes = c.body, c.out, c.shapes
    lines = ["    float[] " + ", ".join(["o = out.a", *(f"a{k} = in[{k}].a" for k in used)]) + ";"]
    offsets = ["po = out.off", *(f"p{k} = in[{k}].off" for k in used)]
    g = Gen(shapes, taken={"o", "po", "out", "in", "lo", "hi", "e", *(f"a{k}" for k in used),
                            *(f"p{k}" for k in used)})  # fmt: skip
    g.locals = Locals(shared_subexpressions(body), g.taken)
    g.tail = tail
    if flat:  # the size comes from the output, so one kernel serves every shape
        runtime = gelu_call(body)
        if runtime is not None:
            return "\n".join([*lines, f"    int {', '.join(offsets)};", runtime])
        g.flat = True
        before = hoist(g, body, lambda x: not per_element(x, g.registers), "    ", JAVA)
        pre: list[str] = []
        value, kind = g.expr(body, pre, "      ")
        lines.append(f"    int {', '.join(offsets)};")
        lines += [*before, "    for (int e = lo; e < hi; e++) {", *pre, f"      o[po + e] = {as_float((value, kind))};"]
        lines.append("    }")
        return "\n".join(lines)
    column = column_form(body, out)
    split = split_axis(c, column is not None)
    sizes = Sizes(tuple(n for _, n in out), shapes)  # shape-generic: the sizes are the buffers' dims
    g.sizes = sizes
    names = [g.bind(var, size, sizes.out_dim(j)) for j, (var, size) in enumerate(out)]
    terms = [v if sizes.out_stride(j) == "1" else f"{v} * {sizes.out_stride(j)}" for j, v in enumerate(names)]
    target = f"o[po + {' + '.join(terms)}]" if terms else "o[po]"
    if terms:
        g.own = tuple(Affine.var(v) for v, _ in out), tuple(n for _, n in out), " + ".join(terms)
    depth = len(out)
    indent = "  " * (depth + 2)
    runtime = gelu_bias_call(body, out, shapes) if split == 0 and column is None else None
    k = plain_column_sum(body, out, shapes) if column is not None else None
    if k is not None:  # `sum[r] x[r, j]` over a matrix: the runtime's loop over four rows at a time
        rows, cols = (_dim(k, a) for a in c.in_axes[k])
        runtime = f"    Kernel.columnSums(o, po, a{k}, p{k}, {rows}, {cols}, lo, hi);"
    if runtime is not None:
        return "\n".join([*lines, f"    int {', '.join(offsets)};", runtime])
    if column is not None:  # a sum down columns: the reduction outside, the output's last axis inside
        assert isinstance(body, Reduce)
        loop = column_loops(g, body, *column, names, target, JAVA)
    else:
        loop = []
        for k, v in enumerate(names):
            lo, hi = ("lo", "hi") if k == split else ("0", sizes.out_dim(k))
            if k == depth - 1 and k > 0:  # what the innermost loop does not change, before it
                loop += hoist(g, body, lambda x, last=out[-1][0]: not mentions(x, last), "  " * (k + 2), JAVA)
            loop.append(f"{'  ' * (k + 2)}for (int {v} = {lo}; {v} < {hi}; {v}++) {{")
        pre = []
        value, kind = g.expr(body, pre, indent)
        loop += pre + [f"{indent}{target} = {as_float((value, kind))};"]
        loop += [f"{'  ' * (k + 2)}}}" for k in reversed(range(depth))]
    text = "\n".join(loop)
    strides = []
    for n, v in sizes.locals(text):  # a stride that is one dim is that dim's name
        if re.fullmatch(r"\w+", v):
            text = re.sub(rf"\b{n}\b", v, text)
        else:
            strides.append(f"{n} = {v}")
    needed = "\n".join([text, *strides])
    axes = (c.out_axes, *c.in_axes)  # a collapsed axis: the product of the buffer's dims it covers
    dims = [f"{n} = {_dim(b, axes[b + 1][j])}" for n, b, j in sizes.dims_used(needed)]
    return "\n".join([*lines, *_declarations([offsets, dims, strides]), text])


def split_of(body: IE, out: tuple[tuple[str, int], ...], shapes: tuple[tuple[int, ...], ...]) -> tuple[int, bool]:
    """How the runtime splits a kernel's output over the threads: the axis of a shaped kernel's pieces
    (Kernel.shapedOn's, runtime_calls.split_axis; 0 for a flat kernel, split by its elements), and whether it is
    a sum down the columns of its only axis (column_sums.py), whose pieces are runs of columns (Kernel.columns)."""
    if is_flat(body, out, shapes):
        return 0, False
    c = collapse(body, out, shapes)
    column = column_form(c.body, c.out) is not None
    return split_axis(c, column), column and len(c.out) == 1


def _dim(buffer: int, axes: tuple[int, ...]) -> str:
    """The run-time size of axes `axes` of `buffer` (-1: the output), one axis or a product of adjacent ones."""
    return " * ".join(f"{'out' if buffer < 0 else f'in[{buffer}]'}.shape[{a}]" for a in axes)


def _declarations(groups: list[list[str]], width: int = 120) -> list[str]:
    """`int` declarations of the locals in `groups` (offsets, dims, strides), a group joined to the line before
    it where the line stays within `width` columns."""
    lines: list[str] = []
    for group in (g for g in groups if g):
        line = f"    int {', '.join(group)};"
        if lines and len(lines[-1]) + len(line) - len("    int ") + 1 <= width:
            lines[-1] = f"{lines[-1][:-1]}, {', '.join(group)};"
        else:
            lines.append(line)
    return lines


def java_cost(body: IE, out: tuple[tuple[str, int], ...], shapes: tuple[tuple[int, ...], ...]) -> str | None:
    """The operations per output element, for the kernel's constant (the runtime splits the output over threads
    by its work): a number for a flat kernel; for a shaped one that reduces, the product of its reduction's
    ranges as a Java expression of the inputs (`in -> in[0].dim(0)`); None for one that does not (one each)."""
    if is_flat(body, out, shapes):
        return str(_work(body))
    g = Gen(shapes, sizes=Sizes(tuple(n for _, n in out), shapes))
    ranges = []
    for e in _subexprs(body):
        if isinstance(e, Reduce):
            ranges += [g.range_of(var, size, e.body) for var, size in e.vars]
    if not ranges:
        return None
    dims = [re.sub(r"^n(\d+)_(\d+)$", r"in[\1].dim(\2)", r) for r in ranges]
    one_input = len({d.split("]")[0] for d in dims}) == 1 and all(d.startswith("in[") for d in dims)
    one_input = one_input and len(set(dims)) == len(dims)
    long = "" if len(dims) == 1 or one_input else "(long) "  # distinct axes of one input: at most its size
    return f"in -> {long}{' * '.join(dims)}"


def java_group_kernel(bodies: tuple[IE, ...], readers: tuple[dict[int, int], ...]) -> tuple[str, int]:
    """The Java body of the element-wise statements of one group (ir/groups.py) in one loop over the elements
    `[lo, hi)`, the lambda `(out, in, lo, hi) -> {...}` of its constant, out[j][e] = bodies[j]: body j reads
    inputs in[0], in[1], ... and, for the input indices `readers[j]` maps, the earlier result m it needs from the
    local r{m}. Every shape shares it. With the body, its operations per element (for its constant).

    The elements go through the loop a chunk of CHUNK at a time, copied into buffers the kernel allocates (b{k}
    for input k, q{j} for output j) and the results copied back: the tensors all lie in one arena, and the JIT
    vectorises a loop only over arrays it can tell apart, which it can for arrays allocated in the method (an
    optimizer's update over 25.5M parameters, ResNet-50's SGD step: 43 -> 32 ms on one thread). Every input of a
    chunk is read before any output of it is written, as the statements mean."""
    used = sorted({r.input for b, held in zip(bodies, readers) for r in reads(b) if r.input not in held})
    elements = sorted(
        {r.input for b, held in zip(bodies, readers) for r in reads(b) if r.input not in held and r.index}
    )
    arrays = [*(f"o{m} = out[{m}].a" for m in range(len(bodies))), *(f"a{k} = in[{k}].a" for k in used)]
    offsets = [*(f"po{m} = out[{m}].off" for m in range(len(bodies))), *(f"p{k} = in[{k}].off" for k in used)]
    lines = [f"    float[] {', '.join(arrays)};", f"    int {', '.join(offsets)};"]
    loop = []
    work = 0
    taken = {f"r{j}" for j in range(len(bodies))}  # the locals of every body in the one loop
    hoisted: dict[IE, tuple[str, str]] = {}  # shared by the bodies: Adam's two steps read the same corrections
    for j, (body, held) in enumerate(zip(bodies, readers)):
        g = Gen((), flat=True, registers={k: f"r{m}" for k, m in held.items()}, taken=taken, hoisted=hoisted)
        g.chunked = True
        g.locals = Locals(shared_subexpressions(flat_form(body)), taken)
        lines += hoist(g, flat_form(body), lambda x, g=g: not per_element(x, g.registers), "    ", JAVA)
        pre: list[str] = []
        value, kind = g.expr(flat_form(body), pre, "        ")
        loop += [*pre, f"        float r{j} = {as_float((value, kind))};", f"        q{j}[e] = r{j};"]
        work += _work(body)
    buffers = [
        *(f"b{k} = new float[chunk]" for k in elements),
        *(f"q{j} = new float[chunk]" for j in range(len(bodies))),
    ]
    lines += [f"    int chunk = Math.min({CHUNK}, hi - lo);", f"    float[] {', '.join(buffers)};",
              "    for (int c = lo; c < hi; c += chunk) {", "      int n = Math.min(chunk, hi - c);",
              *(f"      System.arraycopy(a{k}, p{k} + c, b{k}, 0, n);" for k in elements),
              "      for (int e = 0; e < n; e++) {", *loop, "      }",
              *(f"      System.arraycopy(q{j}, 0, o{j}, po{j} + c, n);" for j in range(len(bodies))),
              "    }"]  # fmt: skip
    return "\n".join(lines), work


CHUNK = 512  # elements per chunk of a group kernel: its buffers (a few KiB) stay in L1
