"""check_plan: what a Plan promises, re-derived from its graph and checked (the `--verify` plan checker).

A plan is legal when
- every buffer (and every workspace region) is aligned, lies inside the arena and holds each of its values;
- its declared lifetime covers every write and every read of its values, and no two buffers alive at the same
  statement share a byte;
- each write into memory (a statement's result in its buffer, an in-place result over its input, an update
  written over its parameter) happens only after every read of the memory's old contents, or at the reading
  statement itself when that reads the old contents element for element (the same shape, at its own index);
- no kernel writes memory it reads at other elements: a statement reads its in-place input element for element,
  and every `same_loop` group the backends form (memory/groups.py `planned_groups`) writes each result
  only where no member of the loop reads, or at the very element that member reads (`hazards`; the NumPy runner
  poisons such memory before the kernel, so a plan with a hazard gives wrong numbers there too);
- a reduction pass (ir/reductions.py) writes no member's result over memory of an input of the pass or of another
  member's result: its last block writes every result after the pass has read every input.

A failure is a compiler bug, raised as PlanInvariantError naming the values and statements involved.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from deepdsl.ir import REGISTRY, Stmt
from deepdsl.ir.analysis import last_uses, reads_pointwise
from deepdsl.ir.reductions import reduction_group, reduction_groups
from deepdsl.memory.groups import planned_groups
from deepdsl.memory.plan import ALIGN, Buffer, Plan, aligned, workspace_need, workspace_spans

Home = tuple[str, int, int]  # where a value's elements live: (storage, byte offset, bytes); storage "arena" or a tensor


@dataclass(frozen=True)
class Hazard:
    """A kernel starting at statement `at` writes `writer` over bytes [lo, hi) of `storage`, where `reader` (a
    member of the same kernel) reads `value` at other elements."""

    at: int
    writer: str
    reader: str
    value: str
    storage: str
    lo: int
    hi: int


class PlanInvariantError(AssertionError):
    """A compiler bug: the memory plan breaks one of its promises. The message names the values."""


def check_plan(p: Plan, groups: Sequence[Sequence[Stmt]] | None = None) -> Plan:
    """Check `p` (see the module docstring); `groups` is the kernel grouping to check, by default the one the
    backends form from the plan. Returns `p`."""
    g = p.graph
    stmts = g.stmts
    n = len(stmts)
    fail = _failer(p)
    _check_regions(p, fail)
    homes = _homes(p, fail)
    _check_lifetimes_and_writes(p, homes, fail)
    _check_disjoint_while_live(p, fail)
    position = {s.out.name: i for i, s in enumerate(stmts)}
    spans = workspace_spans(g)  # a reduction pass's members: across the pass (ir/reductions.py)
    for i, s in enumerate(stmts):
        ws = p.workspace.get(s.out.name)
        if ws is not None:
            need = workspace_need(s)
            lo, hi = spans.get(s.out.name, (i, i))
            if ws.start != lo or ws.end != hi:
                fail(f"the workspace of %{s.out.name} lives at statements {ws.start}..{ws.end}, not at {lo}..{hi}")
            if ws.nbytes < need:
                fail(f"the workspace of %{s.out.name} has {ws.nbytes:,} bytes; its kernel needs {need:,}")
            if p.workspace_limit is not None and need > p.workspace_limit:
                fail(f"%{s.out.name} has {need:,} bytes of workspace, over the limit of {p.workspace_limit:,}")
    for name in p.workspace:
        if name not in position:
            fail(f"workspace for %{name}, which no statement computes")
    _check_reduction_passes(p, homes, fail)
    for h in hazards(p, groups):
        loop = "" if h.writer == h.reader else f" in the loop it shares with %{h.reader}"
        fail(f"%{h.writer} is written{loop} over bytes {h.lo:,}..{h.hi:,} of %{h.value} ({h.storage}), which "
             f"%{h.reader} reads at other elements")  # fmt: skip
    if n and not 0 <= p.peak_at < n:
        fail(f"the peak is at statement {p.peak_at}, outside the program's {n} statements")
    if p.live_peak_bytes > p.arena_bytes:
        fail(f"{p.live_peak_bytes:,} bytes are live at once in an arena of {p.arena_bytes:,}")
    return p


def _check_reduction_passes(p: Plan, homes: dict[str, Home], fail) -> None:  # noqa: ANN001
    """A reduction pass (ir/reductions.py, as the CUDA program forms it) reads every member's inputs before its
    last block writes every member's result: no result may lie over an input of the pass or another result
    (but over its own input at the same bytes: a running statistic updated in place, element for element)."""
    for group in reduction_groups(planned_groups(p)):
        if len(group) < 2 or reduction_group(group) is None:
            continue
        for s in group:
            w = homes[s.out.name]
            own = {v.name for v in s.inputs if homes[v.name] == w}
            for v in dict.fromkeys([*(v.name for m in group for v in m.inputs), *(m.out.name for m in group)]):
                r = homes[v]
                if v in own or v == s.out.name or r[0] != w[0] or r[1] + r[2] <= w[1] or w[1] + w[2] <= r[1]:
                    continue
                fail(f"%{s.out.name} is written over bytes {max(r[1], w[1]):,}..{min(r[1] + r[2], w[1] + w[2]):,} "
                     f"of %{v} ({r[0]}), which the reduction pass {', '.join('%' + m.out.name for m in group)} "
                     "still needs when that is written")  # fmt: skip


def _failer(p: Plan):  # noqa: ANN202
    def fail(message: str) -> None:
        raise PlanInvariantError(f"plan of {p.graph.name}: {message}")

    return fail


def _describe(b: Buffer) -> str:
    return f"%{b.values[0]} (bytes {b.offset:,}..{b.offset + b.nbytes:,}, statements {b.start}..{b.end})"


def _check_regions(p: Plan, fail) -> None:  # noqa: ANN001
    """Alignment, bounds, and that each value fits in the buffer that holds it."""
    n = len(p.graph.stmts)
    types = {s.out.name: s.out.type for s in p.graph.stmts}
    seen: set[str] = set()
    for b in (*p.buffers, *p.workspace.values()):
        if b.offset % ALIGN or b.nbytes % ALIGN:
            fail(f"buffer {_describe(b)} is not aligned to {ALIGN} bytes")
        if b.offset < 0 or b.offset + b.nbytes > p.arena_bytes:
            fail(f"buffer {_describe(b)} lies outside the arena of {p.arena_bytes:,} bytes")
        if not 0 <= b.start <= b.end <= n:
            fail(f"buffer {_describe(b)} has no valid lifetime in {n} statements")
    for b in p.buffers:
        for v in b.values:
            if v in seen:
                fail(f"%{v} is held by two buffers")
            seen.add(v)
            if v not in types:
                fail(f"buffer {_describe(b)} holds %{v}, which no statement computes")
            elif aligned(types[v].nbytes) > b.nbytes:
                fail(f"%{v} needs {types[v].nbytes:,} bytes; its buffer {_describe(b)} has {b.nbytes:,}")


def _homes(p: Plan, fail) -> dict[str, Home]:  # noqa: ANN001
    """Where every value of the program lives: its arena buffer, or the storage of an input or parameter (views
    live where their base does; an update written over its parameter lives in the parameter's storage)."""
    g = p.graph
    homes: dict[str, Home] = {}
    for d in g.inputs:
        homes[d.value.name] = ("input " + d.value.name, 0, d.value.type.nbytes)
    params = {q.value.name: q for q in g.params}
    for q in g.params:
        homes[q.value.name] = ("parameter " + q.value.name, 0, q.value.type.nbytes)
    updated = {v.name: target for target, v in g.updates}
    for s in g.stmts:
        name = s.out.name
        if REGISTRY[s.op].view:
            homes[name] = homes[s.inputs[0].name]
            continue
        if name in p.in_state:
            target = p.in_state[name]
            if target not in params or updated.get(name) != target:
                fail(f"%{name} is written over %{target}, but it is not the update of that parameter or state")
            homes[name] = homes[target]
            continue
        try:
            b = p.buffer_of(name)
        except KeyError:
            fail(f"%{name} = {s.op}(...) has no buffer")
        homes[name] = ("arena", b.offset, b.nbytes)
        if "inplace" in s.a:
            base = s.inputs[s.a["inplace"]].name
            if homes.get(base) != homes[name]:
                fail(f"%{name} = {s.op}(...) is marked in place over %{base}, but the plan keeps them apart")
    return homes


def _check_lifetimes_and_writes(p: Plan, homes: dict[str, Home], fail) -> None:  # noqa: ANN001
    """Each buffer's declared lifetime covers its values' writes and reads; no write lands on contents still read."""
    g = p.graph
    stmts = g.stmts
    n = len(stmts)
    made: dict[str, int] = {}  # value -> the statement computing it (-1: an input or a parameter)
    for d in g.inputs:
        made[d.value.name] = -1
    for q in g.params:
        made[q.value.name] = -1
    for i, s in enumerate(stmts):
        made[s.out.name] = i
    last = last_uses(g)  # value -> its last reader (n: read at the end, as an output or update)
    # the statements writing each storage, in order (a view writes nothing)
    writes: dict[Home, list[int]] = {}
    for i, s in enumerate(stmts):
        if not REGISTRY[s.op].view:
            writes.setdefault(homes[s.out.name], []).append(i)
    for b in p.buffers:
        first = min(made[v] for v in b.values)
        end = max(last.get(v, made[v]) for v in b.values)
        if b.start > first or b.end < end:
            fail(f"buffer {_describe(b)} is written at statement {first} and read until {end}, outside its lifetime")
    stored = {h for h in writes if h[0] == "arena"}
    for name, h in homes.items():
        if h[0] == "arena" and h not in stored:
            fail(f"%{name} lives in arena bytes {h[1]:,}.. that no statement writes")
    for name, h in homes.items():
        ws = writes.get(h)
        if not ws:
            continue
        k = bisect.bisect_right(ws, made[name])
        if k == len(ws):
            continue
        killer = ws[k]  # the first write after `name` was stored: its contents are gone from there on
        read = last.get(name, -1)
        if read < killer:
            continue
        w = stmts[killer]
        what = f"%{w.out.name} = {w.op}(...) (statement {killer})"
        if read > killer:
            at = "at the end of the step" if read == n else f"by statement {read}"
            fail(f"{what} overwrites %{name}, which is still read {at}")
        v = next(v for v in w.inputs if v.name == name)
        if v.type.shape != w.out.type.shape or v.type.dtype != w.out.type.dtype or not reads_pointwise(w, name):
            fail(f"{what} overwrites %{name} while reading it other than element for element")


def _check_disjoint_while_live(p: Plan, fail) -> None:  # noqa: ANN001
    """No two regions alive at one statement share a byte: a sweep over the statements, keeping the live regions
    sorted by offset (pairwise apart, so a new one need only be compared with its neighbours)."""
    regions = sorted((*p.buffers, *p.workspace.values()), key=lambda b: b.start)
    ends = sorted(range(len(regions)), key=lambda k: regions[k].end)
    live: list[tuple[int, int]] = []  # (offset, region number), sorted
    e = 0
    for k, b in enumerate(regions):
        while e < len(ends) and regions[ends[e]].end < b.start:
            dead = regions[ends[e]]
            if ends[e] < k:
                live.pop(bisect.bisect_left(live, (dead.offset, ends[e])))
            e += 1
        at = bisect.bisect_left(live, (b.offset, k))
        for j in (at - 1, at):
            if 0 <= j < len(live):
                other = regions[live[j][1]]
                if other.offset < b.offset + b.nbytes and b.offset < other.offset + other.nbytes:
                    fail(f"buffers {_describe(other)} and {_describe(b)} overlap while both are live")
        live.insert(at, (b.offset, k))


def hazards(p: Plan, groups: Sequence[Sequence[Stmt]] | None = None) -> tuple[Hazard, ...]:
    """Every place where a kernel (a statement, or a `same_loop` group as one loop) writes memory that it also
    reads at other elements: on a device any element's write may land before another element's read. A legal
    plan has none. `groups`: the kernels, by default those the backends form from the plan."""
    stmts = p.graph.stmts
    homes = _homes(p, _failer(p))
    position = {s.out.name: i for i, s in enumerate(stmts)}
    found: list[Hazard] = []
    for group in planned_groups(p) if groups is None else groups:
        at = position[group[0].out.name]
        held: set[str] = set()  # results of earlier members: a loop keeps them in locals
        for j, s in enumerate(group):
            if REGISTRY[s.op].view:
                held.add(s.out.name)
                continue
            w = homes[s.out.name]
            for m in group[: j + 1]:
                for v in m.inputs:
                    r = homes[v.name]
                    if v.name in held or r[0] != w[0] or r[1] + r[2] <= w[1] or w[1] + w[2] <= r[1]:
                        continue
                    if r == w and v.type.shape == s.out.type.shape and reads_pointwise(m, v.name):
                        continue
                    found.append(Hazard(at, s.out.name, m.out.name, v.name, w[0], max(r[1], w[1]),
                                        min(r[1] + r[2], w[1] + w[2])))  # fmt: skip
                if m is not s and m.out.name in held:
                    o = homes[m.out.name]
                    if o != w and o[0] == w[0] and o[1] < w[1] + w[2] and w[1] < o[1] + o[2]:
                        found.append(Hazard(at, s.out.name, m.out.name, m.out.name, w[0], max(o[1], w[1]),
                                            min(o[1] + o[2], w[1] + w[2])))  # fmt: skip
            held.add(s.out.name)
    return tuple(found)
