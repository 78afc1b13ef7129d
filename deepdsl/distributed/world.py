"""Who this process is in a data-parallel run: rank, world size and local rank from the flags or the launcher's
environment (torchrun, Open MPI, MPICH / PMI, Slurm), and the error every part of a data-parallel run raises."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from deepdsl.errors import DslProgramError

DEFAULT_TIMEOUT = 300.0  # seconds a rank waits for a bucket's reduction before it names the others and stops


class DistributedError(DslProgramError):
    """A data-parallel run cannot go on: a launcher environment that does not add up, a missing MPI, ranks that
    differ, a rank that died or stalled. `abort` says the other ranks must be stopped (MPI_Abort)."""

    def __init__(self, message: str, abort: bool = False) -> None:
        super().__init__(message)
        self.abort = abort


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
