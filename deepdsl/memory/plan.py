"""The Plan: every temporary of a program gets a fixed offset in one arena, allocated once.

Liveness: a value is born at the statement that computes it and dies after its last reader (values that
are outputs or updates live to the end). A view (reshape) shares its base's buffer and extends its life;
a statement marked `inplace=k` writes into input k's buffer, so the two share one buffer too. Offsets are
assigned greedily, largest buffer first, at the lowest offset that overlaps no buffer alive at the same
time; the arena is the highest end offset, which is the exact peak of the arena (inputs, parameters and
optimizer state live in their own persistent storage). An update whose statement is the last reader of the
parameter or state it replaces, and reads it only element for element, is written straight into that storage
(`Plan.in_state`): a gradient then dies at its parameter's update instead of turning into a buffer that lives
to the end of the step.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from deepdsl.ir import REGISTRY, Graph, Stmt
from deepdsl.ir.analysis import last_reads, last_uses, reads_pointwise
from deepdsl.ir.groups import kernel_groups
from deepdsl.ir.reductions import group_spans, reduction_groups, scratch_bytes

ALIGN = 256  # bytes: CUDA's allocation alignment, so every buffer suits vector loads


@dataclass(frozen=True)
class Buffer:
    values: tuple[str, ...]  # the values stored here (a base, its views, in-place results)
    nbytes: int  # rounded up to ALIGN
    start: int  # the statement that first writes it
    end: int  # the last statement that reads it (len(stmts) when it is an output or update)
    offset: int


@dataclass(frozen=True)
class Plan:
    graph: Graph
    buffers: tuple[Buffer, ...]
    arena_bytes: int
    live_peak_bytes: int  # the most bytes of buffers alive at one statement (a lower bound of any arena)
    peak_at: int  # the statement where that happens
    # update values written straight into the storage of the parameter or state they replace (no arena space):
    # value name -> parameter name; legal because the statement computing it is that storage's last reader
    in_state: Mapping[str, str] = field(default_factory=dict)
    # scratch a statement's kernel uses while it runs (an im2col matrix), by the statement's result name; these
    # regions are in the arena too, alive for their one statement
    workspace: Mapping[str, Buffer] = field(default_factory=dict)
    workspace_limit: int | None = None  # the most scratch one statement may take (None: no limit)
    # value -> the buffer holding it, derived from `buffers`
    index: Mapping[str, Buffer] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # read-only views of private copies: a Plan cannot change after it is made
        object.__setattr__(self, "in_state", MappingProxyType(dict(self.in_state)))
        object.__setattr__(self, "workspace", MappingProxyType(dict(self.workspace)))
        object.__setattr__(self, "index", MappingProxyType({v: b for b in self.buffers for v in b.values}))

    def buffer_of(self, name: str) -> Buffer:
        return self.index[name]


def aligned(n: int) -> int:
    return max(ALIGN, (n + ALIGN - 1) // ALIGN * ALIGN)


def plan(g: Graph, workspace_limit: int | None = None) -> Plan:
    """The plan of `g` in the memory-aware schedule (memory/schedule.py), or in the program's own order where
    that happens to place into a smaller arena. A statement whose kernel declares scratch (the registry's
    `workspace`) gets it in the arena when it needs at most `workspace_limit` bytes (None: any); otherwise its
    kernel works without (a direct convolution instead of im2col + GEMM)."""
    from deepdsl.memory.schedule import schedule

    return min((place(schedule(g), workspace_limit), place(g, workspace_limit)), key=lambda p: p.arena_bytes)


def workspace_need(s: Stmt) -> int:
    """The scratch bytes the statement's fast kernel declares (0: none)."""
    op = REGISTRY[s.op]
    if op.workspace is None:  # a large sum's partial sums, where it is split over blocks (ir/reductions.py)
        return scratch_bytes(s)
    primary = s.inputs[: op.arity] if "epilogue" in s.a and op.arity is not None else s.inputs
    return op.workspace(tuple(v.type for v in primary), s.out.type, s.a)


