"""The plan's memory in the grouping of element-wise statements (memory/groups.py)."""

from __future__ import annotations

import deepdsl.ops  # noqa: F401 — fills the registry
from deepdsl.ir import GraphBuilder, InputDef, TensorType, Value
from deepdsl.ir.groups import kernel_groups
from deepdsl.memory import plan
from deepdsl.memory.groups import apart_or_same, planned_groups
from deepdsl.passes.fuse import share_loops


def test_regions_that_overlap_in_part_or_are_read_by_broadcast_are_not_safe() -> None:
    a = ("arena", 0, 512)
    assert apart_or_same(a, ("arena", 512, 256), False)  # apart
    assert apart_or_same(a, a, True)  # the very same memory, element for element
    assert not apart_or_same(a, a, False)  # the same memory read as a scalar or broadcast
    assert not apart_or_same(a, ("arena", 256, 512), True)  # in part
    assert apart_or_same(("tensor:w", 0, 0), ("tensor:v", 0, 0), False)
    assert apart_or_same(("tensor:w", 0, 0), a, False)
    assert not apart_or_same(("tensor:w", 0, 0), ("tensor:w", 0, 0), False)


def test_a_loop_that_would_overwrite_a_scalar_its_threads_still_read_is_split_in_the_plan() -> None:
    """a = x * sum(x) and c = -a may share a loop by the rule alone; the plan puts c where sum(x) was (it dies
    at a), so with the plan's memory they are two kernels."""
    b = GraphBuilder("T")
    x = b.add_input(InputDef(Value("x", TensorType((64,))), "input"))
    a = b.emit("scale_by", x, b.emit("sum", x))
    b.output("a", a)
    b.output("loss", b.emit("neg", a))
    p = plan(share_loops(b.build()))
    alone = [tuple(s.op for s in g) for g in kernel_groups(p.graph.stmts)]
    assert ("scale_by", "neg") in alone
    total = next(s for s in p.graph.stmts if s.op == "sum")
    neg = next(s for s in p.graph.stmts if s.op == "neg")
    assert p.buffer_of(total.out.name).offset == p.buffer_of(neg.out.name).offset
    assert [tuple(s.op for s in g) for g in planned_groups(p)] == [("sum",), ("scale_by",), ("neg",)]
