"""One data-parallel step of the NumPy runner: the program's statements per micro-batch, its buckets handed to an
engine (engines.py), the optimiser's statements once."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from deepdsl.backends.numpy_runner import RunResult, execute, param_value
from deepdsl.distributed.engines import Comm
from deepdsl.ir import Graph
from deepdsl.ir.analysis import last_reads
from deepdsl.ops.collective import post_statements


@dataclass
class Executor:
    """A data-parallel program's step on the NumPy runner (float32, every value in its own array). The statements
    before the reductions run once per micro-batch, in the plan's order, each with its shard's feeds; a bucket's
    start packs it (its NumPy kernel) and hands it to the engine; then the waits take the engine's sums and the
    optimiser's statements run once."""

    graph: Graph
    post: frozenset[str] = field(init=False)
    drop_pre: dict[int, tuple[str, ...]] = field(init=False)

    def __post_init__(self) -> None:
        g = self.graph
        self.post = post_statements(g)
        read_by_post = {v.name for s in g.stmts if s.out.name in self.post for v in s.inputs}
        returned = {v.name for _, v in (*g.outputs, *g.updates)}
        keep = read_by_post | returned | {d.value.name for d in g.inputs} | {p.value.name for p in g.params}
        pre = [s for s in g.stmts if s.out.name not in self.post]
        last = last_reads(tuple(pre))
        drop: dict[int, list[str]] = {}
        for name, i in last.items():
            if name not in keep:
                drop.setdefault(i, []).append(name)
        self.drop_pre = {i: tuple(v) for i, v in drop.items()}

    def step(self, shards: Sequence[Mapping[str, np.ndarray]], params: Mapping[str, np.ndarray], comm: Comm,
             step: int = 0) -> RunResult:  # fmt: skip
        g = self.graph
        comm.begin_step(step)
        pre = [s for s in g.stmts if s.out.name not in self.post]
        env: dict[str, np.ndarray] = {}
        arrays = dict(params)
        for k, feeds in enumerate(shards):
            env = {}
            for d in g.inputs:
                floats = d.value.type.dtype.value == "f32"
                env[d.value.name] = np.asarray(feeds[d.value.name], dtype=np.float32 if floats else np.int64)
            for p in g.params:
                env[p.value.name] = np.asarray(param_value(p, arrays), np.float32)
            for i, s in enumerate(pre):
                out = execute(s, env)
                env[s.out.name] = out
                if s.op == "allreduce_start":
                    comm.start(s.a["bucket"], out, k, len(shards))
                elif s.op == "allreduce_wait":  # a batch norm's statistics (sync_batch_norm): blocking, in place
                    env[s.out.name] = comm.wait(s.a["bucket"])
                for name in self.drop_pre.get(i, ()):
                    env.pop(name, None)
        for s in g.stmts:
            if s.out.name not in self.post:
                continue
            if s.op == "allreduce_wait":
                reduced = comm.wait(s.a["bucket"])
                env[s.out.name] = reduced
            else:
                env[s.out.name] = execute(s, env)
        outputs = {name: np.array(env[v.name]) for name, v in g.outputs}
        updates = {name: np.array(env[v.name]) for name, v in g.updates}
        return RunResult(outputs, updates, 0, 0)
