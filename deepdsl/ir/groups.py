"""Kernels of several statements: adjacent element-wise statements that one loop computes.

A statement whose every read is its own output element (or a scalar) can run in the same loop as the
statement before it when both cover the same elements and it reads that statement's result or one of its
inputs: each element of the second is computed right after the same element of the first. The statements
stay separate in the IR (each with its one result, which may be an update or read later); the fuse pass
marks the second with `same_loop=True`, and the backends (and the kernel counts) take a marked statement
into the kernel of the one before it when the conditions still hold in the final order. This is how a
parameter's momentum and step, the two updates of one SGD step, become one kernel (and Adam's two moments
and step): neither can be fused into the other, since both results are kept.

This is the rule on the program alone; with a memory plan the members' memory must allow it too
(memory/groups.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from deepdsl.ir.analysis import Out, index_form, own_index
from deepdsl.ir.graph import Stmt, Value
from deepdsl.ir.indexexpr import IE, Apply, Const, Read, renumber
from deepdsl.ir.types import DType

Join = Callable[[list[Stmt], Stmt], bool]  # whether a statement can run in the loop of the group before it


def is_flat(body: IE, out: Out, shapes: tuple[tuple[int, ...], ...]) -> bool:
    """Every read is the output's own element, or a scalar, and nothing else needs the indices."""
    own = own_index(out)
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
    form = index_form(s) if s.out.type.dtype is DType.F32 else None
    if form is None or not is_flat(form.body, form.out, tuple(v.type.shape for v in s.inputs)):
        return None
    return form.body


def kernel_groups(stmts: tuple[Stmt, ...] | list[Stmt], join: Join | None = None) -> list[tuple[Stmt, ...]]:
    """`stmts` cut into kernels, in order: a statement marked `same_loop` joins the kernel before it where it
    can (`join`, by default `can_join`; see above), every other statement is a kernel alone (views too, though they
    launch nothing)."""
    join = join or can_join
    groups: list[list[Stmt]] = []
    for s in stmts:
        last = groups[-1] if groups else None
        if last is not None and s.a.get("same_loop") and join(last, s):
            last.append(s)
        else:
            groups.append([s])
    return [tuple(g) for g in groups]


def can_join(group: list[Stmt], s: Stmt) -> bool:
    """Whether `s` can run in the loop of `group` (the statements just before it)."""
    if flat_body(s) is None or any(flat_body(m) is None for m in group):
        return False
    if any(m.out.type.shape != s.out.type.shape for m in group):
        return False
    mine = {v.name for v in s.inputs}
    # unrelated: neither reads a result of the group nor shares an input with it
    return any(m.out.name in mine or mine & {v.name for v in m.inputs} for m in group)


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
