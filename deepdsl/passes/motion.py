"""Code motion: sink every statement to just before its first use, so values live for less time.

A statement only sinks when the inputs it keeps alive longer weigh no more than its own result, so the
move never raises the bytes alive at any point.

Each statement gets the key of its earliest reader minus a small step (statements that feed an output or
update keep their own position); sorting by key keeps every statement before all of its readers, so the
order stays valid. Of statements with equal keys the later one in the original order goes last.
The memory planner reorders further for peak.
"""

from __future__ import annotations

import math

from deepdsl.ir import Graph
from deepdsl.passes.fuse import costs_no_memory, lifetimes

STEP = 1e-6


def motion(g: Graph) -> Graph:
    readers: dict[str, list[int]] = {}
    for i, s in enumerate(g.stmts):
        for v in set(s.inputs):
            readers.setdefault(v.name, []).append(i)
    pinned = {v.name for _, v in (*g.outputs, *g.updates)}
    _, last, persistent = lifetimes(g)
    key = [0.0] * len(g.stmts)
    for i in range(len(g.stmts) - 1, -1, -1):
        s = g.stmts[i]
        users = readers.get(s.out.name, [])
        if s.out.name in pinned or not users:
            key[i] = float(i)
            continue
        target = min(key[u] for u in users) - STEP
        sinking_is_free = costs_no_memory(list(s.inputs), s.out, math.ceil(target), last, persistent)
        key[i] = target if sinking_is_free else float(i)
    order = sorted(range(len(g.stmts)), key=lambda i: (key[i], -i))  # of two feeding one reader, the later last
    if order == list(range(len(g.stmts))):
        return g
    return g.replace(stmts=tuple(g.stmts[i] for i in order))
