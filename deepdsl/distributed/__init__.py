"""Data-parallel training: who this process is (the launcher's environment), how a step runs the data-parallel
program (passes/data_parallel.py) over MPI, NCCL or micro-batches, and how a run fails loudly.

- world.py: `world_from_env(env, ...)`: rank, world size and local rank from flags first, then torchrun / Kubeflow
  (RANK, WORLD_SIZE, LOCAL_RANK), Open MPI (OMPI_COMM_WORLD_*), MPICH / Intel MPI / PMI (PMI_RANK, PMI_SIZE,
  MPI_LOCALRANKID), Slurm (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID); MASTER_ADDR / MASTER_PORT kept for NCCL.
- engines.py: `Accumulate`: one process, M micro-batches: each bucket summed over the micro-batches in order
  (gradient accumulation). `MpiComm`: W ranks through mpi4py: `MPI_Iallreduce(SUM)` per bucket when its start
  runs, a wait that polls it against a deadline and names the ranks that did not get there (each start sends the
  others a small heartbeat), then `MPI_Abort`s rather than hang.
- gpu.py: `GpuComm`: the PyCUDA runner's ranks, NCCL's all-reduces on the GPU.
- executor.py: `Executor.step(shards, params, comm)`: one step of a data-parallel program on the NumPy runner: the
  statements before the reductions once per micro-batch (its shard's feeds), the reductions, the optimiser's
  statements once.
- session.py: a process's `Session` (`open_session`, `open_gpu_session`), and `startup_check`: every rank's
  checksum of the plan and the initial parameters, compared: ranks built from other sources or seeds are refused
  before the first step.

The property this gives (tests/test_distributed.py): W ranks with batch N each end with the parameters that one
process gets from W micro-batches of N, bit for bit for W = 2 (a + b = b + a), and those of one process with the
batch W·N within rounding.
"""

from deepdsl.distributed.engines import Accumulate, Comm, MpiComm, load_mpi, srun_flag
from deepdsl.distributed.executor import Executor
from deepdsl.distributed.gpu import GpuComm
from deepdsl.distributed.session import (
    Session,
    checksum,
    inject_fault,
    open_gpu_session,
    open_session,
    parse_fault,
    startup_check,
)
from deepdsl.distributed.world import DEFAULT_TIMEOUT, DistributedError, World, world_from_env

__all__ = [
    "DEFAULT_TIMEOUT",
    "Accumulate",
    "Comm",
    "DistributedError",
    "Executor",
    "GpuComm",
    "MpiComm",
    "Session",
    "World",
    "checksum",
    "inject_fault",
    "load_mpi",
    "open_gpu_session",
    "open_session",
    "parse_fault",
    "srun_flag",
    "startup_check",
    "world_from_env",
]
