"""A rank-2 kernel written as its rank-4 relative with two trailing axes of size 1, so that both share one kernel.

A bias add over `[N, C]` (`out[i0, i1] = in0[i0, i1] + in1[i1]`) is the channel bias add over `[N, C, H, W]` with
`H = W = 1`, and the bias gradient of a dense layer (`out[i0] = sum[r0] in0[r0, i0]`) is the channel sum over
`N, H, W` with `H = W = 1`. `padded(body, out, shapes)` gives that rank-4 form, or None where the kernel has none:

- an output of rank 2 `(i0, i1)`: every input of the output's shape is read only as `x[i0, i1]`; the output and
  those inputs get two axes of size 1 indexed by two new output variables (`x[i0, i1, u0, u1]`);
- an output of rank 1 `(i0)`: one input of shape `[N, C]` (C the output's size) is read only as `x[r, i0]`
  inside one sum over `r` alone; that input gets two axes of size 1, the sum two variables of range 1.

Legal for every network: a variable of range 1 takes only the value 0, and an axis of size 1 has the stride of the
axis after it times 1, so `x[a, b, 0, 0]` of `x` seen as `[N, C, 1, 1]` is the element at `a * C + b`, which
`x[a, b]` read; a sum over two more variables of range 1 adds the same terms. The call passes the padded tensors as
views of shape `[N, C, 1, 1]` (Network.view: the same elements), and both the Java body and the CUDA kernel take
every size from the buffers, so they read what the rank-2 kernel read. A padded rank-2 kernel is used only where
its text is a rank-4 statement's (kernel_section.kernel, found by the emitter's first pass), and that text must be
right for both sizes: it is written with `tail` (kernels.java_kernel: a lane sum finishes a range its lanes do not
divide, one term a step into the first lane) and, for the padded statement, as for new axes of size 2 (`unit`), as
the printers write a range they know to be 1 more simply. The order of a padded sum's additions changes (the rows
of a column sum add in one chain, not four lanes): the same sum, rounded differently, not a different value.
"""

from __future__ import annotations

from deepdsl.ir.indexexpr import IE, Affine, Apply, Read, Reduce, Var, reads

Padded = tuple[IE, tuple[tuple[str, int], ...], tuple[tuple[int, ...], ...], dict[int, tuple[int, ...]]]


def _fresh(body: IE, out: tuple[tuple[str, int], ...], base: str) -> tuple[str, str]:
    taken = {v for v, _ in out} | _names(body)
    names = [f"{base}{k}" for k in range(len(taken) + 2) if f"{base}{k}" not in taken]
    return names[0], names[1]


def _names(e: IE) -> set[str]:
    if isinstance(e, Var):
        return {e.name}
    if isinstance(e, Read):
        return {v for a in e.index for v, _ in a.terms}
    if isinstance(e, Reduce):
        return {v for v, _ in e.vars} | _names(e.body)
    if isinstance(e, Apply):
        return set().union(*(_names(a) for a in e.args)) if e.args else set()
    return set()


def _rewrite(e: IE, read, reduce) -> IE:  # noqa: ANN001
    if isinstance(e, Read):
        return read(e)
    if isinstance(e, Reduce):
        return reduce(Reduce(e.kind, e.vars, _rewrite(e.body, read, reduce)))
    if isinstance(e, Apply):
        return Apply(e.fn, tuple(_rewrite(a, read, reduce) for a in e.args))
    return e


def padded(body: IE, out: tuple[tuple[str, int], ...], shapes: tuple[tuple[int, ...], ...],
           unit: int = 1) -> Padded | None:  # fmt: skip
    """The rank-4 form of a rank-2 kernel (see the module's docstring): its body, output, input shapes, and the
    shape of the view each padded tensor is passed as (key -1: the output), or None. The new axes have size
    `unit` in the body and shapes (the views' are 1): the printers, which read every size from the buffers, write
    a range they know to be 1 more simply, so the shared text is written as for a size other than 1."""
    if len(out) == 2:
        (a, n), (b, c) = out
        grown = {k for k, s in enumerate(shapes) if s == (n, c)}
        if any(r.input in grown and tuple(x.plain_var for x in r.index) != (a, b) for r in reads(body)):
            return None
        u0, u1 = ("i2", "i3") if not {"i2", "i3"} & (_names(body) | {a, b}) else _fresh(body, out, "u")
        wide = (Affine.var(a), Affine.var(b), Affine.var(u0), Affine.var(u1))
        new = _rewrite(body, lambda r: Read(r.input, wide) if r.input in grown else r, lambda r: r)
        views = {-1: (n, c, 1, 1), **{k: (n, c, 1, 1) for k in grown}}
        return new, (*out, (u0, unit), (u1, unit)), _grow(shapes, grown, unit), views
    if len(out) == 1:
        (a, c) = out[0]
        sums = [x for x in _reductions(body) if x.kind == "sum" and len(x.vars) == 1]
        if len(sums) != 1:
            return None
        (r, n) = sums[0].vars[0]
        grown = {k for k, s in enumerate(shapes) if s == (n, c)}
        every = reads(body)
        inside = reads(sums[0].body)
        if len(grown) != 1 or any(x.input in grown and x not in inside for x in every):
            return None
        if any(x.input in grown and tuple(y.plain_var for y in x.index) != (r, a) for x in inside):
            return None
        u0, u1 = _fresh(body, out, "u")
        wide = (Affine.var(r), Affine.var(a), Affine.var(u0), Affine.var(u1))

        def grow_sum(x: Reduce) -> Reduce:
            return Reduce(x.kind, (*x.vars, (u0, unit), (u1, unit)), x.body) if x.vars == sums[0].vars else x

        new = _rewrite(body, lambda x: Read(x.input, wide) if x.input in grown else x, grow_sum)
        return new, out, _grow(shapes, grown, unit), {k: (n, c, 1, 1) for k in grown}
    return None


def _grow(shapes: tuple[tuple[int, ...], ...], grown: set[int], unit: int) -> tuple[tuple[int, ...], ...]:
    return tuple((*s, unit, unit) if k in grown else s for k, s in enumerate(shapes))


def _reductions(e: IE) -> list[Reduce]:
    if isinstance(e, Reduce):
        return [e, *_reductions(e.body)]
    if isinstance(e, Apply):
        return [x for a in e.args for x in _reductions(a)]
    return []
