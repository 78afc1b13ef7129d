"""A rank's reductions on the PyCUDA runner's GPU: NCCL's all-reduces (backends/cuda/nccl.py), its rendezvous
through MASTER_ADDR / NCCL_COMM_ID or rank 0's id over MPI."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

from deepdsl.backends.cuda.drivers import reducer_streams
from deepdsl.backends.cuda.nccl import Deadline, Nccl, NcclError, NcclReducer, exchange_id, load_nccl
from deepdsl.distributed.engines import Comm, load_mpi
from deepdsl.distributed.world import DistributedError, World


class GpuComm(Comm):
    """A rank's reductions on its GPU (the PyCUDA runner): NCCL's all-reduces on the GPU runner's streams
    (backends/cuda/nccl.py), connected once the GPU is open (`connect`); one rank has none (its micro-batches are
    summed on the GPU). `report` says why the watchdog stops the run (a rank that died or stalled) before it ends
    the process. `force` (DEEPDSL_DP_FORCE=1): one rank connects NCCL all the same (a one-rank communicator)."""

    def __init__(self, world: World, timeout: float, report: Callable[[str], None], force: bool = False) -> None:
        self.world, self.force = world, force
        self.rank, self.size = world.rank, world.size
        self.timeout, self.report = timeout, report
        self.reducer: NcclReducer | None = None
        self.memory: Any = None  # the driver: device memory for the start-up check
        self.mpi: Any = None  # mpi4py's MPI, where NCCL's id goes through it
        self.nccl: Nccl | None = None

    def connect(self, driver: Any, environ: MutableMapping[str, str] | None = None) -> NcclReducer | None:
        """NCCL's communicator of this rank on `driver`'s GPU (None for one rank): the library loaded, the id agreed
        (NCCL_COMM_ID, or MASTER_ADDR:(MASTER_PORT + 1) set as it, else rank 0's through MPI; a forced one rank's
        own), the ranks joined."""
        if self.size == 1 and not self.force:
            return None
        environ = os.environ if environ is None else environ
        nccl = self.nccl if self.nccl is not None else self.load()
        comm_id = self.rendezvous(environ)
        at = f" (NCCL_COMM_ID={comm_id})" if comm_id is not None else ""
        try:
            broadcast = None
            if comm_id is None and self.size == 1:  # a forced one rank: its own id is everyone's
                broadcast = lambda raw: raw  # noqa: E731
            elif comm_id is None:
                world = self.mpi.COMM_WORLD
                broadcast = lambda raw: world.bcast(raw, root=0)  # noqa: E731
            # NCCL's rendezvous blocks until every rank is there: a rank that never comes ends the run
            with Deadline(self.timeout, self.report, f"rank {self.rank}: NCCL's rendezvous{at}"):
                uid, how = exchange_id(nccl, self.rank, comm_id, broadcast, environ)
                comm = nccl.communicator(self.size, self.rank, uid)
        except NcclError as err:
            where = f" at NCCL's rendezvous{at}: did every rank start, and can they reach it?" if at else ""
            raise DistributedError(f"rank {self.rank}: {err.message}{where}", abort=True) from None
        self.reducer = NcclReducer(nccl, comm, self.rank, self.size, reducer_streams(driver), self.timeout,
                                   self.report, how)  # fmt: skip
        self.memory = driver
        return self.reducer

    def load(self) -> Nccl:
        """NCCL, loaded (a DistributedError naming what to install where it is missing or too old)."""
        try:
            self.nccl = load_nccl()
        except NcclError as err:
            raise DistributedError(f"rank {self.rank}: {err.message}") from None
        return self.nccl

    def rendezvous(self, environ: Mapping[str, str]) -> str | None:
        """NCCL's rendezvous address: NCCL_COMM_ID, else MASTER_ADDR:(MASTER_PORT + 1); None: the id goes through
        MPI."""
        return environ.get("NCCL_COMM_ID") or self.world.nccl_comm_id

    def start_mpi(self) -> None:
        """An MPI launch without a rendezvous address (mpiexec): MPI started now, before the GPU is opened (MPI's
        start waits for every rank, holding the interpreter: no watchdog could end it; a rank that fails after it
        stops the others through MPI_Abort), its world checked against the launcher's."""
        self.mpi = load_mpi()
        world = self.mpi.COMM_WORLD
        if world.Get_size() != self.size or world.Get_rank() != self.rank:
            raise DistributedError(
                f"rank {self.rank} of {self.size} by {self.world.source}, but MPI sees rank {world.Get_rank()} of "
                f"{world.Get_size()}: without MPI, give NCCL its rendezvous with MASTER_ADDR and MASTER_PORT (or "
                "NCCL_COMM_ID)"
            )  # fmt: skip

    def allgather(self, value: tuple[int, int]) -> list[tuple[int, ...]]:
        assert self.reducer is not None
        return self.reducer.gather(self.memory, value)

    def abort(self, code: int = 1) -> None:
        if self.reducer is not None:
            self.reducer.abort()
        elif self.mpi is not None:  # before NCCL: the others wait in MPI or NCCL's rendezvous
            self.mpi.COMM_WORLD.Abort(code)

    def close(self) -> None:
        if self.reducer is not None:
            self.reducer.close()
