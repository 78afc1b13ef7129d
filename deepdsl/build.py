"""What the driver (`api.build`) hands on: one network compiled for training and inference, and the options it was
compiled with.

A `Build` is made once and read by every consumer: the trainer runs its programs, the CLI reports its plan
(`memcheck`) and gives its plans to the backends (`backends.java`, `backends.cuda`), which take plans and never
call back into the driver. The module holds data only, so that the trainer can name the type without importing
the driver that sits above it (the layers are in `.importlinter`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from deepdsl.config import from_env
from deepdsl.frontend.program import Program
from deepdsl.ir import Graph
from deepdsl.memory import Plan
from deepdsl.passes import PassStat
from deepdsl.passes.data_parallel import Bucketing


@dataclass(frozen=True)
class Options:
    """How to optimise: the -O level, passes switched off, and a callback after each pass."""

    level: int = 2
    disabled: tuple[str, ...] = ()
    # check the graph after every pass and rematerialisation (ir/verify.py) and every plan (memory/check.py);
    # default: DEEPDSL_VERIFY (the test suite sets it)
    verify: bool = field(default_factory=lambda: from_env().verify)
    dump_after: Callable[[str, Graph], None] | None = None
    remat: str | None = None  # none, cheap or full; None: none, or with a budget the least that fits
    workspace_limit: int | None = None  # the most scratch one statement's kernel may take (None: any)
    # on the GPU: cuDNN's heuristic, deterministic convolution algorithms instead of the fastest found by timing
    deterministic: bool = False
    # data-parallel training or gradient accumulation (passes/data_parallel.py): the gradient buckets' sizes; None:
    # the plain training program
    buckets: Bucketing | None = None
    precision: str | None = None  # fp32, tf32 or bf16 (--precision); None: the train block's
    # data-parallel training: batch-norm statistics over the global batch (--sync-batch-norm; the data-parallel
    # pass's Bucketing.sync_batch_norm); None: the train block's `sync_batch_norm`
    sync_batch_norm: bool | None = None


@dataclass(frozen=True)
class Build:
    """A network's training program (forward + backward + update) and inference program, optimised and planned."""

    program: Program  # what the front end made: the forward graph, its layers, the train block
    options: Options
    seed: int  # the training program's seed (dropout masks) and the parameters' (the train block's unless overridden)
    train: Graph  # the optimised training program, before rematerialisation
    passes: tuple[PassStat, ...]  # statements and kernels after each optimiser pass over it
    train_plan: Plan  # the plan of `train` rematerialised at level `remat`
    infer: Graph | None  # the optimised inference program; None where the network has no `predict`
    infer_plan: Plan | None
    remat: str = "none"
    extra_flops: int = 0  # what rematerialisation recomputes in one step
    eval: Graph | None = None  # the optimised test program: `loss` (and `predict`) in inference semantics
    eval_plan: Plan | None = None
    precision: str = "fp32"  # what the programs were compiled for: --precision, else the train block's

    @property
    def tf32(self) -> bool:
        """Whether the vendor GEMMs and convolutions may use TF32 tensor-op math (tf32; bf16's fp32 ones too)."""
        return self.precision in ("tf32", "bf16")
