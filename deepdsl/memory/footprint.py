"""What a `deepdsl run` on the NumPy runner will hold, checked against the machine's available memory before
anything of it is allocated: a batch of three billion samples is one clear line, not an OOM kill.

The runner holds every parameter, model and optimizer state tensor, the batch's inputs and the plan's arena;
a step writes its updates into fresh copies of the persistent tensors before they replace the old ones, so
those count twice. In float64 (no arena) every tensor is twice as large and the live values take the arena's
place. The estimate is a floor: NumPy's temporaries inside a kernel come on top.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from deepdsl.errors import DslProgramError
from deepdsl.memory.plan import Plan


@dataclass(frozen=True)
class Footprint:
    persistent: int  # parameters, model and optimizer state, the batch's inputs
    copies: int  # the updated copies of the parameters and state a step makes
    arena: int  # the plan's arena (float64, which runs without one: its live values, twice the float32 arena)

    @property
    def total(self) -> int:
        return self.persistent + self.copies + self.arena


def footprint(p: Plan, itemsize: int = 4) -> Footprint:
    """The bytes a run of the training program planned as `p` holds at its peak, in floats of `itemsize` bytes."""
    g = p.graph
    scale = max(1, itemsize // 4)
    inputs = sum(d.value.type.nbytes for d in g.inputs)
    params = sum(q.value.type.nbytes for q in g.params)
    return Footprint((params + inputs) * scale, params * scale, p.arena_bytes * scale)


def available_memory() -> int | None:
    """The bytes the machine can give a new allocation without swapping (Linux: MemAvailable); None: unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _gib(n: int) -> str:
    return f"{n / 2**30:,.2f} GiB"


def check_fits(f: Footprint, available: int | None) -> None:
    """A user error, in one line with the numbers, when the run needs more than the memory available."""
    if available is None or f.total <= available:
        return
    raise DslProgramError(
        f"this run needs at least {_gib(f.total)} of memory (parameters, state and inputs {_gib(f.persistent)}, "
        f"their updated copies {_gib(f.copies)}, arena {_gib(f.arena)}) but {_gib(available)} is available; "
        "try a smaller batch (--set N=...)"
    )
