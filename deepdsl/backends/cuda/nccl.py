"""NCCL through ctypes, as the GPU runner reaches cuBLAS and cuDNN (vendor.py): the sum all-reduces of a
data-parallel step (passes/data_parallel.py) on the runner's GPU, across the ranks of a run.

Only NCCL's core API is called (ncclGetVersion, ncclGetErrorString, ncclGetUniqueId, ncclCommInitRank,
ncclAllReduce, ncclCommGetAsyncError, ncclCommAbort, ncclCommDestroy); the library must be 2.19 or later (the
version the Java CUDA device asks for too). It is found where the vendor libraries are: LD_LIBRARY_PATH, pip's
`nvidia/*/lib` folders (nvidia-nccl-cu13, nvidia-nccl-cu12, PyTorch's copy), the CUDA toolkit, the loader's own
search.

`NcclReducer` is the GPU runner's reducer: a bucket's all-reduce (in place, float32, `ncclSum`: never `ncclAvg`,
which pre-multiplies and so breaks two ranks' bitwise equality with two micro-batches) is issued on the driver's
collective stream where it has one (after an event on the compute stream, which later waits for the all-reduce's
own event: communication overlaps the rest of the backward pass), else on its stream; either way the calls are
captured into the train step's CUDA graph with the rest. A watchdog thread polls ncclCommGetAsyncError while a
step runs and measures the step against the timeout; either failing aborts the communicator (ncclCommAbort) and
ends the process (exit 1) after the caller's `report` said why: a rank that died or stalled stops the others.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from deepdsl.backends.cuda.vendor import candidates
from deepdsl.errors import DslProgramError

NCCL_SONAMES = ("libnccl.so.2",)
OLDEST = 21900  # ncclGetVersion's code of NCCL 2.19
INSTALL = ("NCCL 2.19 or later (libnccl.so.2): pip install nvidia-nccl-cu13 (CUDA 13; nvidia-nccl-cu12 for CUDA 12), "
           "or PyTorch's copy, on LD_LIBRARY_PATH")  # fmt: skip
UNIQUE_ID_BYTES = 128
FLOAT32, INT64 = 7, 4  # ncclDataType_t
SUM = 0  # ncclRedOp_t
EXIT_FAILED = 1  # the CLI's exit code of a user-facing error


class NcclError(DslProgramError):
    """NCCL is missing, too old, or refused a call."""


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * UNIQUE_ID_BYTES)]


def _version_text(code: int) -> str:
    if code >= 10000:
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}"


class Nccl:
    """The loaded library: its path and version; `unique_id` and `communicator`."""

    def __init__(self, lib: ctypes.CDLL, path: str):
        self.lib, self.path = lib, path
        p, i = ctypes.c_void_p, ctypes.c_int
        lib.ncclGetErrorString.restype = ctypes.c_char_p
        lib.ncclGetErrorString.argtypes = [i]
        lib.ncclGetVersion.argtypes = [ctypes.POINTER(i)]
        lib.ncclGetUniqueId.argtypes = [ctypes.POINTER(UniqueId)]
        lib.ncclCommInitRank.argtypes = [ctypes.POINTER(p), i, UniqueId, i]
        lib.ncclAllReduce.argtypes = [p, p, ctypes.c_size_t, i, i, p, p]
        lib.ncclCommGetAsyncError.argtypes = [p, ctypes.POINTER(i)]
        lib.ncclCommAbort.argtypes = [p]
        lib.ncclCommDestroy.argtypes = [p]
        code = i()
        self.check(lib.ncclGetVersion(ctypes.byref(code)), "ncclGetVersion")
        self.code = code.value
        self.version = _version_text(code.value)

    def error(self, status: int) -> str:
        text = self.lib.ncclGetErrorString(status)
        return f"NCCL error {status}: {text.decode(errors='replace') if text else 'unknown'}"

    def check(self, status: int, call: str) -> None:
        if status != 0:
            raise NcclError(f"{call} failed ({self.error(status)})")

    @property
    def description(self) -> str:
        return f"NCCL {self.version} ({Path(self.path).name})"

    def unique_id(self) -> bytes:
        """A new id (NCCL_COMM_ID set: the same on every rank, the address of its rendezvous)."""
        uid = UniqueId()
        self.check(self.lib.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
        return ctypes.string_at(ctypes.addressof(uid), UNIQUE_ID_BYTES)

    def communicator(self, size: int, rank: int, uid: bytes) -> ctypes.c_void_p:
        """This rank's communicator of `size` ranks that share the id `uid` (blocks until every rank joined)."""
        if len(uid) != UNIQUE_ID_BYTES:
            raise NcclError(f"an NCCL id has {UNIQUE_ID_BYTES} bytes, not {len(uid)}")
        value = UniqueId()
        ctypes.memmove(ctypes.addressof(value), uid, UNIQUE_ID_BYTES)
        comm = ctypes.c_void_p()
        self.check(self.lib.ncclCommInitRank(ctypes.byref(comm), size, value, rank), "ncclCommInitRank")
        return comm


