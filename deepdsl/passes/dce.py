"""Dead-code elimination: drop statements that no output, update or later statement needs.

Legal because every op is pure: its only effect is its result (randomness is a function of the step).
"""

from __future__ import annotations

from deepdsl.ir import Graph


def dce(g: Graph) -> Graph:
    needed = {v.name for _, v in g.outputs} | {v.name for _, v in g.updates}
    keep = []
    for s in reversed(g.stmts):
        if s.out.name in needed:
            keep.append(s)
            needed.update(v.name for v in s.inputs)
    if len(keep) == len(g.stmts):
        return g
    return g.replace(stmts=tuple(reversed(keep)))
