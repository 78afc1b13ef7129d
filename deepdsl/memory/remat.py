"""Rematerialisation (DESIGN §5, §9 `--remat`): recompute forward values in the backward pass instead of keeping
them alive across it.

A forward value is *kept* when a statement outside the loss's forward cone (the backward pass, the update) reads
it. Levels:

- `cheap`: a kept value made by a cheap statement — element-wise, batch-norm apply, ReLU, a fused kernel without
  a reduction, a dropout mask, attention's masked softmax — is recomputed right before its first backward reader,
  when what the recomputation needs is kept anyway (or is itself recomputed cheaply, or is small). ResNet's
  `relu(bn_train_apply(conv))` then costs only the convolution output, which batch norm's gradient keeps anyway. An op
  whose fact depends on the shapes is cheap where its entry's rule says so: a batched GEMM whose output outweighs
  its operands (attention's scores q·kᵀ, from q and k that their own gradients keep), so attention keeps neither
  its scores nor its probabilities across the forward pass, and recomputes them once per block.
- `full`: also checkpoints segments (Chen et al. 2016, √n style). The forward pass is cut at its articulation
  values (the only forward value alive at that point: a residual block's output, an inception module's concat);
  about √(number of cuts) of them, spaced evenly by bytes, are kept as checkpoints, and every other kept value is
  recomputed from the checkpoint before it when the backward pass first needs it, with `cheap` applied inside.

Recomputed statements are copies with fresh names (`%15~1`, `%15~2`, ...); their inputs resolve to recomputed
copies where those exist. The result is an ordinary graph: the planner schedules and places it like any other.
"""

from __future__ import annotations

import math

from deepdsl.ir import REGISTRY, Graph, Stmt, Value
from deepdsl.ir.analysis import has_reduce, last_reads, persistent, returned
from deepdsl.passes.inplace import inplace

LEVELS = ("none", "cheap", "full")
SMALL = 64 * 1024  # bytes: a value this small stays alive rather than pull a recomputation after it


def is_cheap(s: Stmt) -> bool:
    """Worth recomputing: its op's `cheap_to_recompute` fact (for this statement's shapes, where the fact depends
    on them); a fused statement when its body does not reduce."""
    if s.op == "fused":  # what a fused statement costs depends on its body
        return not has_reduce(s.a["body"])
    fact = REGISTRY[s.op].cheap_to_recompute
    if "epilogue" in s.a:
        return False
    return fact(tuple(v.type for v in s.inputs), s.a) if callable(fact) else fact


def per_reader(s: Stmt) -> bool:
    """Cheap enough to recompute afresh for each backward reader (about one pass over its output); a value
    whose op is cheap only for some shapes (a GEMM) is recomputed once and shared by its readers."""
    return is_cheap(s) and (s.op == "fused" or not callable(REGISTRY[s.op].cheap_to_recompute))


def rematerialise(g: Graph, level: str, small: int = SMALL) -> Graph:
    """`g` with kept forward values recomputed where the backward pass reads them (see the module docstring);
    values of at most `small` bytes are kept."""
    if level == "none":
        return g
    if level not in LEVELS:
        raise ValueError(f"unknown rematerialisation level {level!r}; expected one of {', '.join(LEVELS)}")
    loss = dict(g.outputs).get("loss")
    if loss is None:
        return g
    t = _Training(g, small)
    if level == "cheap":
        return t.recompute(set())
    # the planned peak is not monotone in the number of segments: try √n and 2√n, keep the lower
    from deepdsl.memory.plan import plan

    return min((t.recompute(t.checkpoints(k)) for k in (1, 2)), key=lambda r: plan(r).arena_bytes)