def load_nccl(folders: list[Path] | None = None) -> Nccl:
    """NCCL from the vendor libraries' places (or `folders` alone), at least 2.19; a NcclError naming what to install
    where it does not load or is older."""
    failures = []
    for path in candidates(NCCL_SONAMES, folders):
        try:
            lib = ctypes.CDLL(path)
        except OSError as err:
            failures.append(str(err).split(":")[-1].strip() or path)
            continue
        try:
            nccl = Nccl(lib, path)
        except AttributeError as err:  # not NCCL's entry points
            failures.append(f"{path}: {err}")
            continue
        if nccl.code < OLDEST:
            raise NcclError(f"NCCL {nccl.version} ({path}) is older than 2.19, which data-parallel training on the "
                            f"GPU needs: {INSTALL}")  # fmt: skip
        return nccl
    why = "; ".join(dict.fromkeys(failures)) or "libnccl.so.2 not found"
    raise NcclError(f"data-parallel training on the GPU needs {INSTALL}; NCCL does not load ({why})")


class Streams(Protocol):
    """Where a reducer issues its all-reduces (runner.py: the driver's collective stream, or its one stream)."""

    handle: int  # the stream NCCL's calls go to

    def fork(self, bucket: int) -> None: ...  # before bucket's all-reduce: it waits for the compute stream's work
    def done(self, bucket: int) -> None: ...  # after it is issued: its end marked
    def join(self, bucket: int) -> None: ...  # the compute stream's later work waits for that end


class Memory(Protocol):
    """What the start-up check needs of the GPU (the runner's driver)."""

    def alloc(self, nbytes: int) -> int: ...
    def free(self, ptr: int) -> None: ...
    def upload(self, ptr: int, array: np.ndarray) -> None: ...
    def download(self, ptr: int, array: np.ndarray) -> None: ...


