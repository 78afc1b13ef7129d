"""What a `deepdsl run` on the NumPy runner will hold, checked against the memory the process may use before
anything of it is allocated: a batch of three billion samples is one clear line, not an OOM kill.

The runner holds every parameter, model and optimizer state tensor, the batch's inputs and the plan's arena;
a step writes its updates into fresh copies of the persistent tensors before they replace the old ones, so
those count twice. Each statement's kernel makes its result in a fresh array before it is copied into the arena
(an optimizer update one more temporary of that size, a kernel with a fused element-wise epilogue up to four
more): the most one statement's kernel holds (_EPILOGUE or _PLAIN times its result) counts on top. Before the
first step, the initialisers fill each parameter chunk by chunk, with float64 scratch of one chunk
(initializers.init_scratch_bytes); the larger of the two transients counts. In float64 (no arena)
every tensor is twice as large and the live values take the arena's place.

What the process may use is the least of: the machine's MemAvailable, what the address-space and data-segment
limits (ulimit -v, ulimit -d: RLIMIT_AS, RLIMIT_DATA) leave above what the process already maps, and what its
cgroup's memory limit leaves above the cgroup's use (v2 memory.max - memory.current, v1 memory.limit_in_bytes -
memory.usage_in_bytes, at every level up to the root).
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass

from deepdsl.errors import DslProgramError
from deepdsl.initializers import init_scratch_bytes
from deepdsl.ir import REGISTRY
from deepdsl.memory.plan import Plan

# What a statement's NumPy kernel holds beside the arena, in multiples of its result (measured with tracemalloc on
# networks/mlp.ddsl, lenet.ddsl and a 134M-parameter full layer, 2026-12): a kernel with a fused element-wise
# epilogue up to 4.5 (the primary result, then the epilogue's own temporaries), an optimizer update 2.0, any other
# at most 1.4.
_EPILOGUE = 5
_PLAIN = 2


@dataclass(frozen=True)
class Footprint:
    persistent: int  # parameters, model and optimizer state, the batch's inputs
    copies: int  # the updated copies of the parameters and state a step makes
    arena: int  # the plan's arena (float64, which runs without one: its live values, twice the float32 arena)
    temporaries: int = 0  # the most a kernel (twice its result) or the initialisers' scratch hold beside them

    @property
    def total(self) -> int:
        return self.persistent + self.copies + self.arena + self.temporaries


def footprint(p: Plan, itemsize: int = 4) -> Footprint:
    """The bytes a run of the training program planned as `p` holds at its peak, in floats of `itemsize` bytes."""
    g = p.graph
    scale = max(1, itemsize // 4)
    inputs = sum(d.value.type.nbytes for d in g.inputs)
    params = sum(q.value.type.nbytes for q in g.params)
    kernel = max((s.out.type.nbytes * (_EPILOGUE if "epilogue" in s.a else _PLAIN) for s in g.stmts
                  if not REGISTRY[s.op].view), default=0)  # fmt: skip
    largest = max((q.value.type.numel for q in g.params), default=0)
    init = init_scratch_bytes(largest)  # (float64 scratch whatever the type: counted twice in float64, to spare)
    return Footprint((params + inputs) * scale, params * scale, p.arena_bytes * scale, max(kernel, init) * scale)


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as f:
            return f.read()
    except (OSError, ValueError):
        return None


def _number(text: str | None) -> int | None:
    try:
        return int(text.strip()) if text is not None else None
    except ValueError:
        return None  # "max", or not a number


_NO_LIMIT = 2**60  # cgroup v1 writes "no limit" as a page-rounded 2^63 - 1


def _cgroup_limits(proc: str, cgroup: str) -> dict[str, int]:
    """What the cgroup limits leave: the least, at the process's cgroup and each one above it, of limit - use."""
    out: dict[str, int] = {}
    for line in (_read(os.path.join(proc, "self", "cgroup")) or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":  # v2: the unified hierarchy, mounted at the root or at unified/ (hybrid)
            base = (
                cgroup
                if os.path.exists(os.path.join(cgroup, "cgroup.controllers"))
                else os.path.join(cgroup, "unified")
            )
            files, name = ("memory.max", "memory.current"), "the cgroup's memory.max"
        elif "memory" in controllers.split(","):
            base, files, name = os.path.join(cgroup, "memory"), ("memory.limit_in_bytes", "memory.usage_in_bytes"), \
                "the cgroup's memory.limit_in_bytes"  # fmt: skip
        else:
            continue
        folder = os.path.normpath(os.path.join(base, path.lstrip("/")))
        while True:
            limit, used = (_number(_read(os.path.join(folder, f))) for f in files)
            if limit is not None and limit < _NO_LIMIT:
                left = max(0, limit - (used or 0))
                out[name] = min(out.get(name, left), left)
            if folder == os.path.normpath(base) or not folder.startswith(os.path.normpath(base)):
                break
            folder = os.path.dirname(folder)
    return out


def memory_limits(proc: str = "/proc", cgroup: str = "/sys/fs/cgroup") -> dict[str, int]:
    """The bytes each known limit leaves this process for new allocations (module docstring), by the limit's name;
    `proc` and `cgroup` are where /proc and the cgroup file system are (a test gives fake ones)."""
    out: dict[str, int] = {}
    meminfo = _read(os.path.join(proc, "meminfo")) or ""
    for line in meminfo.splitlines():
        if line.startswith("MemAvailable:"):
            kib = _number(line.split()[1] if len(line.split()) > 1 else None)
            if kib is not None:
                out["MemAvailable"] = kib * 1024
    if "MemAvailable" not in out:
        try:
            out["MemAvailable"] = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            pass
    status = _read(os.path.join(proc, "self", "status")) or ""
    mapped = {line.split(":")[0]: line.split()[1:2] for line in status.splitlines() if ":" in line}
    for rlimit, field, name in ((resource.RLIMIT_AS, "VmSize", "the address-space limit (ulimit -v)"),
                                (resource.RLIMIT_DATA, "VmData", "the data-segment limit (ulimit -d)")):  # fmt: skip
        soft = resource.getrlimit(rlimit)[0]
        if soft != resource.RLIM_INFINITY:
            used = _number(mapped.get(field, [None])[0] if mapped.get(field) else None)
            out[name] = max(0, soft - (used or 0) * 1024)
    out.update(_cgroup_limits(proc, cgroup))
    return out


def available_memory() -> int | None:
    """The bytes this process can allocate without swapping or being refused: the least of `memory_limits()`;
    None: unknown."""
    limits = memory_limits()
    return min(limits.values()) if limits else None


def _gib(n: int) -> str:
    return f"{n / 2**30:,.2f} GiB"


def check_fits(f: Footprint, available: int | None, limits: dict[str, int] | None = None) -> None:
    """A user error, in one line with the numbers, when the run needs more than the memory available (`limits`:
    `memory_limits()`, to name the one that leaves `available`)."""
    if available is None or f.total <= available:
        return
    which = next((name for name, n in (limits or {}).items() if n == available), None)
    raise DslProgramError(
        f"this run needs at least {_gib(f.total)} of memory (parameters, state and inputs {_gib(f.persistent)}, "
        f"their updated copies {_gib(f.copies)}, arena {_gib(f.arena)}, kernel temporaries {_gib(f.temporaries)}) "
        f"but {_gib(available)} is available{f' ({which})' if which else ''}; try a smaller batch (--set N=...)"
    )
