"""Data parallelism in the static plan: gradient buckets, their sum all-reduces, and the model state combined.

`data_parallel(g, bucketing)` is a pure Graph -> Graph pass over the training program as `train_program` made it
(the first pass of the pipeline, so every optimiser statement is still its own statement after the whole
backward pass). It

- finds the gradients: the data-dependent tensors the optimiser statements (the updates, and gradient
  clipping's norm) read that the backward pass made, in the order the backward pass produces them;
- cuts them into buckets in that order (the first one small, `first_bytes`, so that communication starts early;
  the others up to `bucket_bytes`, as PyTorch DDP does), never splitting a gradient;
- puts `allreduce_start(scale, g...)` right after the statement producing a bucket's last gradient, and the
  `allreduce_wait`s, in bucket order, right before the first optimiser statement: each bucket's reduction
  overlaps the backward work that follows its start; the optimiser then reads `bucket_slice` views of the
  reduced buckets;
- adds a last bucket of kind "state": the loss, its named terms and every data-dependent state update (batch-norm
  running statistics, updated from the rank's own batch statistics): the program's `loss` is then the mean over
  ranks and micro-batches and the running statistics the mean of the per-rank ones;
- with `Bucketing.sync_batch_norm` (synchronised batch norm, PyTorch's SyncBatchNorm): each training batch norm's
  statistics are the global batch's, summed over the ranks by small blocking all-reduces (sync_batch_norm.py). The
  scale and shift's gradients are then global already and go in no gradient bucket; the running statistics are
  equal on every rank (`rank_invariant`) and go in no state bucket;
- gives the program the input `dp/scale` (kind "scale", 1/(ranks x micro-batches), fed at run time: every bucket
  is packed times it, and the all-reduce sums: never an average, so that two ranks equal two micro-batches bit
  for bit), and, where the network draws random numbers per sample (dropout, sampling), the input `dp/offset`
  (kind "offset": the shard's first position in the step's global batch), from which the `*_at` draws start.

`post_statements(g)` names the statements that run once per step after the reductions (the optimiser's); the
others run once per micro-batch. docs/architecture.md "Data parallelism" and docs/distributed.md describe it.
"""

from __future__ import annotations

from dataclasses import dataclass

from deepdsl.ir import REGISTRY, Graph, InputDef, Stmt, Value
from deepdsl.ir.graph import make_attrs
from deepdsl.ir.types import DType, TensorType
from deepdsl.ops.collective import AT_OPS, STATS, Bucket, closure, data_dependent
from deepdsl.ops.optim import OPTIMISER_OPS
from deepdsl.passes.sync_batch_norm import rank_invariant, sync_batch_norm

SCALE = "dp/scale"
OFFSET = "dp/offset"
MIB = 2**20


@dataclass(frozen=True)
class Bucketing:
    """Bucket sizes in bytes: the first bucket closes at `first_bytes`, the others at `bucket_bytes`."""

    bucket_bytes: int = 25 * MIB
    first_bytes: int = 1 * MIB
    # synchronised batch norm: every training batch norm normalises with the global batch's statistics
    sync_batch_norm: bool = False


def _optimiser_seeds(g: Graph) -> set[int]:
    """The statements that begin the optimiser's work: every update rule, and gradient clipping's norm (the
    sum_squares statements added up into a clip_scale)."""
    seeds = {i for i, s in enumerate(g.stmts) if s.op in OPTIMISER_OPS or s.op == "clip_scale"}
    made = {s.out.name: i for i, s in enumerate(g.stmts)}
    todo = [i for i in seeds if g.stmts[i].op == "clip_scale"]
    while todo:
        s = g.stmts[todo.pop()]
        for v in s.inputs:
            j = made.get(v.name)
            if j is not None and g.stmts[j].op in ("add", "sum_squares") and j not in seeds:
                seeds.add(j)
                if g.stmts[j].op == "add":
                    todo.append(j)
    return seeds