class _Training:
    """What rematerialisation needs to know about a training program."""

    def __init__(self, g: Graph, small: int):
        self.g, self.small = g, small
        self.producer = {s.out.name: s for s in g.stmts}
        self.forward = _cone(g, g.output("loss").name, self.producer)
        self.persistent = persistent(g)
        self.kept = {v.name for s in g.stmts if s.out.name not in self.forward for v in s.inputs}
        self.kept |= returned(g)
        self.kept &= self.forward

    def free(self, name: str) -> bool:
        """Costs nothing to keep alive longer: persistent or small."""
        return name in self.persistent or self.producer[name].out.type.nbytes <= self.small

    def recompute(self, checkpoints: set[str] | None) -> Graph:
        """With `checkpoints` (`full`), every big forward value but those; else (`cheap`) the cheap ones."""
        chosen: set[str] = set()
        outputs = {v.name for _, v in self.g.outputs}
        for s in self.g.stmts:  # forward order: a value's inputs are decided before it
            name = s.out.name
            if name not in self.forward or name in outputs or self.free(name):
                continue
            if checkpoints:
                if name not in checkpoints:
                    chosen.add(name)
            elif is_cheap(s) and all(self.free(v.name) or v.name in chosen or v.name in self.kept for v in s.inputs):
                chosen.add(name)
        if not chosen:
            return self.g
        return inplace(_strip_inplace(_rewrite(self.g, self.forward, chosen, self.producer)))

    def checkpoints(self, scale: int) -> set[str]:
        """About scale·√n of the n articulation values of the forward pass (the only big forward value alive
        there), spaced evenly by the kept bytes between them."""
        order = [s for s in self.g.stmts if s.out.name in self.forward]
        last = last_reads(order)
        cuts: list[int] = []
        alive: set[str] = set()
        for i, s in enumerate(order):
            alive = {v for v in (*alive, s.out.name) if last.get(v, -1) > i}
            big = [v for v in alive if not self.free(v)]
            if big == [s.out.name] and s.out.name in self.kept:
                cuts.append(i)
        kept_bytes = [s.out.type.nbytes if s.out.name in self.kept else 0 for s in order]
        segments = max(1, round(scale * math.sqrt(len(cuts))))
        step = sum(kept_bytes) / segments
        chosen: set[str] = set()
        acc, position = 0, 0
        for i in cuts:
            acc += sum(kept_bytes[position : i + 1])
            position = i + 1
            if acc >= step:
                chosen.add(order[i].out.name)
                acc = 0
        return chosen or {order[i].out.name for i in cuts}


def _cone(g: Graph, root: str, producer: dict[str, Stmt]) -> set[str]:
    """Every statement result `root` depends on, itself included."""
    seen: set[str] = set()
    todo = [root]
    while todo:
        name = todo.pop()
        if name in seen or name not in producer:
            continue
        seen.add(name)
        todo.extend(v.name for v in producer[name].inputs)
    return seen


def _rewrite(g: Graph, forward: set[str], recompute: set[str], producer: dict[str, Stmt]) -> Graph:
    """Readers outside the forward pass read fresh copies of `recompute` values, made just before them.

    A copy of an expensive value (a convolution's, in `full`) is made once, at its first reader, and shared by
    later ones; a cheap value is copied afresh for each reader, so that it lives for one statement instead of
    from its first reader to its last.
    """
    shared: dict[str, Value] = {}
    count: dict[str, int] = {}
    out: list[Stmt] = []

    def copy(name: str, local: dict[str, Value]) -> Value:
        s = producer[name]
        memo = local if per_reader(s) else shared
        if name not in memo:
            inputs = tuple(copy(v.name, local) if v.name in recompute else v for v in s.inputs)
            count[name] = count.get(name, 0) + 1
            value = Value(f"{name}~{count[name]}", s.out.type)
            out.append(s.replace(out=value, inputs=inputs))
            memo[name] = value
        return memo[name]

    for s in g.stmts:
        if s.out.name in forward or not any(v.name in recompute for v in s.inputs):
            out.append(s)
            continue
        local: dict[str, Value] = {}
        inputs = tuple(copy(v.name, local) if v.name in recompute else v for v in s.inputs)
        out.append(s.replace(inputs=inputs))
    return g.replace(stmts=tuple(out))


def _strip_inplace(g: Graph) -> Graph:
    """In-place marks were made for the old lifetimes; the caller re-derives them."""
    stmts = tuple(
        s.replace(attrs=tuple((a, v) for a, v in s.attrs if a != "inplace")) if "inplace" in s.a else s for s in g.stmts
    )
    return g.replace(stmts=stmts)
