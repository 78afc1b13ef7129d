"""The fixtures that several modules here share, each module scoped as before (built once for each module that uses
it): the stand-in NCCL for the emulated GPU (`work`), CollectiveCheck and the runtime compiled (`driver`, whose javac
runs once a run), MLP on the stand-in GPU (`program`), and the module's own Slurm cluster where its pmix plugin loads
(`pmix`, over the requesting module's `cluster`).

The fixtures import the helpers they share with the test modules (which hold them) when they run. What the test
modules share as plain names is in tests/helpers.py, never imported `from conftest`: each folder's conftest.py is
imported as the module `conftest`, so that name would be whichever pytest loaded last."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from slurm_cluster import Cluster

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = ROOT / "deepdsl" / "runtime"
DRIVER = Path(__file__).resolve().parent / "java" / "CollectiveCheck.java"


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stand-in NCCL in nccl/, the networks' files; each network's emulated kernels get a folder of their own."""
    from dp_nets import DROPOUT, RESIDUAL
    from test_gpu_data_parallel import HERE, MPICH, VENV

    folder = tmp_path_factory.mktemp("gpu_dp")
    (folder / "nccl").mkdir()
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-DFAKE_NCCL_MPICH", f"-I{VENV / 'include'}",
                    str(HERE / "fake_libnccl.c"), f"-L{MPICH.parent}", "-lmpi", f"-Wl,-rpath,{MPICH.parent}",
                    "-Wl,-soname,libnccl.so.2", "-o", str(folder / "nccl" / "libnccl.so.2"), "-ldl"],
                   check=True)  # fmt: skip
    (folder / "nonccl").mkdir()
    (folder / "res.ddsl").write_text(RESIDUAL)
    (folder / "drop.ddsl").write_text(DROPOUT)
    return folder


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """CollectiveCheck and the runtime, compiled: by one javac a run (built_once.py), copied into the module's
    folder (test_java_data_parallel's and test_java_openmpi's are the same classes)."""
    from built_once import in_folder, text_of
    from java_env import javac

    sources = [DRIVER, *sorted(RUNTIME.glob("*.java"))]
    folder = tmp_path_factory.mktemp("collective")
    in_folder(f"collective\0{text_of(*sources)}", folder, lambda into: javac(into, sources, into / "build"))
    return folder / "build"


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """MLP (N = 8) compiled with --data-parallel and --ptx into src/, built; its kernels for the CPU; the stand-in
    driver, CUDA 13 libraries and NCCL in fake/."""
    from test_java_nccl import _built

    return _built(tmp_path_factory.mktemp("java_nccl"), ROOT / "networks" / "mlp.ddsl", "MLP", "--set", "N=8")


@pytest.fixture(scope="module")
def pmix(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Cluster:
    """The cluster, where its pmix plugin loads (it opens Debian's libpmix.so, which only libpmix-dev installs)."""
    from java_env import launch_env
    from test_slurm import _run

    r = _run(["srun", "--mpi=pmix", "-n", "1", "true"], cluster.env(launch_env()), tmp_path_factory.mktemp("pmix"),
             timeout=60)  # fmt: skip
    if r.returncode != 0:
        reason = next((line for line in r.stderr.splitlines() if "pmix" in line.lower()), r.stderr.strip())
        pytest.skip(f"Slurm's pmix plugin does not load ({reason}): apt-get install libpmix-dev (.ci/run does)")
    return cluster
