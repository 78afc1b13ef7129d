"""Code motion: hoist loop-invariant work out of the step, then sink every statement to just before its first
use, so values live for less time.

Hoisting: a statement that reads nothing (`fill`: the loss gradient's seed, constants) computes the same tensor
in every step; it becomes a constant of the program (a `ParamDef` of kind "const", initialised once, before the
first step, and never saved), so the step no longer launches it. A statement reading only such constants would
be invariant too, but simplify has folded those already.

Sinking:
A statement only sinks when the inputs it keeps alive longer weigh no more than its own result, so the
move never raises the bytes alive at any point.

Each statement gets the key of its earliest reader minus a small step (statements that feed an output or
update keep their own position); sorting by key keeps every statement before all of its readers, so the
order stays valid. Of statements with equal keys the later one in the original order goes last.
The memory planner reorders further for peak.
"""

from __future__ import annotations

import math

from deepdsl.ir import Graph, Init, ParamDef, Value
from deepdsl.ir.analysis import last_reads, persistent, readers, returned
from deepdsl.passes.fuse import costs_no_memory
from deepdsl.passes.rewrite import rename

STEP = 1e-6
# statements that never sink: a bucket's all-reduce starts as soon as its gradients exist, to overlap the rest of
# the backward pass (passes/data_parallel.py)
STAYS = frozenset({"allreduce_start"})


def motion(g: Graph) -> Graph:
    return sink(hoist(g))


def hoist(g: Graph) -> Graph:
    """Every `fill` becomes a constant tensor of the program, initialised once."""
    consts = {s.out.name: s for s in g.stmts if s.op == "fill" and not s.inputs}
    pinned = returned(g)
    consts = {name: s for name, s in consts.items() if name not in pinned}
    if not consts:
        return g
    taken = {d.value.name for d in g.inputs} | {p.value.name for p in g.params} | {s.out.name for s in g.stmts}
    mapping: dict[str, Value] = {}
    params = list(g.params)
    for name, s in consts.items():
        new = f"const{name}"
        while new in taken:
            new += "_"
        taken.add(new)
        mapping[name] = Value(new, s.out.type)
        params.append(ParamDef(mapping[name], Init("constant", (float(s.a["value"]),)), "const", s.layer, s.span))
    stmts = [
        s.replace(inputs=tuple(mapping.get(v.name, v) for v in s.inputs)) for s in g.stmts if s.out.name not in consts
    ]
    return rename(g.replace(params=tuple(params)), stmts, mapping)


def sink(g: Graph) -> Graph:
    read_by = readers(g.stmts)
    pinned = returned(g)
    last, held = last_reads(g.stmts), persistent(g)
    key = [0.0] * len(g.stmts)
    for i in range(len(g.stmts) - 1, -1, -1):
        s = g.stmts[i]
        users = read_by.get(s.out.name, [])
        if s.out.name in pinned or not users or s.op in STAYS:
            key[i] = float(i)
            continue
        target = min(key[u] for u in users) - STEP
        sinking_is_free = costs_no_memory(s.inputs, s.out, math.ceil(target), last, held)
        key[i] = target if sinking_is_free else float(i)
    order = sorted(range(len(g.stmts)), key=lambda i: (key[i], -i))  # of two feeding one reader, the later last
    if order == list(range(len(g.stmts))):
        return g
    return g.replace(stmts=tuple(g.stmts[i] for i in order))