class NcclReducer:
    """The all-reduces of one rank's data-parallel steps on its GPU: `start` a bucket's in-place sum, `wait` for it
    (on the streams, never blocking the host); `begin_step`/`end_step` bracket a step for the watchdog; `gather`
    gives every rank's integers (the start-up check)."""

    def __init__(self, nccl: Nccl, comm: ctypes.c_void_p, rank: int, size: int, streams: Streams,
                 timeout: float, report: Callable[[str], None], rendezvous: str) -> None:  # fmt: skip
        self.nccl, self.comm, self.rank, self.size = nccl, comm, rank, size
        self.streams, self.timeout, self.report = streams, timeout, report
        self.rendezvous = rendezvous
        self.step_started = 0.0  # time.monotonic() of the running step, 0 between steps
        self.failure: str | None = None
        self.closed = False
        self.reductions = 0  # all-reduces issued (a captured one counts once)
        self._watchdog: threading.Thread | None = None

    @property
    def description(self) -> str:
        return f"{self.nccl.description}, {self.size} ranks, rendezvous {self.rendezvous}"

    def _all_reduce(self, ptr: int, count: int, dtype: int, what: str) -> None:
        status = self.nccl.lib.ncclAllReduce(ptr, ptr, count, dtype, SUM, self.comm, self.streams.handle)
        if status != 0:
            raise NcclError(f"rank {self.rank}: ncclAllReduce of {what} failed ({self.nccl.error(status)})")
        self.reductions += 1

    def start(self, bucket: int, ptr: int, count: int) -> None:
        """The in-place sum over the ranks of the `count` floats at `ptr`, after the work issued so far."""
        self.streams.fork(bucket)
        self._all_reduce(ptr, count, FLOAT32, f"bucket {bucket}")
        self.streams.done(bucket)

    def wait(self, bucket: int) -> None:
        """The work issued from now on waits for bucket's sum."""
        self.streams.join(bucket)

    def gather(self, memory: Memory, values: tuple[int, ...]) -> list[tuple[int, ...]]:
        """Every rank's `values` (non-negative int64s), by rank: a sum all-reduce of a table in which each rank
        fills its own row (the others' rows zero, so the sum is exact)."""
        width = len(values)
        table = np.zeros((self.size, width), np.int64)
        table[self.rank] = values
        ptr = memory.alloc(table.nbytes)
        try:
            memory.upload(ptr, table)
            self.streams.fork(-1)
            self._all_reduce(ptr, table.size, INT64, "the start-up check")
            self.streams.done(-1)
            self.streams.join(-1)
            memory.download(ptr, table)  # synchronous: after the all-reduce
        finally:
            memory.free(ptr)
        return [tuple(int(x) for x in row) for row in table]

    def begin_step(self) -> None:
        if self._watchdog is None:
            self._watchdog = threading.Thread(target=self._watch, name="deepdsl-nccl-watchdog", daemon=True)
            self._watchdog.start()
        self.step_started = time.monotonic()

    def end_step(self) -> None:
        self.step_started = 0.0

    def _watch(self) -> None:
        """While a step runs: NCCL's asynchronous error every 50 ms, and the step's time against the timeout; either
        aborts the communicator (which ends the collectives the step waits on) and halts with the reason."""
        error = ctypes.c_int()
        while not self.closed:
            started = self.step_started
            if started:
                why = None
                status = self.nccl.lib.ncclCommGetAsyncError(self.comm, ctypes.byref(error))
                if status == 0 and error.value != 0:
                    why = f"NCCL reported {self.nccl.error(error.value)} (a rank died or the network failed)"
                elif time.monotonic() - started > self.timeout:
                    why = (f"a step waited {self.timeout:g} s for the other ranks, which died or stalled "
                           "(DEEPDSL_DP_TIMEOUT)")  # fmt: skip
                if why is not None and not self.closed:
                    self.failure = f"rank {self.rank}: {why}; the communicator was aborted"
                    self.report(self.failure)
                    self.abort()
                    os._exit(EXIT_FAILED)  # the step's thread may be blocked in the driver for good
            time.sleep(0.05)

    def abort(self) -> None:
        """End the communicator now (the others' collectives then fail rather than wait)."""
        if self.comm:
            self.closed = True
            comm, self.comm = self.comm, ctypes.c_void_p()
            self.nccl.lib.ncclCommAbort(comm)

    def close(self) -> None:
        """Destroy the communicator (after the steps' work is done); a second close does nothing."""
        self.closed = True
        if self.comm:
            comm, self.comm = self.comm, ctypes.c_void_p()
            self.nccl.lib.ncclCommDestroy(comm)


class Deadline:
    """A watchdog for a blocking call that has no timeout of its own (the ranks' rendezvous, ncclCommInitRank):
    where the block is not left within `seconds`, `report` says why and the process ends (exit 1)."""

    def __init__(self, seconds: float, report: Callable[[str], None], what: str) -> None:
        self.seconds, self.report, self.what = seconds, report, what
        self.left = threading.Event()

    def __enter__(self) -> Deadline:
        threading.Thread(target=self._watch, name="deepdsl-nccl-deadline", daemon=True).start()
        return self

    def _watch(self) -> None:
        if not self.left.wait(self.seconds):
            self.report(f"{self.what} did not finish within {self.seconds:g} s (DEEPDSL_DP_TIMEOUT): another rank "
                        "did not start, died or stalled")  # fmt: skip
            os._exit(EXIT_FAILED)

    def __exit__(self, *exc: object) -> None:
        self.left.set()


def exchange_id(nccl: Nccl, rank: int, comm_id: str | None, broadcast: Callable[[bytes | None], bytes] | None,
                environ: Any) -> tuple[bytes, str]:  # fmt: skip
    """The id every rank's communicator is made from, and how it was agreed: NCCL's own rendezvous at
    `comm_id` (host:port, set as NCCL_COMM_ID where the environment names none: every rank makes the same id,
    rank 0 listens there), else rank 0's id through `broadcast` (MPI: given rank 0's id, returns it on every
    rank)."""
    if comm_id is not None:
        if environ.get("NCCL_COMM_ID") != comm_id:
            environ["NCCL_COMM_ID"] = comm_id
        return nccl.unique_id(), f"NCCL_COMM_ID={comm_id}"
    if broadcast is None:
        raise NcclError("NCCL's ranks need a rendezvous: MASTER_ADDR and MASTER_PORT (torchrun, or exported "
                        "under srun), NCCL_COMM_ID=host:port, or an MPI launch (mpiexec, with mpi4py) to share "
                        "the id")  # fmt: skip
    return broadcast(nccl.unique_id() if rank == 0 else None), "the id broadcast through MPI"


__all__ = ["INSTALL", "Deadline", "Nccl", "NcclError", "NcclReducer", "exchange_id", "load_nccl"]
