"""`srun` across nodes (issue 32): a two-node Slurm cluster emulated on this machine (slurm_cluster.py's `nodes=2`:
one slurmd per node, Slurm's "multiple slurmd" mode), so that `srun -N 2 -n 4` places ranks 0, 1 on node1 and 2, 3
on node2, SLURM_LOCALID restarting at 0 on each node, as on a two-node cluster. What this checks:

- each rank's place as deepdsl reads it (the NumPy runner's `world_from_env`, the Java program's `Launch`): rank,
  size and the local rank (the GPU a rank takes) 0, 1, 0, 1 under `srun -N 2 -n 4`, with and without
  `--mpi=pmi2`. Slurm's pmi2 plugin sets PMI_RANK and PMI_SIZE but no local rank (MPICH's own launcher sets
  MPI_LOCALRANKID): these tests found the local rank read as 0 on every rank (Python) and as the global rank
  (Java) there, so the local rank is taken from SLURM_LOCALID where Slurm's rank and size agree with PMI's;
- the NumPy runner and the Java CPU device under `srun --mpi=pmix` (Open MPI 5.0.11) across the two nodes: two
  ranks, one per node, equal one process of two micro-batches bit for bit; four ranks, two per node, equal four
  micro-batches within rounding (an all-reduce of four sums in its own order). MPICH's ranks are not trained
  across nodes here: see PMI1_CUT;
- the same under Open MPI's `mpirun` inside an allocation (`salloc -N 2 -n 4 mpirun -np 4 ...`: its daemons
  started on the nodes through srun), under 5.0.11 and 4.1.8, and under MPICH's `mpiexec` there (Hydra's proxies
  through srun, its own PMI);
- the GPU devices' launch across the nodes, `srun -N 2 -n 2` with MASTER_ADDR (the first node's name) and
  MASTER_PORT exported, as a batch script does: the Java CUDA device (the stand-in driver) and the PyCUDA runner
  (the emulated GPU) meet at NCCL's rendezvous on node1 through the stand-in NCCL's TCP transport and equal one
  process of two micro-batches bit for bit.

Each test runs twice: with the nodes on this machine's network and host name (`one-host`), and with each node a
host of its own (`two-hosts`: slurm_cluster.py's `hosts`, a network namespace and host name per node and a bridge
between them), where the tasks see their node's name as the host name and the gradients' sums are checked to cross
the bridge. The nodes still share this machine's CPUs, file system and /dev/shm: separate hosts as far as the
network and MPI go, not separate machines."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from java_env import JAVA_MARKS, javac
from slurm_cluster import NETNS, Cluster, missing, remove_orphan_networks, slurm_cluster
from test_gpu_data_parallel import HERE, _build_kernels, _differ, needs_mpich
from test_gpu_data_parallel import _env as _gpu_env
from test_gpu_data_parallel import _run as _gpu_run
from test_java_data_parallel import _bitwise, _params
from test_java_openmpi import OPEN_MPIS, OpenMpi
from test_slurm import (
    MLP,
    _env,
    _java,
    _ompi_env,
    _run,
    java_cuda_ranks_equal_two_micro_batches,
    pycuda_ranks_equal_two_micro_batches,
)
from test_torchrun import TORCHRUN, _free_port, needs_torchrun

from deepdsl.cli import cli

pytestmark = [*JAVA_MARKS, pytest.mark.slow]

# where srun's block distribution puts the ranks of -N 2 -n 4: (rank, local rank, node)
PLACES = [(0, 0, "node1"), (1, 1, "node1"), (2, 0, "node2"), (3, 1, "node2")]


@pytest.fixture(scope="module", params=[False, True], ids=["one-host", "two-hosts"])
def cluster(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """The two nodes on this machine's network and host name, then each a host of its own (slurm_cluster.py's
    `hosts`: a network namespace and a host name per node, a bridge between them)."""
    with slurm_cluster(tmp_path_factory.mktemp("slurm_nodes"), nodes=2, hosts=request.param) as c:
        yield c


def _host(cluster: Cluster, node: str) -> str:
    """The host name a task on `node` sees: the node's where nodes are hosts, else this machine's."""
    return node if cluster.network is not None else socket.gethostname()


def _lines(out: str) -> list[str]:
    return sorted(line for line in out.splitlines() if line.strip())


# ---- each rank's place ----

PLACE_PY = (
    "import os; from deepdsl.distributed import world_from_env; w = world_from_env(); "
    "import socket; print(w.rank, w.size, w.local_rank, os.environ['SLURMD_NODENAME'], os.environ['SLURM_NODEID'], "
    "socket.gethostname())"
)


@pytest.mark.parametrize("pmi", [[], ["--mpi=pmi2"], ["--mpi=pmix"]], ids=["srun", "srun-pmi2", "srun-pmix"])
def test_each_python_ranks_place_across_two_nodes(cluster: Cluster, tmp_path: Path, pmi: list[str],
                                                  request: pytest.FixtureRequest) -> None:  # fmt: skip
    if pmi == ["--mpi=pmix"]:
        request.getfixturevalue("pmix")  # skips where the plugin does not load
    r = _run(["srun", *pmi, "-N", "2", "-n", "4", sys.executable, "-c", PLACE_PY], _env(cluster), tmp_path, 120)
    assert r.returncode == 0, r.stderr
    assert cluster.nodes == ("node1", "node2")
    assert _lines(r.stdout) == [f"{rank} 4 {local} {node} {node[-1:] == '2':d} {_host(cluster, node)}"
                                for rank, local, node in PLACES]  # fmt: skip


@pytest.mark.parametrize("pmi", [[], ["--mpi=pmi2"], ["--mpi=pmix"]], ids=["srun", "srun-pmi2", "srun-pmix"])
def test_each_java_ranks_place_across_two_nodes(cluster: Cluster, driver: Path, tmp_path: Path, pmi: list[str],
                                                request: pytest.FixtureRequest) -> None:  # fmt: skip
    """Launch as the Java program reads it (CollectiveCheck's launch mode: rank, size, local rank, launcher)."""
    if pmi == ["--mpi=pmix"]:
        request.getfixturevalue("pmix")  # skips where the plugin does not load
    java = f"java -cp {driver} deepdsl.runtime.CollectiveCheck launch"
    script = f'echo "$({java}) | $SLURMD_NODENAME $SLURM_NODEID $(hostname)"'
    r = _run(["srun", *pmi, "-N", "2", "-n", "4", "sh", "-c", script], _env(cluster), tmp_path, 120)
    assert r.returncode == 0, r.stderr
    launcher = "MPICH/PMI" if pmi == ["--mpi=pmi2"] else "Slurm"
    assert _lines(r.stdout) == [f"{rank} 4 {local} {launcher} | {node} {node[-1:] == '2':d} {_host(cluster, node)}"
                                for rank, local, node in PLACES]  # fmt: skip


# ---- training across the nodes ----

# Slurm 22.05's pmi2 plugin reads each PMI-1 request with one read() of at most 1024 bytes ("TODO: read until
# newline" in its pmi1.c) and tells MPICH a value may hold 1024 characters. Across nodes, PyPI's MPICH publishes each
# rank's UCX address in PMI in nine segments of up to that length (PMI_DEBUG=1), so a request is cut in two now and
# then ("mpi/pmi2: invalid client request"), and MPI_Init fails or hangs: 5 of 32 launches of the Java MLP across the
# two nodes by hand, none of 20 of the NumPy runner; and every launch while other tests loaded both cores. On one
# node MPICH publishes no such addresses and never failed. So training across nodes is Open MPI's, under pmix.
PMI1_CUT = "mpi/pmi2: invalid client request"

NODES = {  # srun's layout: (its flags, the micro-batches it equals, bit for bit?)
    "2-nodes-1-each": (["-N", "2", "-n", "2"], 2, True),
    "2-nodes-2-each": (["-N", "2", "-n", "4"], 4, False),
}


def _sent(cluster: Cluster) -> int:
    return cluster.traffic() if cluster.network is not None else 0


def _crossed(cluster: Cluster, sent: int, saved: Path) -> None:
    """Where the nodes are hosts: since `sent`, three steps' sums of every gradient (the parameters `saved`, not the
    optimiser's state) crossed the bridge. A sum across two hosts sends each element's partial sum both ways at
    least once, 2 x the parameters' bytes a step (measured under Open MPI: 1.004 x that bound with a rank a node,
    1.5 x with two; two ranks on one node, which MPI joins through shared memory: 0.0004 x)."""
    if cluster.network is not None:
        gradients = sum(a.nbytes for k, a in _params(saved).items() if not k.startswith("opt/"))
        crossed = cluster.traffic() - sent
        assert crossed >= 3 * 2 * gradients, f"{crossed} bytes crossed the bridge; {gradients} bytes of gradients"


def _close(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> list[str]:
    assert a.keys() == b.keys()
    return [k for k in a if not np.allclose(a[k], b[k], rtol=1e-5, atol=1e-6)]


def _srun_pmix(layout: list[str]) -> list[str]:
    return ["srun", "--mpi=pmix", *layout]


def _in_an_allocation(launcher: tuple[str, str], layout: list[str]) -> list[str]:
    """`launcher` (the command and its flag for the number of ranks) inside a Slurm allocation of the layout's
    nodes and tasks, as many ranks as tasks."""
    return ["salloc", *layout, *launcher, layout[layout.index("-n") + 1]]


# Open MPI's mpirun: it starts its daemons on the nodes through srun, then the ranks
_mpirun_in_an_allocation = partial(_in_an_allocation, ("mpirun", "-np"))
# MPICH's mpiexec (Hydra): its proxies started on the nodes through srun, its own PMI server (not Slurm's pmi2
# plugin, whose cut requests PMI1_CUT describes)
_mpiexec_in_an_allocation = partial(_in_an_allocation, ("mpiexec", "-n"))


def _one_host_orte(cluster: Cluster, ompi: OpenMpi) -> None:
    """Skips Open MPI 4's mpirun across the nodes of one host: its ORTE daemons of two nodes under one host name
    crash the ranks in its shared-memory transport (vader: a segmentation fault in mca_btl_vader_poll_handle_frag),
    which the same run as two hosts of their own does not: the emulation's doing, since no two nodes of a cluster
    share a host name."""
    if cluster.network is None and ompi.version.startswith("4."):
        pytest.skip("Open MPI 4's mpirun across two nodes of one host name crashes in its shared memory (vader); "
                    "it runs as two hosts")  # fmt: skip


def _compare(cluster: Cluster, folder: Path, program: list[str], ompi: OpenMpi | None = OPEN_MPIS[0],
             launch: Callable[[list[str]], list[str]] = _srun_pmix) -> None:  # fmt: skip
    """`program` (a command that takes --micro-batches, --save and writes --json) as one process of 2 and of 4
    micro-batches, and launched (`srun --mpi=pmix` by default) in each of NODES' layouts, over `ompi` (Open MPI
    5.0.11 by default; None: the dist extra's MPICH): rank 0 alone writes --json; each layout's losses and
    parameters equal its micro-batch run's (bit for bit or within rounding, as NODES says). Where the nodes are
    hosts, Open MPI's ranks are checked to have sent each step's gradients across the bridge (MPI took no
    shared-memory path between the two nodes). MPICH's are not: its UCX finds the two namespaces on one kernel and
    joins them through shared memory (28 kB crossed the bridge in an all-reduce of 4 MB)."""
    env = (_env(cluster) if ompi is None
           else _ompi_env(cluster, ompi, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1"))  # fmt: skip
    micro = {}
    for m in (2, 4):
        r = _run([*program, "--micro-batches", str(m), "--save", f"micro{m}.npz"], env, folder)
        assert r.returncode == 0, r.stderr
        micro[m] = json.loads(r.stdout)["losses"]
    for name, (layout, m, bitwise) in NODES.items():
        sent = _sent(cluster)
        r = _run([*launch(layout), *program, "--save", f"{name}.npz"], env, folder, timeout=120)
        assert r.returncode == 0, f"{name}: {r.stderr}"
        if ompi is not None:
            _crossed(cluster, sent, folder / f"{name}.npz")
        outs = [line for line in r.stdout.splitlines() if line.startswith("{")]
        assert len(outs) == 1, r.stdout  # rank 0 alone writes --json
        losses = json.loads(outs[0])["losses"]
        params, want = _params(folder / f"{name}.npz"), _params(folder / f"micro{m}.npz")
        if bitwise:
            assert losses == micro[m], name
            assert _bitwise(params, want) == [], name
        else:
            assert np.allclose(losses, micro[m], rtol=1e-5), name
            assert _close(params, want) == [], name


def test_numpy_ranks_across_two_nodes_equal_micro_batches(pmix: Cluster, tmp_path: Path) -> None:
    _compare(pmix, tmp_path, [sys.executable, "-m", "deepdsl", "run", str(MLP), "--set", "N=8", "--iters", "3",
                              "--data", "synthetic", "--json"])  # fmt: skip


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """MLP (N = 8) compiled with --data-parallel into dp/, built (test_slurm's layout, for its _java)."""
    folder = tmp_path_factory.mktemp("srun_nodes_java")
    r = CliRunner().invoke(cli, ["compile", str(MLP), "--set=N=8", "--data-parallel", "-o", str(folder / "dp")])
    assert r.exit_code == 0, r.output
    src = folder / "dp"
    javac(src, [*src.glob("*.java"), *(src / "deepdsl" / "runtime").glob("*.java")], src / "build")
    return folder


def test_java_ranks_across_two_nodes_equal_micro_batches(pmix: Cluster, programs: Path) -> None:
    _compare(pmix, programs, _java(programs))


# ---- the GPU devices' launch across the nodes: srun with MASTER_ADDR exported, NCCL's rendezvous ----


def _master(cluster: Cluster) -> str:
    """MASTER_ADDR as a batch script exports it: the first node's name (`scontrol show hostnames | head -n 1`), which
    the nodes resolve where they are hosts; else this machine's address."""
    return cluster.nodes[0] if cluster.network is not None else "127.0.0.1"


def test_java_cuda_ranks_across_two_nodes_equal_two_micro_batches(cluster: Cluster, program: Path) -> None:
    """`srun -N 2 -n 2 java ... --device cuda` (the stand-in driver and NCCL, over TCP: no MPI launch): rank 1 on
    node2 meets rank 0 at MASTER_ADDR:(MASTER_PORT + 1) on node1, and the two equal one process of two micro-batches
    bit for bit; as two hosts, through the bridge."""
    sent = _sent(cluster)
    java_cuda_ranks_equal_two_micro_batches(cluster, program, ["srun", "-N", "2", "-n", "2"], _master(cluster))
    _crossed(cluster, sent, program / "srun_two.npz")


@needs_mpich
def test_pycuda_ranks_across_two_nodes_equal_two_micro_batches(cluster: Cluster, work: Path) -> None:
    """`srun -N 2 -n 2 python -m deepdsl run --device cuda` (the emulated GPU, the stand-in NCCL over TCP), as the
    Java test above."""
    sent = _sent(cluster)
    pycuda_ranks_equal_two_micro_batches(cluster, work, ["srun", "-N", "2", "-n", "2"], _master(cluster))
    _crossed(cluster, sent, work / "srun_two.npz")


@needs_torchrun
@needs_mpich
def test_multi_node_torchrun_under_srun_trains_gpu_ranks_across_two_hosts(cluster: Cluster, work: Path) -> None:
    """`srun -N 2 -n 2 torchrun --nnodes=2 --nproc_per_node=1 --rdzv-backend=c10d --rdzv-endpoint=node1:PORT`, the
    multi-node launch of PyTorch's docs, running `deepdsl run --device cuda` (the emulated GPU): torchrun's agents
    meet at node1's store and give the ranks RANK, WORLD_SIZE and MASTER_ADDR; NCCL's rendezvous is MASTER_ADDR:
    (MASTER_PORT + 1), through the bridge where the nodes are hosts; the two equal one process of two micro-batches
    bit for bit."""
    _build_kernels(work, "mlp", "--set", "N=8")
    micro = _gpu_run(work, "mlp", "--iters", "3", "--set", "N=8", "--micro-batches", "2", "--save", "tr_micro.npz")
    assert micro["rc"] == 0, micro["stderr"]
    port = _free_port()
    torchrun = [str(TORCHRUN), "--nnodes=2", "--nproc_per_node=1", "--rdzv-backend=c10d", "--rdzv-id=deepdsl",
                f"--rdzv-endpoint={_master(cluster)}:{port}", "--no-python"]  # fmt: skip
    rank = [sys.executable, str(HERE / "emulated_rank.py"), str(work / "emulated_mlp"), "run", str(MLP), "--data",
            "synthetic", "--device", "cuda", "--kernels", "own", "--set", "N=8", "--iters", "3", "--save",
            "tr_two.npz"]  # fmt: skip
    sent = _sent(cluster)
    r = _run(["srun", "-N", "2", "-n", "2", *torchrun, *rank], cluster.env(_gpu_env(work)), work, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    said = r.stdout
    assert said.count("device: cuda (emulated GPU 0") == 1  # rank 0 alone prints
    assert "2 rank(s) [torchrun (RANK=0, WORLD_SIZE=2)]" in said, said
    # MASTER_ADDR is torchrun's name for the store's host: node1's; on one host 127.0.0.1's, localhost
    store = cluster.nodes[0] if cluster.network is not None else "localhost"
    assert re.search(rf"2 ranks, rendezvous NCCL_COMM_ID={store}:\d+\)", said), said
    losses = re.findall(r"iter +\d+/\d+ +loss ([-0-9.]+)", said)
    assert losses == [f"{x:.4f}" for x in micro["losses"]]
    assert _differ(_params(work / "tr_two.npz"), _params(work / "tr_micro.npz")) == []
    _crossed(cluster, sent, work / "tr_two.npz")


def test_networks_that_killed_runs_left_are_removed() -> None:
    """A namespace that no process is in goes once it is old enough, and so does a bridge without ports whose
    namespaces are gone; a namespace with a process in it stays, and so does its bridge. (The test's names have a
    tag of their own, so that it touches no cluster of another run.)"""
    if missing(hosts=True) or subprocess.run(["ip", "netns", "add", "ddslzzzzprobe"], capture_output=True).returncode:
        pytest.skip("no network namespaces here")
    subprocess.run(["ip", "netns", "del", "ddslzzzzprobe"], check=True)
    idle, busy, orphan, kept = "ddslzzzz1idle", "ddslzzzz2busy", "ddslbrzzzz1", "ddslbrzzzz2"
    sleeper = None
    try:
        for ns in (idle, busy):
            subprocess.run(["ip", "netns", "add", ns], check=True)
        for bridge in (orphan, kept):
            subprocess.run(["ip", "link", "add", bridge, "type", "bridge"], check=True)
        sleeper = subprocess.Popen(["ip", "netns", "exec", busy, "sleep", "60"])
        deadline = time.monotonic() + 10
        while not subprocess.run(["ip", "netns", "pids", busy], capture_output=True, text=True).stdout.strip():
            assert time.monotonic() < deadline, "the sleeper never entered its namespace"
            time.sleep(0.05)
        assert remove_orphan_networks(min_age=3600, tag="zzzz") == []  # young, busy, bridges with namespaces
        assert remove_orphan_networks(min_age=0, tag="zzzz") == [idle, orphan]
        assert not (NETNS / idle).exists() and (NETNS / busy).exists()
        assert not Path(f"/sys/class/net/{orphan}").exists() and Path(f"/sys/class/net/{kept}").exists()
    finally:
        if sleeper is not None:
            sleeper.kill()
            sleeper.wait()
        for ns in (idle, busy):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        for bridge in (orphan, kept):
            subprocess.run(["ip", "link", "del", bridge], capture_output=True)


# ---- Open MPI's mpirun inside an allocation: salloc -N 2 ... mpirun ----

OPEN_MPI = pytest.mark.parametrize("ompi", OPEN_MPIS, ids=lambda o: f"openmpi-{o.version}")


@OPEN_MPI
def test_numpy_ranks_of_mpirun_in_an_allocation_equal_micro_batches(cluster: Cluster, ompi: OpenMpi,
                                                                    tmp_path: Path) -> None:  # fmt: skip
    """`salloc -N 2 -n 4 mpirun -np 4 python -m deepdsl run ...`: Open MPI's mpirun (5.0.11's PRRTE, 4.1.8's ORTE)
    starts its daemons on the allocation's nodes through srun, as on a cluster without PMIx in Slurm."""
    _one_host_orte(cluster, ompi)
    _compare(cluster, tmp_path, [sys.executable, "-m", "deepdsl", "run", str(MLP), "--set", "N=8", "--iters", "3",
                                 "--data", "synthetic", "--json"], ompi, _mpirun_in_an_allocation)  # fmt: skip


@OPEN_MPI
def test_java_ranks_of_mpirun_in_an_allocation_equal_micro_batches(cluster: Cluster, ompi: OpenMpi,
                                                                   programs: Path) -> None:  # fmt: skip
    _one_host_orte(cluster, ompi)
    _compare(cluster, programs, _java(programs), ompi, _mpirun_in_an_allocation)


# ---- MPICH's mpiexec inside an allocation: salloc -N 2 ... mpiexec ----


def test_numpy_ranks_of_mpiexec_in_an_allocation_equal_micro_batches(cluster: Cluster, tmp_path: Path) -> None:
    """`salloc -N 2 -n 4 mpiexec -n 4 python -m deepdsl run ...` (the dist extra's MPICH): what docs/distributed.md
    tells MPICH's users to launch across nodes with, since Slurm's pmi2 plugin cuts its requests there."""
    _compare(cluster, tmp_path, [sys.executable, "-m", "deepdsl", "run", str(MLP), "--set", "N=8", "--iters", "3",
                                 "--data", "synthetic", "--json"], None, _mpiexec_in_an_allocation)  # fmt: skip


def test_java_ranks_of_mpiexec_in_an_allocation_equal_micro_batches(cluster: Cluster, programs: Path) -> None:
    _compare(cluster, programs, _java(programs), None, _mpiexec_in_an_allocation)


def test_three_numpy_ranks_a_node_under_pmix_as_two_hosts(pmix: Cluster, tmp_path: Path) -> None:
    """`srun --mpi=pmix -N 2 -n 6 --overcommit` (three ranks on each two-CPU node, Open MPI 5.0.11) equals six
    micro-batches within rounding. Across two nodes of one host name the third rank on a node fails in MPI_Init (PMIx
    status -61): the emulation's, since as two hosts it runs, so this runs as two hosts alone."""
    if pmix.network is None:
        pytest.skip("Open MPI 5's third rank on a node fails in MPI_Init where two nodes share a host name")
    program = [sys.executable, "-m", "deepdsl", "run", str(MLP), "--set", "N=8", "--iters", "3", "--data",
               "synthetic", "--json"]  # fmt: skip
    env = _ompi_env(pmix, OPEN_MPIS[0])
    micro = _run([*program, "--micro-batches", "6", "--save", "micro6.npz"], env, tmp_path)
    assert micro.returncode == 0, micro.stderr
    sent = _sent(pmix)
    r = _run(["srun", "--mpi=pmix", "-N", "2", "-n", "6", "--overcommit", *program, "--save", "six.npz"], env, tmp_path,
             timeout=180)  # fmt: skip
    assert r.returncode == 0, r.stderr
    _crossed(pmix, sent, tmp_path / "six.npz")
    outs = [line for line in r.stdout.splitlines() if line.startswith("{")]
    assert len(outs) == 1, r.stdout  # rank 0 alone writes --json
    assert np.allclose(json.loads(outs[0])["losses"], json.loads(micro.stdout)["losses"], rtol=1e-5)
    assert _close(_params(tmp_path / "six.npz"), _params(tmp_path / "micro6.npz")) == []
