"""A data-parallel training step on the GPU runner (passes/data_parallel.py; docs/distributed.md): where its
reductions start and are waited for among the step's launches, and how it accumulates micro-batches.

A bucket's `allreduce_start` is a kernel of the program (ops.py `_pack`: the bucket's gradients times the scale,
packed); right after it the runner's reducer (nccl.py) starts the bucket's sum over the ranks. Its `allreduce_wait`
is a view: no launch, only the reducer's wait, issued before the first launch of a statement placed after it (the
state bucket's at the step's end, before the updates' copies). With no reducer (one rank) both are nothing.

Micro-batches (`--micro-batches M`, gradient accumulation): the launches before the reductions (`pre`) run once per
micro-batch, each on its shard; after each pack the bucket is summed into an accumulator of its own (micro-batch 0
copies it there, micro-batch k adds it: `acc[e] = acc[e] + buf[e]`, one float32 add in k order, as the NumPy
executor does), and after the last one the accumulator's all-reduce starts (with more than one rank). The rest
(`post`: the waits, each copying its accumulator back into the bucket, the updates and their copies) runs once.
Running every pre launch before every post one computes what the plan's order computes only where no pre launch
placed after a post one writes over memory a post launch reads; a plan where that is not so cannot accumulate (an
error naming why), as in the Java program's `pre_post`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from deepdsl.backends.cuda.launch import BLOCK, Launch
from deepdsl.errors import DslProgramError
from deepdsl.ir import REGISTRY
from deepdsl.memory.plan import Plan
from deepdsl.ops.collective import is_data_parallel, post_statements

MAX_GRID = 4096  # blocks of an accumulation's grid-stride loop


class Reducer(Protocol):
    """The runner's collective (nccl.py's NcclReducer): a bucket's in-place sum over the ranks, started and waited
    for on the GPU's streams."""

    size: int

    def start(self, bucket: int, ptr: int, count: int) -> None: ...
    def wait(self, bucket: int) -> None: ...


@dataclass(frozen=True)
class Bucket:
    index: int
    stmt: str  # the allreduce_start's result: the packed bucket's buffer
    count: int  # its floats
    call: int  # the index of its pack among the step's calls


def accumulate_kernel(count: int) -> str:
    return f"dd_accumulate_{count}"


def accumulate_source(plan: Plan) -> tuple[str, list[str]]:
    """The kernels adding a bucket into its accumulator (one per bucket size; every argument a pointer, as the
    runner launches), and their names; nothing for a program without the data-parallel pass."""
    counts = sorted({s.out.type.numel for s in plan.graph.stmts if s.op == "allreduce_start"})
    texts = [
        f"// gradient accumulation: acc[e] = acc[e] + x[e] over a bucket of {n} floats\n"
        f'extern "C" __global__ void {accumulate_kernel(n)}(float* __restrict__ acc, const float* __restrict__ x) {{\n'
        f"  DD_GRID_STRIDE(e, {n}) {{ acc[e] = acc[e] + x[e]; }}\n}}\n"
        for n in counts
    ]  # fmt: skip
    return "\n".join(texts), [accumulate_kernel(n) for n in counts]


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[0] + b[1] and b[0] < a[0] + a[1]


