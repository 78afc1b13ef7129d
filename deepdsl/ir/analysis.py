"""The analyses of statements and programs that the passes, the memory planner and the backends share, each written
once: a statement as an index form, whether an expression reduces, whether a statement reads an input point-wise,
who reads a value how often and last, and which label a network's loss classifies.

An index form writes a statement as one scalar expression over its output's indices i0, i1, ... (`out_vars`):
`out[i0, i1, ...] = body`, where `Read(k, index)` reads input k. Fused and `indexed` statements carry theirs as
attributes; an op with a registry `index_form` (the element-wise ops, broadcasts, simple reductions, optimizer
updates) computes its from its types and attributes. A library op (a convolution, a GEMM), a view and a statement
with an epilogue have none.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

from deepdsl.ir.graph import Graph, Stmt, Value
from deepdsl.ir.indexexpr import IE, Affine, Apply, Reduce, reads
from deepdsl.ir.registry import REGISTRY
from deepdsl.ir.types import TensorType

Out = tuple[tuple[str, int], ...]  # an index form's output: (index variable, size) per axis


def out_vars(t: TensorType) -> tuple[str, ...]:
    """The index variables of a tensor of type `t` in an index form: i0, i1, ... one per axis."""
    return tuple(f"i{k}" for k in range(t.rank))


def output_indices(t: TensorType) -> Out:
    """The output of an index form writing a tensor of type `t`: each axis's variable with its size."""
    return tuple(zip(out_vars(t), t.shape))


def own_index(out: Out) -> tuple[Affine, ...]:
    """The index of the element being computed: a read at it is element for element."""
    return tuple(Affine.var(v) for v, _ in out)


@dataclass(frozen=True)
class IndexForm:
    """A statement as an index expression: out[own index] = body, where Read(k) reads inputs[k]; `ops` names the
    ops composed into it (one for a statement of its own, several once fusion has merged a chain)."""

    out: Out
    body: IE
    inputs: tuple[Value, ...]
    ops: tuple[str, ...]

    def reads_pointwise(self, ks: Collection[int]) -> bool:
        """Whether the inputs `ks` are read at most element for element: no reduction, and every read of them at the
        output's own index, so that each output element needs only the same element of theirs."""
        if has_reduce(self.body):
            return False
        identity = own_index(self.out)
        return all(r.index == identity for r in reads(self.body) if r.input in ks)


def index_form(s: Stmt) -> IndexForm | None:
    """`s` as an index form, when it has one (see the module docstring); what a backend writes as a loop."""
    op = REGISTRY[s.op]
    if op.view or "epilogue" in s.a:
        return None
    if s.op in ("fused", "indexed"):
        ops = tuple(s.a["ops"]) if s.op == "fused" else (s.op,)
        return IndexForm(s.a["out"], s.a["body"], s.inputs, ops)
    if op.index_form is None:
        return None
    body = op.index_form(tuple(v.type for v in s.inputs), s.out.type, s.a)
    return IndexForm(output_indices(s.out.type), body, s.inputs, (s.op,))


def composable_form(s: Stmt) -> IndexForm | None:
    """The index form of `s` when the optimiser may compose it with others, run it in place or write it over what it
    reads: every index form but a tensor function's (`indexed`), which stays the kernel its function wrote."""
    return None if s.op == "indexed" else index_form(s)


def top_reductions(e: IE) -> list[Reduce]:
    """The reductions of `e` that no other reduction of it holds, left to right."""
    if isinstance(e, Reduce):
        return [e]
    if isinstance(e, Apply):
        return [r for a in e.args for r in top_reductions(a)]
    return []


def has_reduce(e: IE) -> bool:
    """Whether `e` reduces (sums or maximises) anywhere: then an output element needs many input elements."""
    if isinstance(e, Reduce):
        return True
    return isinstance(e, Apply) and any(has_reduce(a) for a in e.args)


def reads_pointwise(s: Stmt, name: str) -> bool:
    """Whether `s` reads the value `name` at most element for element (each output element from the same element of
    it), so that writing its result over `name` as it goes is safe. True when `s` does not read `name`."""
    if all(v.name != name for v in s.inputs):
        return True
    form = composable_form(s)
    return form is not None and form.reads_pointwise({k for k, v in enumerate(form.inputs) if v.name == name})