def gradient_buckets(g: Graph, bucketing: Bucketing) -> tuple[list[Bucket], set[int]]:
    """The gradient buckets of a training program (before the pass) and its optimiser statements."""
    post = closure(g, _optimiser_seeds(g))
    varying = data_dependent(g)
    made = {s.out.name: i for i, s in enumerate(g.stmts)}
    post_names = {g.stmts[i].out.name for i in post}
    equal = rank_invariant(g)
    found: dict[str, Value] = {}
    for i in sorted(post):
        for v in g.stmts[i].inputs:
            if (v.name in varying and v.name not in post_names and v.name in made and v.name not in equal
                    and v.type.dtype == DType.F32):  # fmt: skip
                found.setdefault(v.name, v)
    reader: dict[str, str] = {}  # the parameter each gradient belongs to: what its first optimiser statement updates
    updated = {v.name: name for name, v in g.updates}
    trained = {p.value.name for p in g.params if p.kind == "param"}
    readers: dict[str, list[Stmt]] = {}
    for s in g.stmts:
        for v in s.inputs:
            readers.setdefault(v.name, []).append(s)
    for i in sorted(post):
        s = g.stmts[i]
        target = _updated_param(s, updated, readers, trained)
        for v in s.inputs:
            if v.name in found:
                reader.setdefault(v.name, target or f"%{v.name}")
    ordered = sorted(found.values(), key=lambda v: made[v.name])
    buckets: list[Bucket] = []
    current: list[Value] = []
    size = 0
    for v in ordered:
        cap = bucketing.first_bytes if not buckets else bucketing.bucket_bytes
        if current and size + v.type.nbytes > cap:
            buckets.append(Bucket(len(buckets), "grad", tuple(current), tuple(reader[x.name] for x in current)))
            current, size = [], 0
        current.append(v)
        size += v.type.nbytes
    if current:
        buckets.append(Bucket(len(buckets), "grad", tuple(current), tuple(reader[x.name] for x in current)))
    return buckets, post


def _updated_param(s: Stmt, updated: dict[str, str], readers: dict[str, list[Stmt]], trained: set[str]) -> str:
    """The parameter that statement `s` (an optimiser statement) helps update: the trained parameter of the
    first update found from it along its readers, else the first update's name."""
    seen, todo, first = set(), [s], ""
    while todo:
        t = todo.pop(0)
        if t.out.name in updated:
            if updated[t.out.name] in trained:
                return updated[t.out.name]
            first = first or updated[t.out.name]
        for r in readers.get(t.out.name, ()):
            if r.out.name not in seen:
                seen.add(r.out.name)
                todo.append(r)
    return first


