"""Loop fusion: element-wise chains, reduction prologues and epilogues of library kernels.

First, attention's softmax takes in its scaling and causal mask (fuse_softmax.py).

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
from deepdsl.ir.analysis import (
    IndexForm,
    composable_form,
    has_reduce,
    last_reads,
    own_index,
    persistent,
    returned,
    uses,
)
from deepdsl.ir.graph import make_attrs
from deepdsl.ir.groups import can_join
from deepdsl.ir.index_grad import substitute
from deepdsl.ir.indexexpr import IE, Affine, Apply, Read, Reduce, reads, renumber
from deepdsl.passes.fuse_softmax import fuse_softmax
from deepdsl.passes.simplify import fold

MAX_FUSED_OPS = 64  # ops in one fused statement: its expression (and the generated loop) stays shallow


def fuse(g: Graph) -> Graph:
    g2 = share_loops(fuse_epilogues(fuse_chains(fuse_softmax(g))))
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


def costs_no_memory(moved: tuple[Value, ...], saved: Value, to: int, last: dict[str, int], held: set[str]) -> bool:
    """Computing a value later, at statement `to`, keeps the `moved` inputs alive until then instead of
    `saved`; that never raises the bytes alive at any point when the inputs it extends weigh no more (`last`: each
    value's last reader, `held`: the values that are never freed)."""
    extended = {v.name: v.type.nbytes for v in moved if v.name not in held and last.get(v.name, to) < to}
    return sum(extended.values()) <= saved.type.nbytes


def fuse_chains(g: Graph) -> Graph:
    count = uses(g)
    pinned = returned(g)
    last, held = last_reads(g.stmts), persistent(g)
    forms: dict[str, IndexForm] = {}
    merged: set[str] = set()
    out_stmts: list[Stmt] = []
    fresh = [0]
    for position, s in enumerate(g.stmts):
        form = composable_form(s)
        if form is None:
            out_stmts.append(s)
            continue
        grew = False
        k = 0
        while k < len(form.inputs):
            v = form.inputs[k]
            producer = forms.get(v.name)
            if (
                producer is None
                or count.get(v.name, 0) != 1
                or v.name in pinned
                or len(producer.ops) + len(form.ops) > MAX_FUSED_OPS  # 400 chained ReLUs: several kernels
                or not _mergeable(form, k, producer)
                or not costs_no_memory(producer.inputs, v, position, last, held)
            ):
                k += 1
                continue
            form = inline_input(form, k, producer, fresh)
            merged.add(v.name)
            grew = True
            k = 0
        forms[s.out.name] = form
        if grew:
            body = fold(form.body)  # the composed expression's constants (2 * 1 / 288) fold at once
            s = s.replace(op="fused", inputs=form.inputs, attrs=make_attrs(out=form.out, body=body, ops=form.ops))
        out_stmts.append(s)
    if not merged:
        return g
    return g.replace(stmts=tuple(s for s in out_stmts if s.out.name not in merged))


def _mergeable(form: IndexForm, k: int, producer: IndexForm) -> bool:
    """A producer with a reduction merges only into a reader that reads it once, at its own element (the reduction
    is computed once per element either way)."""
    if not has_reduce(producer.body):
        return True
    rs = [r for r in reads(form.body) if r.input == k]
    same_size = tuple(n for _, n in producer.out) == tuple(n for _, n in form.out)
    return len(rs) == 1 and rs[0].index == own_index(form.out) and same_size


def inline_input(form: IndexForm, k: int, producer: IndexForm, fresh: list[int]) -> IndexForm:
    """`form` with its input k replaced by the expression `producer` computes it; the producer's own inputs join
    the form's (`fresh` numbers the renamed index variables, one more per call)."""
    p_out, p_body, p_inputs = producer.out, producer.body, producer.inputs
    body, inputs = form.body, form.inputs
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

    return IndexForm(form.out, go(body), tuple(new_inputs), producer.ops + form.ops)


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
    """Every element-wise statement that alone reads a library kernel's result (of its type) becomes that kernel's
    epilogue, and again where the kernel has one already (a convolution's backward-data with the residual add, then
    the ReLU mask of the layer before: one epilogue of both), until none is left."""
    while True:
        g2 = _fuse_epilogues_once(g)
        if g2 is g:
            return g
        g = g2


def _fuse_epilogues_once(g: Graph) -> Graph:
    count = uses(g)
    pinned = returned(g)
    last, held = last_reads(g.stmts), persistent(g)
    position = {s.out.name: i for i, s in enumerate(g.stmts)}
    made = {**{name: -1 for name in held}, **position}
    defs = {s.out.name: s for s in g.stmts}
    replace: dict[str, Stmt] = {}  # reader's result -> the host statement with its epilogue
    absorbed: set[str] = set()
    early: dict[str, Stmt] = {}  # host's result -> the host with its epilogue, computed where the host stood
    updates = {v.name for _, v in g.updates}
    for s in g.stmts:
        form = composable_form(s)
        # an update stays element-wise: the plan writes it straight over its parameter or optimizer state, which
        # a product with an epilogue could not do (the epilogue reads the old value after the product is written)
        if form is None or s.out.name in updates:
            continue
        body, inputs = form.body, form.inputs
        for k, v in enumerate(inputs):
            host = defs.get(v.name)
            if (host is None or not REGISTRY[host.op].accepts_epilogue or count.get(v.name) != 1
                    or v.name in pinned or host.out.type != s.out.type or host.out.name in absorbed):  # fmt: skip
                continue
            if not form.reads_pointwise({k}):
                continue
            extras = [x for j, x in enumerate(inputs) if j != k]
            # where the host stands when every other input of the reader is computed by then (the reader's result
            # takes the place of the host's, of its type: nothing lives longer); else where the reader stands when
            # the host's inputs kept alive until then weigh no more than the host's result
            at_host = all(made.get(x.name, len(g.stmts)) < position[host.out.name] for x in extras)
            if not at_host and not costs_no_memory(host.inputs, host.out, position[s.out.name], last, held):
                continue
            mapping = {k: 0, **{j: (i + 1) for i, j in enumerate(j for j in range(len(inputs)) if j != k)}}
            epilogue = renumber(body, mapping)
            primary = host.inputs
            if "epilogue" in host.a:  # the reader reads the host's epilogue: the host's result goes through both
                arity = REGISTRY[host.op].arity
                assert arity is not None, f"{host.op} takes an epilogue, so it has a fixed arity"
                primary, own = host.inputs[:arity], host.inputs[arity:]
                before = renumber(host.a["epilogue"], {0: 0, **{j + 1: len(extras) + j + 1 for j in range(len(own))}})
                epilogue = _compose(epilogue, before)
                extras = [*extras, *own]
            attrs = tuple((key, val) for key, val in host.attrs if key != "epilogue") + (("epilogue", epilogue),)
            fused = host.replace(out=s.out, inputs=(*primary, *extras), attrs=attrs)
            if at_host:
                early[host.out.name] = fused
            else:
                replace[s.out.name] = fused
            absorbed.add(host.out.name)
            break
    if not replace and not early:
        return g
    moved = {x.out.name for x in early.values()}
    stmts = [early.get(s.out.name) or replace.get(s.out.name, s) for s in g.stmts
             if s.out.name not in moved and (s.out.name not in absorbed or s.out.name in early)]  # fmt: skip
    return g.replace(stmts=tuple(stmts))


def _compose(outer: IE, inner: IE) -> IE:
    """`outer` with its Read(0) (the kernel's result) replaced by `inner`, an element-wise expression of it."""

    def go(e: IE) -> IE:
        if isinstance(e, Read):
            return inner if e.input == 0 else e
        if isinstance(e, Apply):
            return Apply(e.fn, tuple(go(a) for a in e.args))
        if isinstance(e, Reduce):
            return Reduce(e.kind, e.vars, go(e.body))
        return e

    return go(outer)
