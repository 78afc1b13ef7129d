"""Launches of a memory plan: memory/groups.py's kernels, the optimiser's updates joined into one multi-tensor launch
(ir/launches.py) where the plan's memory lets their segments run at the same time."""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Sequence

from deepdsl.ir.graph import Stmt
from deepdsl.ir.launches import Group, Launch, launch_groups
from deepdsl.ir.reductions import ReductionGroup
from deepdsl.memory.groups import Region, planned_groups, region
from deepdsl.memory.plan import Buffer, Plan


def planned_launches(plan: Plan, groups: Sequence[Group] | None = None) -> list[Launch]:
    """The plan's statements cut into launches, in order: each a tuple of groups (one group: an ordinary kernel);
    `groups`: the plan's `planned_groups`, where the caller has them already."""
    groups = planned_groups(plan) if groups is None else groups
    return launch_groups(groups, _Apart(plan))


class _Memory:
    """The memory a launch's groups write or read: tensors by name; arena bytes as sorted, disjoint half-open ranges
    (overlapping ones merged) and the offsets of empty regions. `meets` answers as `apart_or_same(r, each, False)`
    over every region added, in O(log n): ranges overlap when each starts before the other ends, and an empty region
    meets a range that holds its offset strictly inside (so ranges that only touch are not merged)."""

    def __init__(self) -> None:
        self.tensors: set[str] = set()
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.points: list[int] = []

    def add(self, r: Region) -> None:
        if r[0] != "arena":
            self.tensors.add(r[0])
            return
        lo, hi = r[1], r[1] + r[2]
        if hi <= lo:
            insort(self.points, lo)
            return
        i, j = bisect_right(self.ends, lo), bisect_left(self.starts, hi)  # the ranges it overlaps
        if i < j:
            lo, hi = min(lo, self.starts[i]), max(hi, self.ends[j - 1])
        self.starts[i:j], self.ends[i:j] = [lo], [hi]

    def meets(self, r: Region) -> bool:
        """Whether `r` shares memory with these (apart_or_same(r, each, False) fails for one)."""
        if r[0] != "arena":
            return r[0] in self.tensors
        lo, hi = r[1], r[1] + r[2]
        if hi <= lo:  # empty: inside a range
            i = bisect_left(self.starts, lo) - 1
            return i >= 0 and self.ends[i] > lo
        i, k = bisect_right(self.ends, lo), bisect_right(self.points, lo)
        return (i < len(self.starts) and self.starts[i] < hi) or (k < len(self.points) and self.points[k] < hi)


class _Apart:
    """Whether a group may join a launch, as launch_groups asks it of one growing launch after another: the group
    writes no memory the launch's groups read or write, and reads none they write (memory/groups.py's
    `apart_or_same`, not element for element). The launch's memory is kept and only the groups added since the last
    question are read, so that n updates cost about n log n, not n^2
    (a 65-block transformer's 1,045 groups took 20 s of `memcheck`). The same answers as comparing every region of the
    group with every region of the launch (tests/memory/test_launches.py)."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.first: Group | None = None
        self.seen = 0
        self.written = _Memory()
        self.touched = _Memory()  # written or read

    def __call__(self, launch: Sequence[Group], group: Group) -> bool:
        if not launch or launch[0] is not self.first or len(launch) < self.seen:
            self.first, self.seen, self.written, self.touched = (launch[0] if launch else None), 0, _Memory(), _Memory()
        for g in launch[self.seen :]:
            for s in g:
                self.written.add(region(self.plan, s.out.name))
                self.touched.add(region(self.plan, s.out.name))
                for v in s.inputs:
                    self.touched.add(region(self.plan, v.name))
        self.seen = len(launch)
        mine_written = [region(self.plan, s.out.name) for s in group]
        mine_read = [region(self.plan, v.name) for s in group for v in s.inputs]
        return not any(self.touched.meets(r) for r in mine_written) and not any(
            self.written.meets(r) for r in mine_read
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
