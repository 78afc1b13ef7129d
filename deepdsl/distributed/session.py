"""A process's data-parallel run: its session (world, micro-batches, engine), the start-up agreement of the ranks
(a checksum of the plan and parameters) and the faults tests inject."""

from __future__ import annotations

import hashlib
import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from deepdsl.distributed.engines import Accumulate, Comm, MpiComm, load_mpi, srun_flag
from deepdsl.distributed.gpu import GpuComm
from deepdsl.distributed.world import DEFAULT_TIMEOUT, DistributedError, World
from deepdsl.ir import Graph
from deepdsl.ir.printer import format_graph


def checksum(g: Graph, params: Mapping[str, np.ndarray]) -> int:
    """A 63-bit digest of the program's text and every parameter's name, shape and bytes."""
    h = hashlib.sha256(format_graph(g).encode())
    for name in sorted(params):
        a = np.ascontiguousarray(params[name])
        h.update(f"{name}:{a.dtype}:{a.shape}".encode())
        h.update(a.tobytes())
    return int.from_bytes(h.digest()[:8], "big") >> 1


def startup_check(comm: MpiComm | GpuComm, g: Graph, params: Mapping[str, np.ndarray], what: str) -> list[int]:
    """Every rank's checksum of `g` and `params` compared; a DistributedError on every rank where any differs.
    Returns every rank's process id (for the launcher's messages, which name a dead process by its id). On the GPU
    the checksums travel through NCCL (GpuComm.allgather)."""
    mine = checksum(g, params)
    gathered = comm.allgather((mine, os.getpid()))
    every = [c for c, _ in gathered]
    if len(set(every)) > 1:
        odd = [r for r, c in enumerate(every) if c != every[0]]
        raise DistributedError(
            f"rank {comm.rank}: the ranks do not run the same training: the checksum of the plan and the {what} "
            f"of rank{'s' if len(odd) > 1 else ''} {', '.join(map(str, odd))} differs from rank 0's (the same "
            "network file, --set values, flags and --seed on every rank, and the same --load file)"
        )
    return [pid for _, pid in gathered]


def parse_fault(text: str | None) -> tuple[int, int, str] | None:
    """DEEPDSL_DP_FAULT=RANK:STEP:kill|stall (tests only): that rank kills itself or stalls at that step (1-based)."""
    if not text:
        return None
    parts = text.split(":")
    if len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit() or parts[2] not in ("kill", "stall"):
        raise DistributedError(f"DEEPDSL_DP_FAULT={text!r}: expected RANK:STEP:kill or RANK:STEP:stall")
    return int(parts[0]), int(parts[1]), parts[2]


def inject_fault(fault: tuple[int, int, str] | None, rank: int, step: int) -> None:
    """Carry out a test's fault at step `step` (1-based) on its rank."""
    if fault is None or fault[0] != rank or fault[1] != step:
        return
    if fault[2] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(10**6)


@dataclass
class Session:
    """One data-parallel run of this process: its world, micro-batches per rank, engine and executor."""

    world: World
    micro_batches: int
    comm: Comm
    timeout: float = DEFAULT_TIMEOUT
    fault: tuple[int, int, str] | None = None

    @property
    def rank(self) -> int:
        return self.world.rank

    @property
    def shards_per_step(self) -> int:
        return self.world.size * self.micro_batches

    def blocks(self, step: int) -> list[int]:
        """The global batch blocks this rank reads at step `step` (0-based): one per micro-batch."""
        w, m = self.world.size, self.micro_batches
        return [(step * w + self.world.rank) * m + k for k in range(m)]

    def offsets(self, batch: int) -> list[int]:
        """The first position, inside the step's global batch, of each of this rank's shards."""
        m = self.micro_batches
        return [(self.world.rank * m + k) * batch for k in range(m)]

    def abort(self) -> None:
        if isinstance(self.comm, (MpiComm, GpuComm)):
            self.comm.abort(1)

    def close(self) -> None:
        if isinstance(self.comm, (MpiComm, GpuComm)):
            self.comm.close()


def open_session(world: World, micro_batches: int, timeout: float = DEFAULT_TIMEOUT,
                 fault: str | None = None) -> Session:  # fmt: skip
    """The session of this process: Accumulate for one rank, MPI for more (its world checked against MPI's)."""
    if micro_batches < 1:
        raise DistributedError(f"--micro-batches must be at least 1, got {micro_batches}")
    parsed = parse_fault(fault)
    if world.size == 1:
        return Session(world, micro_batches, Accumulate(), timeout, parsed)
    mpi = load_mpi()
    comm = MpiComm(mpi, timeout)
    if comm.size != world.size or comm.rank != world.rank:
        raise DistributedError(
            f"rank {world.rank} of {world.size} by {world.source}, but MPI sees rank {comm.rank} of {comm.size}: "
            f"the NumPy runner's ranks talk over MPI, so start them with mpiexec / mpirun / {srun_flag(mpi)} "
            "(torchrun starts processes without MPI)"
        )
    return Session(world, micro_batches, comm, timeout, parsed)


def open_gpu_session(world: World, micro_batches: int, timeout: float = DEFAULT_TIMEOUT, fault: str | None = None,
                     report: Callable[[str], None] = lambda line: None, force: bool = False) -> Session:  # fmt: skip
    """The session of a rank on the PyCUDA runner (NCCL is connected when its GPU is open: GpuComm.connect; for one
    rank only where `force`d)."""
    if micro_batches < 1:
        raise DistributedError(f"--micro-batches must be at least 1, got {micro_batches}")
    comm = GpuComm(world, timeout, report, force)
    if world.size > 1 or force:
        comm.load()  # before anything waits for the other ranks
        if comm.rendezvous(os.environ) is None and world.size > 1:
            comm.start_mpi()
    return Session(world, micro_batches, comm, timeout, parse_fault(fault))
