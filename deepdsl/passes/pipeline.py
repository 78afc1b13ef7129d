"""The optimiser's one list of passes, in order, and the function that runs them.

Expression level first (simplify, fuse, vectorise work inside index expressions), then the SSA level
(cse, dce, motion, inplace on the statement list), as in DeepDSL. Each entry is (name, pass, the lowest
-O level that runs it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from deepdsl.ir import REGISTRY, Graph
from deepdsl.ir.groups import kernel_groups
from deepdsl.ir.launches import launch_groups
from deepdsl.ir.reductions import reduction_groups
from deepdsl.ir.verify import check_graph
from deepdsl.passes.cse import cse
from deepdsl.passes.data_parallel import Bucketing, data_parallel
from deepdsl.passes.dce import dce
from deepdsl.passes.fuse import fuse
from deepdsl.passes.inline import inline
from deepdsl.passes.inplace import inplace
from deepdsl.passes.motion import motion
from deepdsl.passes.multi_tensor import multi_tensor
from deepdsl.passes.precision import precision
from deepdsl.passes.simplify import simplify
from deepdsl.passes.vectorise import vectorise

Pass = Callable[[Graph], Graph]

PIPELINE: tuple[tuple[str, Pass, int], ...] = (
    # gradient buckets and their all-reduces (passes/data_parallel.py): run only when `run_pipeline` is given a
    # Bucketing (data-parallel training, micro-batches), first, while the optimiser's statements are their own
    ("data_parallel", data_parallel, 0),
    ("vectorise", vectorise, 2),
    ("simplify", simplify, 1),
    ("inline", inline, 2),
    ("fuse", fuse, 2),
    ("cse", cse, 1),
    ("dce", dce, 1),
    ("motion", motion, 2),
    ("multi_tensor", multi_tensor, 2),
    ("inplace", inplace, 2),
    # element types and casts from the ops' storage facts; the identity but under --precision bf16 (run_pipeline
    # gives it the setting), so at every -O level and never switched off
    ("precision", precision, 0),
)

# the passes --no-pass and --dump-after name: data_parallel runs only when asked; precision is no optimisation and
# cannot be switched off
PASS_NAMES = tuple(name for name, _, _ in PIPELINE if name not in ("data_parallel", "precision"))


@dataclass(frozen=True)
class PassStat:
    name: str
    statements: int
    kernels: int


def kernels(g: Graph) -> int:
    """Launches on a device: every statement except views (a fused statement is one kernel), adjacent element-wise
    statements that one loop computes (ir/groups.py) counted once, reductions one pass computes (ir/reductions.py)
    counted once (one launch, split over blocks or not: its last block finishes), and the optimiser's updates that
    one multi-tensor launch computes (ir/launches.py) counted once."""
    launches = launch_groups(reduction_groups(kernel_groups(g.stmts)))
    return sum(1 for launch in launches if not REGISTRY[launch[0][0].op].view)


def run_pipeline(
    g: Graph, level: int = 2, disabled: tuple[str, ...] = (), check: bool = False,
    dump_after: Callable[[str, Graph], None] | None = None, bucketing: Bucketing | None = None,
    precision: str = "fp32",
) -> tuple[Graph, tuple[PassStat, ...]]:  # fmt: skip
    """`g` through PIPELINE at -O `level` without the `disabled` passes; `precision` (ir/types.py PRECISIONS) is
    the setting the precision pass reads."""
    stats = []
    for name, fn, min_level in PIPELINE:
        if name == "data_parallel":
            if bucketing is None:
                continue
            g = data_parallel(g, bucketing)
        elif name == "precision":  # runs (and is reported) under bf16 only, where it is never switched off
            if precision != "bf16":
                continue
            g = fn(g, precision)  # type: ignore[call-arg]
        elif level < min_level or name in disabled:
            continue
        else:
            g = fn(g)
        if check:
            check_graph(g)
        stats.append(PassStat(name, len(g.stmts), kernels(g)))
        if dump_after:
            dump_after(name, g)
    return g, tuple(stats)
