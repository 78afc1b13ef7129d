"""Large reductions split over many blocks, and the reductions one pass computes together.

A statement whose body is one sum over a range (`channel_sum`, `channel_mean`, `channel_var`, `sum`, a fused
`sum(g * xhat)`), with few outputs and a large range, would run on a GPU as one block per output element: 64 blocks
for a stem's 64 channels on a GPU of 132 multiprocessors. Here such a sum is split: its first variable (the batch
`n`, outermost) and the rest (`h`, `w`, innermost, contiguous) are cut into `slices` pieces so that outputs x slices
blocks fill the GPU (`TARGET_BLOCKS`, four blocks per multiprocessor of an H100/H200), each block adds its piece into
a partial sum (in double) in scratch, and in the same launch the last block to finish (the CUDA threadFenceReduction
pattern: each block fences its partial sums, then counts itself done on a counter; the one that counts last) adds
each output's partial sums in slice order: the same order, hence the same bits, every run, whichever block is last.
A pass is ONE launch, split or not. The scratch is the statement's workspace in the memory plan (memory/plan.py
`workspace_need`), so that the planned arena is what the GPU uses; the counter is not there (the arena's regions
are reused by other buffers between passes, and by the other programs between steps, so it could not keep its zero):
it is one counter of the CUDA module (backends/cuda/library.cu `dd_pass_count`), zero when the module loads, wrapped
back to zero by each pass's last block.

Reductions over the same range run as one pass (`reduction_groups`): a batch norm's channel mean and variance (the
sum and the sum of squares, in double, so one pass is exact enough: var = E[x^2] - mean^2) with the two running
statistics' updates done by the last block; and adjacent sums over the same range that do not read each other
(batch norm's dgamma = sum(g * xhat) and dbeta = sum(g)).

This is the rule on the program alone (the kernel counts of `deepdsl ir --stats` use it); the CUDA program
(backends/cuda/passes.py) writes the kernels.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from deepdsl.ir.analysis import index_form, top_reductions
from deepdsl.ir.graph import Stmt
from deepdsl.ir.indexexpr import IE, Apply, Const, Reduce

TARGET_BLOCKS = 4 * 132  # blocks a split reduction launches at least: four per multiprocessor of an H100/H200
SPLIT_MIN = 1 << 16  # elements read in all from which a reduction splits
THREADS = 256  # threads of a partial-sum block
MIN_PIECE = 64  # values of the inner range a piece has at least
PARTIAL_BYTES = 8  # a partial sum: a double


@dataclass(frozen=True)
class Split:
    """How a reduction of `numel` outputs over `vars` is cut: `outer` pieces of its first variable times `inner`
    pieces of the rest flattened, `slices` partial sums an output. Piece k of n over a range of m values is
    [k m / n, (k + 1) m / n): none is empty, sizes differ by one at most."""

    numel: int
    vars: tuple[tuple[str, int], ...]
    outer: int
    inner: int

    @property
    def slices(self) -> int:
        return self.outer * self.inner

    @property
    def blocks(self) -> int:
        return self.numel * self.slices

    @property
    def scratch_bytes(self) -> int:
        return self.slices * self.numel * PARTIAL_BYTES if self.slices > 1 else 0


def split_of(numel: int, vars_: tuple[tuple[str, int], ...]) -> Split:
    """The cut of a sum of `numel` outputs over `vars_` (see the module docstring); one slice when it is small."""
    n0 = vars_[0][1]
    rest = math.prod(n for _, n in vars_[1:])
    want = -(-TARGET_BLOCKS // numel) if numel * n0 * rest >= SPLIT_MIN else 1
    outer = max(1, min(n0, want))
    inner = max(1, min(-(-want // outer), -(-rest // MIN_PIECE))) if len(vars_) > 1 else 1
    return Split(numel, vars_, outer, inner)


@dataclass(frozen=True)
class SumForm:
    """A statement as one sum and what is done with it: out[e] = outside(total), `total` = sum over `reduce`."""

    stmt: Stmt
    out: tuple[tuple[str, int], ...]
    reduce: Reduce
    outside: IE  # the body with the sum replaced by a placeholder (`is_total`)
    split: Split


_TOTAL = Apply("dd_total", ())  # where the sum stood in a body (no body has this function)


def _replace(e: IE, r: Reduce) -> IE:
    if e is r or e == r:
        return _TOTAL
    if isinstance(e, Apply):
        return Apply(e.fn, tuple(_replace(a, r) for a in e.args))
    return e


def is_total(e: IE) -> bool:
    return e == _TOTAL


def _reads_nothing(e: IE) -> bool:
    if isinstance(e, Apply):
        return all(_reads_nothing(a) for a in e.args)
    return isinstance(e, Const)


def sum_form(s: Stmt) -> SumForm | None:
    """`s` as one large sum, where its kernel is a reduction shared by blocks (see the module docstring): a float32
    result whose body holds exactly one top-level sum, is otherwise a function of that sum alone (a mean's count),
    and reduces at least 64 elements per output. Kept on the statement, as a cached_property keeps its value: the
    passes and the emitters ask of every statement, for every group of kernels, again (ResNet-50: ~27,000 asks of
    ~1,000 statements, 0.8 s of a 1.6 s compile)."""
    if "_sum_form" not in s.__dict__:
        s.__dict__["_sum_form"] = _sum_form(s)
    return s.__dict__["_sum_form"]


def _sum_form(s: Stmt) -> SumForm | None:
    if s.out.type.dtype.value != "f32":
        return None
    form = index_form(s)
    if form is None:
        return None
    tops = top_reductions(form.body)
    if len(tops) != 1 or tops[0].kind != "sum":
        return None
    r = tops[0]
    outside = _replace(form.body, r)
    if not _reads_nothing(outside) and not is_total(outside):
        return None
    numel = math.prod(n for _, n in form.out)
    reduced = math.prod(n for _, n in r.vars)
    if not (reduced >= 64 and reduced >= numel // 64):  # as cuda/kernels.py's cooperative kernels
        return None
    return SumForm(s, form.out, r, outside, split_of(numel, r.vars))


def scratch_bytes(s: Stmt) -> int:
    """The partial sums a split reduction's blocks leave for its last block (0: it is not split)."""
    f = sum_form(s)
    return f.split.scratch_bytes if f is not None else 0


# ---- reductions computed in one pass ----


@dataclass(frozen=True)
class ReductionGroup:
    """Statements one pass computes: `sums` (each a SumForm over the same range), `updates` per-element statements
    folded into its finishing work (the running statistics, batch norm's inverse deviation `bn_invstd`), and
    `moments`:
    a (mean, variance) pair of positions whose variance is computed in the same pass as its mean (its sum of
    squares, not of squared deviations from the mean)."""

    stmts: tuple[Stmt, ...]  # in program order
    sums: tuple[SumForm, ...]
    updates: tuple[tuple[Stmt, int], ...] = ()  # (statement, the sum it takes; -1: its input at the same element)
    moments: tuple[tuple[int, int], ...] = ()

    @property
    def split(self) -> Split:
        return self.sums[0].split


def _same_range(a: SumForm, b: SumForm) -> bool:
    return a.out == b.out and tuple(n for _, n in a.reduce.vars) == tuple(n for _, n in b.reduce.vars)


def _is_mean_of(f: SumForm, x: str) -> bool:
    return f.stmt.op == "channel_mean" and f.stmt.inputs[0].name == x


def _running(s: Stmt, of: str) -> bool:
    return s.op == "running_update" and s.inputs[1].name == of and s.inputs[0].name != of


def reduction_group(stmts: Sequence[Stmt]) -> ReductionGroup | None:
    """`stmts` (adjacent, in order) as one pass, or None."""
    sums: list[SumForm] = []
    updates: list[tuple[Stmt, int]] = []
    moments: list[tuple[int, int]] = []
    made: dict[str, int] = {}
    for s in stmts:
        if s.op == "running_update" and sums:
            if s.inputs[1].name not in made or any(v.name in made for v in s.inputs[:1]):
                return None
            updates.append((s, made[s.inputs[1].name]))
            continue
        if s.op == "bn_invstd":  # of a variance in the pass, or of one at the same element (then anywhere in it)
            updates.append((s, made.get(s.inputs[0].name, -1)))
            continue
        f = sum_form(s)
        if f is None or (sums and not _same_range(sums[0], f)):
            return None
        reads = {v.name for v in s.inputs} & set(made)
        if reads:  # only a variance may read a mean of the group: channel_var(x, mean(x))
            if s.op != "channel_var" or len(s.inputs) != 2:
                return None
            x, m = s.inputs
            if reads != {m.name} or x.name == m.name or not _is_mean_of(sums[made[m.name]], x.name):
                return None
            moments.append((made[m.name], len(sums)))
        made[s.out.name] = len(sums)
        sums.append(f)
    if not sums or any(made.get(u.out.name) is not None for u, _ in updates):
        return None
    shape = tuple(n for _, n in sums[0].out)
    if any(u.op == "bn_invstd" and (u.out.type.shape != shape or u.inputs[0].type.shape != shape) for u, _ in updates):
        return None
    # a statement of the pass reads no per-element result of it (the pass writes those last)
    late = {u.out.name for u, _ in updates}
    if any(v.name in late for s in stmts for v in s.inputs):
        return None
    return ReductionGroup(tuple(stmts), tuple(sums), tuple(updates), tuple(moments))


def reduction_groups(groups: Sequence[tuple[Stmt, ...]]) -> list[tuple[Stmt, ...]]:
    """`groups` (ir/groups.py's kernels, in order) with adjacent reductions over the same range, and the running
    updates of a batch norm's statistics, merged into one pass where `reduction_group` allows; every other group
    as it is."""
    out: list[tuple[Stmt, ...]] = []
    for group in groups:
        if out and len(group) == 1:
            merged = (*out[-1], *group)
            # a pass grows by one statement at a time; a lone inverse deviation may start one (it reads no sum)
            opens = reduction_group(out[-1]) is not None or len(out[-1]) == 1 and out[-1][0].op == "bn_invstd"
            if opens and reduction_group(merged) is not None:
                out[-1] = merged
                continue
        out.append(group)
    return out


def group_spans(stmts: Sequence[Stmt], groups: Sequence[tuple[Stmt, ...]]) -> dict[str, tuple[int, int]]:
    """For each statement of a one-pass group: the positions of the group's first and last statements in `stmts`
    (a split reduction's scratch lives across its whole group)."""
    position = {s.out.name: i for i, s in enumerate(stmts)}
    spans: dict[str, tuple[int, int]] = {}
    for group in groups:
        if len(group) > 1 and reduction_group(group) is not None:
            lo, hi = position[group[0].out.name], position[group[-1].out.name]
            for s in group:
                spans[s.out.name] = (lo, hi)
    return spans