def data_parallel(g: Graph, bucketing: Bucketing | None = None) -> Graph:
    """The data-parallel training program of `g` (see the module); `g` unchanged where `bucketing` is None or `g`
    has no update (an inference program)."""
    if bucketing is None or not g.updates or any(d.kind == "scale" for d in g.inputs):
        return g
    scale = Value(SCALE, TensorType(()))
    if bucketing.sync_batch_norm:
        g = sync_batch_norm(g, scale)
    buckets, post = gradient_buckets(g, bucketing)
    varying = data_dependent(g)
    equal = rank_invariant(g)
    inputs = (*g.inputs, InputDef(scale, "scale"))
    random = [s for s in g.stmts if s.op in AT_OPS and s.out.type.rank > 0]
    offset = Value(OFFSET, TensorType((), DType.I64))
    if random:
        inputs = (*inputs, InputDef(offset, "offset"))
    taken = {d.value.name for d in inputs} | {p.value.name for p in g.params} | {s.out.name for s in g.stmts}
    counter = 0

    def fresh(t: TensorType) -> Value:
        nonlocal counter
        while True:
            counter += 1
            name = f"dp{counter}"
            if name not in taken:
                taken.add(name)
                return Value(name, t)

    def emit(op: str, ins: tuple[Value, ...], layer: str = "", **attrs: object) -> Stmt:
        t = REGISTRY[op].shape(tuple(v.type for v in ins), attrs)
        return Stmt(fresh(t), op, ins, make_attrs(**attrs), None, layer)

    # the state bucket: the loss, its terms and the data-dependent state updates, in the order they are made
    kinds = {p.value.name: p.kind for p in g.params}
    made = {s.out.name: i for i, s in enumerate(g.stmts)}
    state_slots: list[tuple[str, Value]] = [(n, v) for n, v in g.outputs if n == "loss" or n.startswith("loss:")]
    state_slots += [(n, v) for n, v in g.updates if kinds.get(n) == "state"]
    state_slots = [(n, v) for n, v in state_slots if v.name in varying and v.name in made and v.name not in equal]
    state_slots.sort(key=lambda nv: made[nv[1].name])
    # a value named twice (the loss and its only term) takes one slot, under its first name
    state_values = tuple(dict.fromkeys(v for _, v in state_slots))
    state_names = {n: v for n, v in state_slots}
    state = Bucket(len(buckets), "state", state_values,
                   tuple(next(n for n, w in state_slots if w == v) for v in state_values))  # fmt: skip

    every = [*buckets, state] if state.values else buckets
    last_of = {b.index: max(made[v.name] for v in b.values) for b in every}
    starts: dict[int, Stmt] = {}
    slices: dict[str, Value] = {}  # original value -> its reduced slice

    def start(b: Bucket) -> Stmt:
        sizes = tuple(v.type.numel for v in b.values)
        s = emit("allreduce_start", (scale, *b.values), bucket=b.index, kind=b.kind, names=b.names, sizes=sizes)
        starts[b.index] = s
        return s

    def wait(b: Bucket) -> list[Stmt]:
        w = emit("allreduce_wait", (starts[b.index].out,), bucket=b.index, kind=b.kind)
        out = [w]
        offset_ = 0
        for v, name in zip(b.values, b.names):
            sl = emit("bucket_slice", (w.out,), offset=offset_, shape=v.type.shape, name=name)
            slices[v.name] = sl.out
            out.append(sl)
            offset_ += v.type.numel
        return out

    after: dict[int, list[Bucket]] = {}
    for b in every:
        after.setdefault(last_of[b.index], []).append(b)
    first_post = min(post, default=len(g.stmts))
    waited: set[int] = set()
    stmts: list[Stmt] = []
    for i, s in enumerate(g.stmts):
        if i in post:
            if i == first_post:
                for b in buckets:
                    if b.index in starts:
                        stmts += wait(b)
                        waited.add(b.index)
            for b in buckets:  # a gradient made after the first optimiser statement (not in train_program's order)
                if b.index not in waited and any(v.name in {x.name for x in b.values} for v in s.inputs):
                    stmts += wait(b)
                    waited.add(b.index)
            s = s.replace(inputs=tuple(slices.get(v.name, v) for v in s.inputs))
        elif s.op in AT_OPS and s.out.type.rank > 0:
            s = s.replace(op=AT_OPS[s.op], inputs=(*s.inputs, offset))
        stmts.append(s)
        for b in after.get(i, ()):
            stmts.append(start(b))
    if state.values:
        stmts += wait(state)
    outputs = tuple((n, slices.get(v.name, v) if n in state_names else v) for n, v in g.outputs)
    updates = tuple((n, slices.get(v.name, v) if n in state_names else v) for n, v in g.updates)
    # the statistics' all-reduces are numbered after the gradient and state buckets (whose numbers the setting
    # leaves as they were)
    first = len(every)
    stmts = [
        s.replace(attrs=make_attrs(**{**s.a, "bucket": first + s.a["bucket"]}))
        if s.op in ("allreduce_start", "allreduce_wait") and s.a["kind"] == STATS else s
        for s in stmts
    ]  # fmt: skip
    return g.replace(inputs=inputs, stmts=tuple(stmts), outputs=outputs, updates=updates)