class ParallelStep:
    """The train step of a data-parallel plan as the runner issues it: its calls with the reductions among them, in
    the plan's order (one micro-batch) or as pre per micro-batch then post (`micro_batches` > 1)."""

    def __init__(self, plan: Plan, calls: Sequence[tuple[Launch, list[int], Any]], micro_batches: int,
                 reducer: Reducer | None) -> None:  # fmt: skip
        g = plan.graph
        self.plan, self.micro_batches, self.reducer = plan, micro_batches, reducer
        position = {s.out.name: i for i, s in enumerate(g.stmts)}
        span = [[position[x.stmt], *(position[a] for a in x.also)] for x, _, _ in calls]
        self.buckets: dict[int, Bucket] = {}
        for c, (x, _, _) in enumerate(calls):
            if x.op == "allreduce_start":
                s = g.stmts[position[x.stmt]]
                self.buckets[s.a["bucket"]] = Bucket(s.a["bucket"], x.stmt, s.out.type.numel, c)
        # each wait before the first call of a statement placed after it (len(calls): at the end of the launches)
        self.waits: dict[int, list[int]] = {}
        for i, s in enumerate(g.stmts):
            if s.op == "allreduce_wait":
                at = next((c for c, ix in enumerate(span) if min(ix) > i), len(calls))
                if any(min(ix) < i < max(ix) for ix in span):
                    raise DslProgramError(f"--device cuda: a kernel spans the wait of bucket {s.a['bucket']}")
                self.waits.setdefault(at, []).append(s.a["bucket"])
        self.pointer = {b.index: calls[b.call][1][0] for b in self.buckets.values()}  # the bucket's buffer
        post = post_statements(g)
        self.post: list[bool] = []
        for ix in span:
            sides = {g.stmts[i].out.name in post for i in ix}
            self.post.append(sides == {True})
            if len(sides) > 1 and micro_batches > 1:
                raise DslProgramError(
                    f"--micro-batches {micro_batches}: a kernel of this plan computes values before and after the "
                    "reductions at once, so it cannot accumulate micro-batches (--micro-batches 1)"
                )  # fmt: skip
        if micro_batches > 1:
            self._check_separable(calls, post)
        self.accumulators: dict[int, int] = {}  # bucket -> its accumulator's address (the runner allocates them)

    def _check_separable(self, calls: Sequence[tuple[Launch, list[int], Any]], post: frozenset[str]) -> None:
        """A pre launch placed after the first post one must not write over memory holding a pre value that a post
        launch reads (a bucket, say): every pre launch runs before every post one."""
        p, g = self.plan, self.plan.graph
        read = {v.name for s in g.stmts if s.out.name in post for v in s.inputs if v.name not in post}
        kept = [(p.buffer_of(n).offset, p.buffer_of(n).nbytes) for n in read if n in p.index]
        first = next((c for c, is_post in enumerate(self.post) if is_post), len(calls))
        stmts = {s.out.name: s for s in g.stmts}
        for c in range(first, len(calls)):
            if self.post[c]:
                continue
            x = calls[c][0]
            for name in (x.stmt, *x.also):
                if REGISTRY[stmts[name].op].view:
                    continue
                written = [p.buffer_of(name)] if name in p.index else []
                written += [p.workspace[name]] if name in p.workspace else []
                if any(_overlap((w.offset, w.nbytes), k) for w in written for k in kept):
                    raise DslProgramError(
                        f"--micro-batches {self.micro_batches}: this program's memory plan reuses memory the updates "
                        f"read for %{name}, computed after them, so it cannot accumulate micro-batches "
                        "(--micro-batches 1)"
                    )  # fmt: skip

    def issue(self, run_call: Callable[[int], None], copy: Callable[[int, int, int], None],
              accumulate: Callable[[int, int, int], None], part: str = "all", micro: int = 0) -> None:  # fmt: skip
        """Issue the step's calls (`run_call(index)`) with the reductions: `part` "all" (one micro-batch: the plan's
        order), "pre" (micro-batch `micro`'s calls before the reductions and its accumulation) or "post" (the waits,
        the updates). `copy(dst, src, bytes)` and `accumulate(count, acc, x)` are the driver's."""
        n = len(self.post)
        last = micro == self.micro_batches - 1
        for c in range(n + 1):
            if part != "pre":
                for b in self.waits.get(c, ()):
                    self._wait(b, copy)
            if c == n:
                break
            if part == "all" or (part == "post") == self.post[c]:
                run_call(c)
                bucket = next((b for b in self.buckets.values() if b.call == c), None)
                if bucket is None:
                    continue
                if part == "all":
                    if self.reducer is not None:
                        self.reducer.start(bucket.index, self.pointer[bucket.index], bucket.count)
                    continue
                acc = self.accumulators[bucket.index]
                if micro == 0:
                    copy(acc, self.pointer[bucket.index], 4 * bucket.count)
                else:
                    accumulate(bucket.count, acc, self.pointer[bucket.index])
                if last and self.reducer is not None:
                    self.reducer.start(bucket.index, acc, bucket.count)

    def _wait(self, bucket: int, copy: Callable[[int, int, int], None]) -> None:
        if self.reducer is not None:
            self.reducer.wait(bucket)
        if self.micro_batches > 1:  # the sum over the micro-batches (and ranks) back into the bucket
            b = self.buckets[bucket]
            copy(self.pointer[bucket], self.accumulators[bucket], 4 * b.count)


def accumulate_launch(count: int) -> Launch:
    """The launch of the accumulation kernel of a bucket of `count` floats (its pointers are given at the call)."""
    grid = max(1, min(MAX_GRID, -(-count // BLOCK)))
    return Launch(accumulate_kernel(count), "", "accumulate", (grid, 1, 1), (BLOCK, 1, 1), 0, 0, (), count,
                  "grid-stride")  # fmt: skip


__all__ = ["ParallelStep", "Reducer", "accumulate_launch", "accumulate_source", "is_data_parallel"]
