"""Launches of a memory plan: memory/groups.py's kernels, the optimiser's updates joined into one multi-tensor launch
(ir/launches.py) where the plan's memory lets their segments run at the same time."""

from __future__ import annotations

from collections.abc import Sequence

from deepdsl.ir.graph import Stmt
from deepdsl.ir.launches import Group, Launch, launch_groups
from deepdsl.ir.reductions import ReductionGroup
from deepdsl.memory.groups import apart_or_same, planned_groups, region
from deepdsl.memory.plan import Buffer, Plan


def planned_launches(plan: Plan, groups: Sequence[Group] | None = None) -> list[Launch]:
    """The plan's statements cut into launches, in order: each a tuple of groups (one group: an ordinary kernel);
    `groups`: the plan's `planned_groups`, where the caller has them already."""
    groups = planned_groups(plan) if groups is None else groups
    return launch_groups(groups, lambda launch, group: apart(plan, launch, group))


def apart(plan: Plan, launch: Sequence[Group], group: Group) -> bool:
    """`group` writes no memory that the launch's groups read or write, and reads none they write."""
    written = [region(plan, s.out.name) for g in launch for s in g]
    read = [region(plan, v.name) for g in launch for s in g for v in s.inputs]
    mine_written = [region(plan, s.out.name) for s in group]
    mine_read = [region(plan, v.name) for s in group for v in s.inputs]
    return all(apart_or_same(a, b, False) for a in mine_written for b in written + read) and all(
        apart_or_same(a, b, False) for a in written for b in mine_read
    )


def pass_scratch(plan: Plan, stmts: Sequence[Stmt], rg: ReductionGroup) -> tuple[Buffer, ...] | None:
    """The planned scratch of each sum of the reduction pass `rg` over `stmts` (ir/reductions.py), in the order of
    its sums (none for a pass one slice covers); None where the plan gave a sum no room for its partial sums across
    the whole pass (a workspace limit): the statements then run on their own. The CUDA program and the Java
    program's passes both ask here, so that they launch the same."""
    if rg.split.slices <= 1:
        return ()
    where = {s.out.name: i for i, s in enumerate(plan.graph.stmts)}
    lo, hi = where[stmts[0].out.name], where[stmts[-1].out.name]
    out = []
    for f in rg.sums:
        ws = plan.workspace.get(f.stmt.out.name)
        if ws is None or ws.nbytes < rg.split.scratch_bytes or ws.start > lo or ws.end < hi:
            return None
        out.append(ws)
    return tuple(out)
