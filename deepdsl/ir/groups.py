"""Kernels of several statements: adjacent element-wise statements that one loop computes.

A statement whose every read is its own output element (or a scalar) can run in the same loop as the
statement before it when both cover the same elements and it reads that statement's result or one of its
inputs: each element of the second is computed right after the same element of the first. The statements
stay separate in the IR (each with its one result, which may be an update or read later); the fuse pass
marks the second with `same_loop=True`, and the backends (and the kernel counts) take a marked statement
into the kernel of the one before it when the conditions still hold in the final order. This is how a
parameter's momentum and step, the two updates of one SGD step, become one kernel (and Adam's two moments
and step): neither can be fused into the other, since both results are kept.

With a memory plan, a statement only joins when its result's memory is disjoint from, or the very same as,
the memory every earlier member reads: a region shared in part with a member's (dead) input would be
overwritten by one thread while another still reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from deepdsl.ir.graph import Stmt, Value
from deepdsl.ir.indexexpr import IE, Affine, Apply, Const, Read, renumber
from deepdsl.ir.registry import REGISTRY
from deepdsl.ir.types import DType
from deepdsl.ops._index_forms import out_vars

Out = tuple[tuple[str, int], ...]


def is_flat(body: IE, out: Out, shapes: tuple[tuple[int, ...], ...]) -> bool:
    """Every read is the output's own element, or a scalar, and nothing else needs the indices."""
    own = tuple(Affine.var(v) for v, _ in out)
    out_shape = tuple(n for _, n in out)

    def plain(e: IE) -> bool:
        if isinstance(e, Read):
            return e.index == () or (e.index == own and shapes[e.input] == out_shape)
        if isinstance(e, Apply):
            return all(plain(a) for a in e.args)
        return isinstance(e, Const)

    return plain(body)


def flat_body(s: Stmt) -> IE | None:
    """The index expression of `s` when it is an element-wise kernel of its own (no epilogue, float32 result)."""
    if s.out.type.dtype is not DType.F32 or "epilogue" in s.a or REGISTRY[s.op].view:
        return None
    if s.op in ("fused", "indexed"):
        body, out = s.a["body"], s.a["out"]
    elif REGISTRY[s.op].index_form is not None:
        body = REGISTRY[s.op].index_form(tuple(v.type for v in s.inputs), s.out.type, s.a)
        out = tuple(zip(out_vars(s.out.type), s.out.type.shape))
    else:
        return None
    return body if is_flat(body, out, tuple(v.type.shape for v in s.inputs)) else None


def kernel_groups(stmts: tuple[Stmt, ...] | list[Stmt], plan: Any = None) -> list[tuple[Stmt, ...]]:
    """`stmts` cut into kernels, in order: a statement marked `same_loop` joins the kernel before it where it
    can (see above), every other statement is a kernel alone (views too, though they launch nothing)."""
    groups: list[list[Stmt]] = []
    for s in stmts:
        last = groups[-1] if groups else None
        if last is not None and s.a.get("same_loop") and can_join(last, s, plan):
            last.append(s)
        else:
            groups.append([s])
    return [tuple(g) for g in groups]


def can_join(group: list[Stmt], s: Stmt, plan: Any = None) -> bool:
    """Whether `s` can run in the loop of `group` (the statements just before it), with `plan`'s memory if given."""
    if flat_body(s) is None or any(flat_body(m) is None for m in group):
        return False
    if any(m.out.type.shape != s.out.type.shape for m in group):
        return False
    mine = {v.name for v in s.inputs}
    if not any(m.out.name in mine or mine & {v.name for v in m.inputs} for m in group):
        return False  # unrelated: neither reads a result of the group nor shares an input with it
    if plan is None:
        return True
    where = _region(plan, s.out.name)
    shape = s.out.type.shape
    return all(_apart_or_same(where, _region(plan, v.name), v.type.shape == shape) for m in group for v in m.inputs)


def _region(plan: Any, name: str) -> tuple[str, int, int]:
    """Where a value's elements live: ("arena", offset, bytes), or ("tensor", name) storage outside the arena."""
    base = plan.in_state.get(name, name)
    try:
        b = plan.buffer_of(base)
    except KeyError:
        return ("tensor:" + base, 0, 0)
    return ("arena", b.offset, b.nbytes)


def _apart_or_same(a: tuple[str, int, int], b: tuple[str, int, int], elementwise: bool) -> bool:
    """Whether writing region `a` element by element is safe while region `b` is read: they are apart, or the
    same memory read element for element (`elementwise`: at the writer's own index). A scalar or broadcast read
    of the same memory is not safe: one thread would overwrite what the others still read."""
    if a[0] != b[0]:
        return True
    if a[0] != "arena":
        return a != b or elementwise  # a tensor's own storage: another tensor, or the same one element for element
    return (a == b and elementwise) or a[1] + a[2] <= b[1] or b[1] + b[2] <= a[1]


HELD = 1000  # input numbers from here on stand for an earlier result of the group, held in a local


@dataclass(frozen=True)
class GroupForm:
    """What a backend needs to write one group as one loop."""

    inputs: tuple[Value, ...]  # the values the group reads that it does not compute, in first-read order
    bodies: tuple[IE, ...]  # statement j's expression over `inputs` (Read(k)), reading held results too
    held: tuple[dict[int, int], ...]  # statement j: input number (>= HELD) -> the earlier result m it stands for


def group_form(stmts: tuple[Stmt, ...]) -> GroupForm:
    made = {s.out.name: m for m, s in enumerate(stmts)}
    inputs: list[Value] = []
    bodies, held = [], []
    for s in stmts:
        body = flat_body(s)
        assert body is not None, f"%{s.out.name} is not element-wise"
        mapping, mine = {}, {}
        for k, v in enumerate(s.inputs):
            if v.name in made:
                mapping[k], mine[HELD + k] = HELD + k, made[v.name]
            else:
                if v not in inputs:
                    inputs.append(v)
                mapping[k] = inputs.index(v)
        bodies.append(renumber(body, mapping))
        held.append(mine)
    return GroupForm(tuple(inputs), tuple(bodies), tuple(held))
