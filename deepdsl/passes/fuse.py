"""Loop fusion: element-wise chains, reduction prologues and epilogues of library kernels.

Every op with an index form (element-wise ops, broadcasts, per-channel and whole reductions, the
optimizer updates) is an index expression over its output. A value read by exactly one statement, and
by no output or update, is substituted into its reader's expression, so the chain becomes one `fused`
statement: one kernel, no intermediate buffer. This is legal because the ops are pure and the reader
computes every element of the producer it needs. A producer containing a reduction is only merged
when its reader reads it element for element (otherwise the reduction would be recomputed per element).

Then an element-wise statement that alone reads the result of a conv, full or matmul (an op whose entry
`accepts_epilogue`) becomes that kernel's epilogue (`epilogue` attr: Read(0) is the kernel's own result), as
bias add + ReLU after a conv.
Last, an element-wise statement reading the kept result of the one before it is marked to share its loop
(`same_loop`, ir/groups.py): a parameter's momentum and step become one kernel.

Fusing computes the producer where its reader stands, so the producer's inputs live until then; a merge
is only made when the inputs it keeps alive longer weigh no more than the buffer it saves, so fusion never
raises the memory peak.
"""

from __future__ import annotations

import re

from deepdsl.ir import REGISTRY, Graph, Stmt, Value
from deepdsl.ir.graph import make_attrs
from deepdsl.ir.groups import can_join
from deepdsl.ir.index_grad import substitute
from deepdsl.ir.indexexpr import IE, Affine, Apply, Read, Reduce, reads, renumber
from deepdsl.ops._index_forms import out_vars
from deepdsl.passes.rewrite import uses
from deepdsl.passes.simplify import fold


def fuse(g: Graph) -> Graph:
    g2 = share_loops(fuse_epilogues(fuse_chains(g)))
    return g if g2.stmts == g.stmts else g2


def share_loops(g: Graph) -> Graph:
    """Mark `same_loop` every element-wise statement that can run in the loop of the ones before it (ir/groups.py):
    a result that is kept (an update, or read again later) cannot be fused into its reader, but both can still be
    one kernel, as a parameter's momentum and step are."""
    out: list[Stmt] = []
    group: list[Stmt] = []
    for s in g.stmts:
        if group and can_join(group, s):
            s = s.replace(attrs=make_attrs(**{**s.a, "same_loop": True}))
            group.append(s)
        else:
            group = [s]
        out.append(s)
    return g.replace(stmts=tuple(out))


def _form(s: Stmt) -> tuple[tuple, IE, list[Value], tuple[str, ...]] | None:
    if s.op == "fused":
        return s.a["out"], s.a["body"], list(s.inputs), tuple(s.a["ops"])
    op = REGISTRY[s.op]
    if op.index_form is None or "epilogue" in s.a:
        return None
    out = tuple(zip(out_vars(s.out.type), s.out.type.shape))
    return out, op.index_form(tuple(v.type for v in s.inputs), s.out.type, s.a), list(s.inputs), (s.op,)


def lifetimes(g: Graph) -> tuple[dict[str, int], dict[str, int], set[str]]:
    """Where each value is made, where it is last read, and which values are persistent (never freed)."""
    made = {s.out.name: i for i, s in enumerate(g.stmts)}
    last: dict[str, int] = {}
    for i, s in enumerate(g.stmts):
        for v in s.inputs:
            last[v.name] = i
    persistent = {d.value.name for d in g.inputs} | {p.value.name for p in g.params}
    return made, last, persistent


def costs_no_memory(moved: list[Value], saved: Value, to: int, last: dict[str, int], persistent: set[str]) -> bool:
    """Computing a value later, at statement `to`, keeps the `moved` inputs alive until then instead of
    `saved`; that never raises the bytes alive at any point when the inputs it extends weigh no more."""
    extended = {v.name: v.type.nbytes for v in moved if v.name not in persistent and last.get(v.name, to) < to}
    return sum(extended.values()) <= saved.type.nbytes


def fuse_chains(g: Graph) -> Graph:
    count = uses(g)
    pinned = {v.name for _, v in (*g.outputs, *g.updates)}
    made, last, persistent = lifetimes(g)
    forms: dict[str, tuple] = {}
    merged: set[str] = set()
    out_stmts: list[Stmt] = []
    fresh = [0]
    for position, s in enumerate(g.stmts):
        form = _form(s)
        if form is None:
            out_stmts.append(s)
            continue
        out, body, inputs, ops = form
        grew = False
        k = 0
        while k < len(inputs):
            v = inputs[k]
            producer = forms.get(v.name)
            if (
                producer is None
                or count.get(v.name, 0) != 1
                or v.name in pinned
                or not _mergeable(body, k, out, producer)
                or not costs_no_memory(producer[2], v, position, last, persistent)
            ):
                k += 1
                continue
            body, inputs = _inline(body, inputs, k, producer, fresh)
            ops = producer[3] + ops
            merged.add(v.name)
            grew = True
            k = 0
        forms[s.out.name] = (out, body, inputs, ops)
        if grew:
            body = fold(body)  # the composed expression's constants (2 * 1 / 288) fold at once
            s = s.replace(op="fused", inputs=tuple(inputs), attrs=make_attrs(out=out, body=body, ops=ops))
        out_stmts.append(s)
    if not merged:
        return g
    return g.replace(stmts=tuple(s for s in out_stmts if s.out.name not in merged))


