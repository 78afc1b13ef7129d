"""Kernels of several statements in a memory plan: the rule of ir/groups.py, and the plan's memory allowing it.

A statement only joins the loop of the group before it when its result's memory is disjoint from, or the very
same as, the memory every earlier member reads: a region shared in part with a member's (dead) input would be
overwritten by one thread while another still reads it.
"""

from __future__ import annotations

from deepdsl.ir.analysis import reads_pointwise
from deepdsl.ir.graph import Stmt
from deepdsl.ir.groups import can_join, kernel_groups
from deepdsl.memory.plan import Plan

Region = tuple[str, int, int]  # ("arena", offset, bytes), or ("tensor:NAME", 0, 0) for storage outside the arena


def planned_groups(plan: Plan) -> list[tuple[Stmt, ...]]:
    """The plan's statements cut into kernels, in order (ir/groups.py `kernel_groups`, with `can_join_in`)."""
    return kernel_groups(plan.graph.stmts, lambda group, s: can_join_in(plan, group, s))


def can_join_in(plan: Plan, group: list[Stmt], s: Stmt) -> bool:
    """Whether `s` can run in the loop of `group` (the statements just before it) with the plan's memory."""
    if not can_join(group, s):
        return False
    where = region(plan, s.out.name)
    shape = s.out.type.shape
    # the same memory is safe only where the member reads it element for element (memory/check.py `hazards` asks
    # the same): a tensor function's statement (`indexed`) is never taken to, so its input's memory is not shared
    return all(apart_or_same(where, region(plan, v.name), v.type.shape == shape and reads_pointwise(m, v.name))
               for m in group for v in m.inputs)  # fmt: skip


def region(plan: Plan, name: str) -> Region:
    """Where a value's elements live: ("arena", offset, bytes), or ("tensor:NAME", 0, 0) outside the arena."""
    base = plan.in_state.get(name, name)
    try:
        b = plan.buffer_of(base)
    except KeyError:
        return ("tensor:" + base, 0, 0)
    return ("arena", b.offset, b.nbytes)


def apart_or_same(a: Region, b: Region, elementwise: bool) -> bool:
    """Whether writing region `a` element by element is safe while region `b` is read: they are apart, or the
    same memory read element for element (`elementwise`: at the writer's own index). A scalar or broadcast read
    of the same memory is not safe: one thread would overwrite what the others still read."""
    if a[0] != b[0]:
        return True
    if a[0] != "arena":
        return a != b or elementwise  # a tensor's own storage: another tensor, or the same one element for element
    return (a == b and elementwise) or a[1] + a[2] <= b[1] or b[1] + b[2] <= a[1]