def workspace_spans(g: Graph) -> dict[str, tuple[int, int]]:
    """The statements whose workspace lives across more than their own statement: the members of a reduction pass
    (ir/reductions.py), whose partial sums the pass's last block reads after every member's were written."""
    return group_spans(g.stmts, reduction_groups(kernel_groups(g.stmts)))


def place(g: Graph, workspace_limit: int | None = None) -> Plan:
    """Lifetimes and arena offsets of the statements of `g`, in their order."""
    n = len(g.stmts)
    in_state = updates_in_state(g)
    last = last_uses(g)
    owner: dict[str, str] = {}  # value -> the value whose buffer holds it
    start: dict[str, int] = {}
    end: dict[str, int] = {}
    size: dict[str, int] = {}

    def root(v: str) -> str:
        while owner[v] != v:
            v = owner[v]
        return v

    spans = workspace_spans(g)
    for i, s in enumerate(g.stmts):
        need = workspace_need(s)
        if need and (workspace_limit is None or need <= workspace_limit):
            ws = f"workspace:{s.out.name}"
            owner[ws], size[ws] = ws, aligned(need)
            start[ws], end[ws] = spans.get(s.out.name, (i, i))
        if s.out.name in in_state:
            continue
        shared = None
        if REGISTRY[s.op].view:
            shared = s.inputs[0].name
        elif "inplace" in s.a:
            shared = s.inputs[s.a["inplace"]].name
        if shared is not None and shared in owner:
            owner[s.out.name] = root(shared)
        else:
            owner[s.out.name] = s.out.name
            start[s.out.name], end[s.out.name], size[s.out.name] = i, i, aligned(s.out.type.nbytes)
    for v in owner:  # a buffer lives until the last use of any value it holds
        r = root(v)
        end[r] = max(end[r], last.get(v, -1))
    # a reduction pass (ir/reductions.py) reads its members' inputs until its last block, which writes every
    # member's result: each result is live from the pass's first statement, each input until its last (else a
    # member's result may take the memory of an input a later-written member still reads: a variance under dbeta)
    stmts = {s.out.name: s for s in g.stmts}
    for name, (lo, hi) in spans.items():
        s = stmts[name]
        if name in owner and root(name) == name:
            start[name] = min(start[name], lo)
        for v in s.inputs:
            if v.name in owner:
                r = root(v.name)
                end[r] = max(end[r], hi)
    members: dict[str, list[str]] = {}
    for v in owner:
        members.setdefault(root(v), []).append(v)
    offsets = min(
        (first_fit(sorted(size, key=order), size, start, end) for order in _orders(size, start, end)),
        key=lambda found: max((found[r] + size[r] for r in found), default=0),
    )
    every = [Buffer(tuple(members[r]), size[r], start[r], end[r], offsets[r]) for r in sorted(size, key=start.get)]
    buffers = tuple(b for b in every if not b.values[0].startswith("workspace:"))
    workspace = {b.values[0].removeprefix("workspace:"): b for b in every if b.values[0].startswith("workspace:")}
    delta = [0] * (n + 2)  # live bytes as a difference array: + at a buffer's start, - after its end
    for b in every:
        delta[b.start] += b.nbytes
        delta[b.end + 1] -= b.nbytes
    live = list(itertools.accumulate(delta[: n + 1]))
    peak_at = max(range(n + 1), key=lambda i: live[i]) if n else 0
    arena = max((b.offset + b.nbytes for b in every), default=0)
    return Plan(
        g, buffers, arena, live[peak_at] if n else 0, min(peak_at, max(n - 1, 0)), in_state, workspace, workspace_limit
    )


def _orders(size: dict[str, int], start: dict[str, int], end: dict[str, int]) -> tuple:
    """The orders first_fit places the buffers in, the arena the smallest of theirs (the first where they tie): the
    largest first, then the largest over the longest time first (size times lifetime), then by start (a buffer
    placed before those that begin after it); no one order packs every program tightest."""
    return (
        lambda r: (-size[r], start[r]),
        lambda r: (-size[r] * (end[r] - start[r] + 1), start[r]),
        lambda r: (start[r], -size[r]),
    )