def returned(g: Graph) -> set[str]:
    """The values the program hands back: its outputs and updates (alive to its end, never rewritten away)."""
    return {v.name for _, v in (*g.outputs, *g.updates)}


def persistent(g: Graph) -> set[str]:
    """The values held in their own storage for the whole program, never freed: its inputs and parameters."""
    return {d.value.name for d in g.inputs} | {p.value.name for p in g.params}


def uses(g: Graph) -> dict[str, int]:
    """How many times each value is read (by statements, each input position once, and by outputs and updates)."""
    count: dict[str, int] = {}
    for s in g.stmts:
        for v in s.inputs:
            count[v.name] = count.get(v.name, 0) + 1
    for _, v in (*g.outputs, *g.updates):
        count[v.name] = count.get(v.name, 0) + 1
    return count


def readers(stmts: Iterable[Stmt]) -> dict[str, list[int]]:
    """The positions of the statements that read each value, in order, each reader once."""
    found: dict[str, list[int]] = {}
    for i, s in enumerate(stmts):
        for name in dict.fromkeys(v.name for v in s.inputs):
            found.setdefault(name, []).append(i)
    return found


def last_reads(stmts: Iterable[Stmt]) -> dict[str, int]:
    """The position of the last statement that reads each value (values no statement reads are absent)."""
    return {v.name: i for i, s in enumerate(stmts) for v in s.inputs}


def last_uses(g: Graph) -> dict[str, int]:
    """Where each value is used for the last time: its last reader, or len(g.stmts), past the last statement, for a
    value the program returns."""
    last = last_reads(g.stmts)
    for name in returned(g):
        last[name] = len(g.stmts)
    return last


def classified_label(g: Graph) -> str | None:
    """The label whose accuracy the test phase reports: the one a classifying loss op (`classifies`) that the loss
    depends on reads, where `predict` is the [N, K] scores of its K classes; None otherwise (an autoencoder or a
    regression reports the test loss only)."""
    outputs = dict(g.outputs)
    if "predict" not in outputs:
        return None
    labels = {d.value.name: d for d in g.inputs if d.kind == "label"}
    needed = _loss_reads(g)
    predict = outputs["predict"].type
    for st in g.stmts:
        if REGISTRY[st.op].classifies and st.out.name in needed and st.inputs[1].name in labels:
            label = labels[st.inputs[1].name]
            if predict.rank == 2 and predict.shape[1] == label.classes and label.value.type.rank == 1:
                return label.value.name
    return None


def _loss_reads(g: Graph) -> set[str]:
    """The names of the values the loss depends on (itself included)."""
    needed = {dict(g.outputs)["loss"].name}
    for st in reversed(g.stmts):
        if st.out.name in needed:
            needed.update(v.name for v in st.inputs)
    return needed


def _compares(st: Stmt) -> bool:
    """Whether `st` is a loss that compares a prediction with a target of its shape: `mse`, or a scalar tensor
    function (`l1`, `huber` and a custom loss are `indexed` statements reduced to a scalar)."""
    return st.op == "mse" or (st.op == "indexed" and st.out.type.rank == 0)


def regression_target(g: Graph) -> str | None:
    """The float `input` that a regression loss (`_compares`) the loss depends on reads directly, where `predict`
    has that input's shape (`loss = mse(net(x), t)` or `l1(net(x), t)` with `predict = net(x)`: t); None otherwise.
    The test phase reports the mean absolute error of `predict` against it."""
    outputs = dict(g.outputs)
    if "predict" not in outputs or "loss" not in outputs:
        return None
    targets = {d.value.name: d for d in g.inputs if d.kind == "input" and d.classes is None}
    needed = _loss_reads(g)
    predict = outputs["predict"].type
    for st in g.stmts:
        if _compares(st) and st.out.name in needed:
            for v in reversed(st.inputs):  # the target is the second argument, by convention
                d = targets.get(v.name)
                if d is not None and d.value.type.shape == predict.shape and d.value.type.dtype == predict.dtype:
                    return d.value.name
    return None
