"""Kernels the Java backend writes as one call of the runtime's hand-vectorised loops (deepdsl/runtime: Kernel.gelu,
Kernel.geluGrad, Kernel.geluBias, Kernel.columnSums) instead of generated loops, and the output axis the runtime
splits a shaped kernel by. Each call is chosen only where the kernel's body is exactly the index form the call
computes; any other body keeps its generated loops."""

from __future__ import annotations

from deepdsl.backends.collapse import Collapsed
from deepdsl.ir.indexexpr import IE, Affine, Apply, Read, Reduce, reads
from deepdsl.ops.elementwise import gelu_index


def plain_column_sum(body: IE, out: tuple[tuple[str, int], ...], shapes: tuple[tuple[int, ...], ...]) -> int | None:
    """The input `k` where `body` over `out` (collapsed) is `sum[r] in_k[r, j]`, every row of a matrix added into
    its columns (a bias's or a layer norm's scale's gradient), which Kernel.columnSums computes; None otherwise."""
    if len(out) != 1 or not isinstance(body, Reduce) or body.kind != "sum" or len(body.vars) != 1:
        return None
    term = body.body
    (r, n), j = body.vars[0], out[0][0]
    if not isinstance(term, Read) or term.index != (Affine.var(r), Affine.var(j)):
        return None
    return term.input if shapes[term.input] == (n, out[0][1]) else None


def split_axis(c: Collapsed, column: bool) -> int:
    """The output axis whose indices a shaped kernel's pieces cover (`lo`, `hi`): the first, or the second where
    the first has size 1 (a layer norm's `[1, rows, width]`, which split by its first axis would be one piece on
    one thread) and the second is the buffer's own (not merged with the third by the collapse), so that the
    runtime's split of the output's dim 1 is this loop's range. The loops before it run whole, so the kernel
    stays right for every size the statements sharing it have."""
    if column or len(c.out) < 2 or c.out[0][1] != 1 or c.out_axes[1] != (1,):
        return 0
    return 1


def gelu_call(body: IE) -> str | None:
    """The runtime's call for a flat kernel that is GELU (`gelu(x)`) or its gradient (`g * gelu'(x)`), exactly as
    their index forms write them: Kernel.gelu and Kernel.geluGrad compute the same in loops the JIT vectorises
    (deepdsl/runtime/Kernel.java: 11-12 ns an element as one loop, about 4 in those); None for any other body."""
    for x in {r for r in reads(body) if r.index}:
        if body == gelu_index(x, 0):
            return f"    Kernel.gelu(o, po, a{x.input}, p{x.input}, lo, hi);"
        if isinstance(body, Apply) and body.fn == "*" and len(body.args) == 2 and body.args[1] == gelu_index(x, 1):
            g = body.args[0]
            if isinstance(g, Read) and g.index:
                return f"    Kernel.geluGrad(o, po, a{g.input}, p{g.input}, a{x.input}, p{x.input}, lo, hi);"
    return None


def gelu_bias_call(body: IE, out: tuple[tuple[str, int], ...], shapes: tuple[tuple[int, ...], ...]) -> str | None:
    """Kernel.geluBias's call for a kernel over rows `[R, C]` that is `gelu(x[i0, i1] + b[i1])` exactly as the
    index form writes it (a linear layer's bias and GELU as its product's epilogue, in the inference program),
    which runs each row through Kernel.gelu's vectorised loops; None for any other body."""
    if len(out) != 2:
        return None
    (i0, rows), (i1, cols) = out
    for x in {r for r in reads(body) if r.index == (Affine.var(i0), Affine.var(i1))}:
        for b in {r for r in reads(body) if r.index == (Affine.var(i1),)}:
            if shapes[x.input] != (rows, cols) or shapes[b.input] != (cols,):
                continue
            for total in (Apply("+", (x, b)), Apply("+", (b, x))):
                if body == gelu_index(total, 0):
                    return (f"    Kernel.geluBias(o, po, a{x.input}, p{x.input}, a{b.input}, p{b.input}, "
                            "out.shape[1], lo, hi);")  # fmt: skip
    return None