def first_fit(roots: list[str], size: dict[str, int], start: dict[str, int], end: dict[str, int]) -> dict[str, int]:
    """Each buffer in turn at the lowest offset where it overlaps no buffer placed before it that is alive at the
    same time. Vectorised over the buffers placed so far (NumPy), so that a 1000-layer network's thousands of
    buffers place in a fraction of a second."""
    count = len(roots)
    lo, hi = np.zeros(count, np.int64), np.zeros(count, np.int64)
    first, last = np.zeros(count, np.int64), np.zeros(count, np.int64)
    offsets: dict[str, int] = {}
    for k, r in enumerate(roots):
        alive = (first[:k] <= end[r]) & (start[r] <= last[:k])
        busy_lo, busy_hi = lo[:k][alive], hi[:k][alive]
        offset = 0
        if busy_lo.size:
            by = np.argsort(busy_lo, kind="stable")
            busy_lo, busy_hi = busy_lo[by], busy_hi[by]
            # the candidate offset before each busy block: the highest end among the blocks below it in order
            before = np.concatenate(([0], np.maximum.accumulate(np.maximum(busy_hi, 0))[:-1]))
            fits = np.flatnonzero(before + size[r] <= busy_lo)
            offset = int(before[fits[0]]) if fits.size else max(0, int(busy_hi.max()))
        offsets[r] = offset
        lo[k], hi[k], first[k], last[k] = offset, offset + size[r], start[r], end[r]
    return offsets


def updates_in_state(g: Graph) -> dict[str, str]:
    """Update values whose statement is the last reader of the storage they replace (and that no view, in-place
    partner or other update shares): they can be written there directly."""
    last = last_reads(g.stmts)
    viewed = {s.inputs[0].name for s in g.stmts if REGISTRY[s.op].view}
    made = {s.out.name: (i, s) for i, s in enumerate(g.stmts)}
    counts: dict[str, int] = {}
    for _, v in (*g.outputs, *g.updates):
        counts[v.name] = counts.get(v.name, 0) + 1
    out: dict[str, str] = {}
    for target, v in g.updates:
        if v.name not in made or counts[v.name] > 1 or v.name in viewed:
            continue
        i, s = made[v.name]
        if not REGISTRY[s.op].view and last.get(target, -1) <= i and reads_pointwise(s, target):
            out[v.name] = target
    return out


def format_plan(p: Plan) -> str:
    """One line per statement: what it allocates (offset, bytes) and what dies after it."""
    g = p.graph
    born = {b.start: b for b in p.buffers}
    dies: dict[int, list[Buffer]] = {}
    for b in p.buffers:
        dies.setdefault(b.end, []).append(b)
    lines = [f"plan {g.name}: arena {p.arena_bytes:,} bytes, live peak {p.live_peak_bytes:,} bytes at statement "
             f"{p.peak_at}, {len(p.buffers)} buffers"]  # fmt: skip
    for i, s in enumerate(g.stmts):
        b = born.get(i)
        own = b is not None and s.out.name == b.values[0]
        if own and b is not None:
            where = f"@{b.offset:<12,} {b.nbytes:>12,} B"
        elif s.out.name in p.in_state:
            where = f"{'over %' + p.in_state[s.out.name]:>29}"
        else:
            where = f"{'(shared)':>29}"
        ws = p.workspace.get(s.out.name)
        scratch = f"  workspace @{ws.offset:,} {ws.nbytes:,} B" if ws else ""
        freed = ", ".join(f"%{x.values[0]}" for x in dies.get(i, []))
        lines.append(f"  {i:>4} %{s.out.name:<6} {s.op:<24} {where}{scratch}" + (f"  free {freed}" if freed else ""))
    return "\n".join(lines) + "\n"