def _mergeable(body: IE, k: int, out: tuple, producer: tuple) -> bool:
    p_out, p_body = producer[0], producer[1]
    if not _has_reduce(p_body):
        return True
    rs = [r for r in reads(body) if r.input == k]
    identity = tuple(Affine.var(n) for n, _ in out)
    return len(rs) == 1 and rs[0].index == identity and tuple(n for _, n in p_out) == tuple(n for _, n in out)


def _has_reduce(e: IE) -> bool:
    if isinstance(e, Reduce):
        return True
    return isinstance(e, Apply) and any(_has_reduce(a) for a in e.args)


def _inline(body: IE, inputs: list[Value], k: int, producer: tuple, fresh: list[int]) -> tuple[IE, list[Value]]:
    p_out, p_body, p_inputs, _ = producer
    new_inputs = [v for j, v in enumerate(inputs) if j != k]
    position: dict[int, int] = {}
    for j, v in enumerate(p_inputs):
        if v in new_inputs:
            position[j] = new_inputs.index(v)
        else:
            position[j] = len(new_inputs)
            new_inputs.append(v)
    fresh[0] += 1
    tag = f"_{fresh[0]}"
    p_body = _rename_bound(renumber(p_body, position), tag)
    temps = [(name, f"{name}{tag}") for name, _ in p_out]
    for name, temp in temps:
        p_body = substitute(p_body, name, Affine.var(temp))

    def go(e: IE) -> IE:
        if isinstance(e, Read):
            if e.input == k:
                value = p_body
                for (_, temp), a in zip(temps, e.index):
                    value = substitute(value, temp, a)
                return value
            return Read(e.input - (1 if e.input > k else 0), e.index)
        if isinstance(e, Apply):
            return Apply(e.fn, tuple(go(a) for a in e.args))
        if isinstance(e, Reduce):
            return Reduce(e.kind, e.vars, go(e.body))
        return e

    return go(body), new_inputs


def _rename_bound(e: IE, tag: str) -> IE:
    """Give the producer's reduction variables names no reader uses."""
    if isinstance(e, Apply):
        return Apply(e.fn, tuple(_rename_bound(a, tag) for a in e.args))
    if isinstance(e, Reduce):
        body = e.body
        renamed = {name: re.sub(r"(_\d+)+$", "", name) + tag for name, _ in e.vars}
        for name, new in renamed.items():
            body = substitute(body, name, Affine.var(new))
        return Reduce(e.kind, tuple((renamed[n], size) for n, size in e.vars), _rename_bound(body, tag))
    return e


def fuse_epilogues(g: Graph) -> Graph:
    count = uses(g)
    pinned = {v.name for _, v in (*g.outputs, *g.updates)}
    _, last, persistent = lifetimes(g)
    position = {s.out.name: i for i, s in enumerate(g.stmts)}
    defs = {s.out.name: s for s in g.stmts}
    replace: dict[str, Stmt] = {}  # reader's result -> the host statement with its epilogue
    absorbed: set[str] = set()
    updates = {v.name for _, v in g.updates}
    for s in g.stmts:
        form = _form(s)
        # an update stays element-wise: the plan writes it straight over its parameter or optimizer state, which
        # a product with an epilogue could not do (the epilogue reads the old value after the product is written)
        if form is None or s.out.name in updates:
            continue
        out, body, inputs, _ = form
        identity = tuple(Affine.var(n) for n, _ in out)
        for k, v in enumerate(inputs):
            host = defs.get(v.name)
            if (host is None or not REGISTRY[host.op].accepts_epilogue or "epilogue" in host.a or count.get(v.name) != 1
                    or v.name in pinned or host.out.type != s.out.type or host.out.name in absorbed):  # fmt: skip
                continue
            if not costs_no_memory(list(host.inputs), host.out, position[s.out.name], last, persistent):
                continue
            rs = [r for r in reads(body) if r.input == k]
            if any(r.index != identity for r in rs) or _has_reduce(body):
                continue
            extras = [x for j, x in enumerate(inputs) if j != k]
            mapping = {k: 0, **{j: (i + 1) for i, j in enumerate(j for j in range(len(inputs)) if j != k)}}
            epilogue = renumber(body, mapping)
            replace[s.out.name] = host.replace(
                out=s.out, inputs=(*host.inputs, *extras), attrs=host.attrs + (("epilogue", epilogue),)
            )
            absorbed.add(host.out.name)
            break
    if not replace:
        return g
    stmts = [replace.get(s.out.name, s) for s in g.stmts if s.out.name not in absorbed]
    return g.replace(stmts=tuple(stmts))
