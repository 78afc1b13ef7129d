"""Launches of several kernels: the multi-tensor launch of the optimiser's updates.

A statement marked `multi_tensor` (passes/multi_tensor.py: every parameter's optimiser update, moved to the end of
the step) is one segment of a launch that computes them all: each element-wise group of ir/groups.py (a parameter's
momentum and step, computed in one loop) is one segment, over its own elements, and one kernel launch covers every
segment through a table of their sizes and pointers (backends/cuda/kernels.py `multi_kernel`). The statements stay
separate in the IR, each with its one result: an update is written into its parameter's or its state's storage.

Segments of one launch run at the same time, so a group only joins the launch of the groups before it when it reads
none of their results and (with a memory plan, `apart`) writes no memory they read or write.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from deepdsl.ir.graph import Stmt

Group = tuple[Stmt, ...]
Launch = tuple[Group, ...]  # the groups one launch computes (one group: an ordinary kernel)
# whether a group may run at the same time as the groups of a launch, by the memory it writes and reads
Apart = Callable[[Sequence[Group], Group], bool]


def is_member(group: Group) -> bool:
    """A group that is a segment of a multi-tensor launch: each of its statements is marked."""
    return all(s.a.get("multi_tensor") for s in group)


def independent(launch: Sequence[Group], group: Group) -> bool:
    """`group` reads no result of the launch's groups (its segments run at the same time)."""
    made = {s.out.name for g in launch for s in g}
    return not any(v.name in made for s in group for v in s.inputs)


def launch_groups(groups: Sequence[Group], apart: Apart | None = None) -> list[Launch]:
    """`groups` (ir/groups.py `kernel_groups`, in order) cut into launches: consecutive member groups that are
    independent of each other (and `apart` in memory, where a plan says where they live) share one launch; every
    other group is a launch alone."""
    out: list[list[Group]] = []
    for group in groups:
        last = out[-1] if out else None
        if (
            last is not None
            and is_member(group)
            and is_member(last[-1])
            and independent(last, group)
            and (apart is None or apart(last, group))
        ):
            last.append(group)
        else:
            out.append([group])
    return [tuple(launch) for launch in out]
