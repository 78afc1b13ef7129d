"""The Java program's data parallelism (issue 32): the launchers' environments (Launch), the CPU device's MPI
through JNA (MpiCollective) under `mpiexec -n 2`, the start-up agreement and the watchdog, the emission of the
data-parallel statements, and whole programs: two Java ranks give the parameters of one Java process of two
micro-batches bit for bit, the NumPy runner's within rounding, one rank the plain program's bit for bit.

MPI is PyPI's mpich 5.0.2 (the dist extra: its mpiexec and libmpi_abi.so.1), JNA the jar of .ci/jcuda/pom.xml."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from dp_nets import DROPOUT, RESIDUAL
from helpers import ROOT
from java_env import JAVA_MARKS, javac, jna_jar, launch_env, mpi

from deepdsl.cli import cli

pytestmark = JAVA_MARKS

MLP = ROOT / "networks" / "mlp.ddsl"
LENET = ROOT / "networks" / "lenet.ddsl"


def _env(lib: Path, **extra: str) -> dict[str, str]:
    """The launched runs' environment: the MPI's folder on PATH (MpiCollective finds ../lib beside mpiexec)."""
    return launch_env(PATH=f"{lib.parent / 'bin'}:{os.environ.get('PATH', '')}", **extra)


def _check(build: Path, *args: str, ranks: int = 2, jvm: tuple[str, ...] = (), jna: bool = True,
           timeout: float = 60, **env: str) -> subprocess.CompletedProcess:  # fmt: skip
    mpiexec, lib = mpi()
    cp = f"{build}:{jna_jar()}" if jna else str(build)
    cmd = ["java", *jvm, "-cp", cp, "deepdsl.runtime.CollectiveCheck", *args]
    if ranks:
        cmd = [mpiexec, "-n", str(ranks), *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_env(lib, **env), check=False)


# ---- the launchers' environments ----

# fmt: off
LAUNCHES = [  # (environment, flags --ranks --rank --local-rank, what Launch says | NCCL's rendezvous)
    ("RANK=3 WORLD_SIZE=8 LOCAL_RANK=1 MASTER_ADDR=node1 MASTER_PORT=29500", "- - -", "3 8 1 torchrun | node1:29501"),
    ("OMPI_COMM_WORLD_RANK=5 OMPI_COMM_WORLD_SIZE=6 OMPI_COMM_WORLD_LOCAL_RANK=2", "- - -", "5 6 2 Open MPI | null"),
    ("PMI_RANK=1 PMI_SIZE=2 MPI_LOCALRANKID=1", "- - -", "1 2 1 MPICH/PMI | null"),
    ("SLURM_PROCID=9 SLURM_NTASKS=16 SLURM_LOCALID=1 MASTER_ADDR=10.0.0.7 MASTER_PORT=6000", "- - -",
     "9 16 1 Slurm | 10.0.0.7:6001"),
    # an MPI job under srun: MPI's variables say the ranks (deepdsl/distributed/world.py's order)
    ("PMI_RANK=0 PMI_SIZE=2 SLURM_PROCID=7 SLURM_NTASKS=16", "- - -", "0 2 0 MPICH/PMI | null"),
    # srun --mpi=pmi2 sets PMI_RANK and PMI_SIZE, no MPI_LOCALRANKID: Slurm's local rank, where it is the same world
    ("PMI_RANK=3 PMI_SIZE=4 SLURM_PROCID=3 SLURM_NTASKS=4 SLURM_LOCALID=1", "- - -", "3 4 1 MPICH/PMI | null"),
    ("PMI_RANK=1 PMI_SIZE=2 SLURM_PROCID=7 SLURM_NTASKS=16 SLURM_LOCALID=3", "- - -", "1 2 1 MPICH/PMI | null"),
    ("", "- - -", "0 1 0 single process | null"),
    ("PMI_RANK=4 PMI_SIZE=8", "- - -", "4 8 4 MPICH/PMI | null"),  # no local rank: one machine
    ("RANK=1 WORLD_SIZE=2 NCCL_COMM_ID=10.1.1.1:7000 MASTER_ADDR=a MASTER_PORT=1", "- - -",
     "1 2 1 torchrun | 10.1.1.1:7000"),  # the user's NCCL_COMM_ID wins
    ("RANK=0 WORLD_SIZE=2 MASTER_ADDR=fe80::1 MASTER_PORT=29500", "- - -", "0 2 0 torchrun | [fe80::1]:29501"),
    ("RANK=1 WORLD_SIZE=4 LOCAL_RANK=1", "2 0 -", "0 2 1 torchrun, --ranks, --rank | null"),  # the flags win
    ("", "2 1 0", "1 2 0 --ranks, --rank | null"),
    ("RANK=x WORLD_SIZE=2", "- - -", "error: the environment's RANK is 'x', not a whole number >= 0"),
    ("RANK=2 WORLD_SIZE=2", "- - -", "error: rank 2 is not in [0, 2) (torchrun)"),
    ("WORLD_SIZE=2", "- - -", "error: the environment sets WORLD_SIZE but not RANK (the torchrun launch sets both)"),
    ("", "2 - -", "error: --ranks 2 needs this process's rank: --rank r, or a launcher's environment (RANK, "
     "OMPI_COMM_WORLD_RANK, PMI_RANK or SLURM_PROCID)"),
    ("RANK=0 WORLD_SIZE=2 MASTER_ADDR=h MASTER_PORT=65535", "- - -",
     "error: the environment's MASTER_PORT is 65535: NCCL's rendezvous takes MASTER_PORT+1, not a port"),
]
# fmt: on


def test_every_launchers_environment_is_read(driver: Path, tmp_path: Path) -> None:
    cases = tmp_path / "cases.txt"
    cases.write_text("".join(f"{env} | {flags}\n" for env, flags, _ in LAUNCHES))
    r = subprocess.run(["java", "-cp", str(driver), "deepdsl.runtime.CollectiveCheck", "launches", str(cases)],
                       capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [want for _, _, want in LAUNCHES]


# ---- MPI through JNA ----


def _float32_sums() -> list[str]:
    """What CollectiveCheck allreduce prints: its buckets' values summed over ranks 0 and 1 in float32, as hex."""
    k15, k7, k4 = np.arange(15), np.arange(7), np.arange(4)
    f = np.float32
    a = [np.sqrt(k15 + 1).astype(f) * f(r + 1) + f(0.1) * f(r) for r in (0, 1)]
    b = [f(1e-3) * k7.astype(f) - f(r) for r in (0, 1)]
    d = [f(0.25) * (k4 + 1).astype(f) * f(r + 1) for r in (0, 1)]
    total = np.concatenate([a[0] + a[1], b[0] + b[1], d[0] + d[1]]).astype(f)
    return [format(int(x), "x") for x in total.view(np.uint32)]


@pytest.mark.parametrize("library", ["libmpi_abi.so.1", "libmpi.so.12"])
def test_two_ranks_sum_their_buckets_in_place(driver: Path, library: str) -> None:
    _, lib = mpi()
    r = _check(driver, "allreduce", jvm=(f"-Ddeepdsl.mpi.lib={lib / library}",))
    assert r.returncode == 0, r.stderr + r.stdout
    lines = r.stdout.splitlines()
    assert len(lines) == 2 and lines[0].split() == lines[1].split() == _float32_sums()
    abi = "MPI-5 ABI" if library == "libmpi_abi.so.1" else "MPICH ABI"
    assert r.stderr.count(f"MPI through JNA ({lib / library}, {abi}, MPICH Version: 5.0.2), 2 ranks") == 2


def test_the_library_is_found_beside_mpiexec(driver: Path) -> None:
    _, lib = mpi()
    r = _check(driver, "allreduce")
    assert r.returncode == 0, r.stderr
    assert f"({lib / 'libmpi_abi.so.1'}, MPI-5 ABI" in r.stderr


def test_ranks_that_differ_are_refused_naming_them(driver: Path) -> None:
    mpiexec, lib = mpi()
    cp = f"{driver}:{jna_jar()}"
    rank = ["java", "-cp", cp, "deepdsl.runtime.CollectiveCheck", "agree"]
    same = subprocess.run([mpiexec, "-n", "2", *rank, "7"], capture_output=True, text=True, timeout=60,
                          env=_env(lib), check=False)  # fmt: skip
    assert same.returncode == 0 and same.stdout.split() == ["agreed", "agreed"], same.stderr
    r = subprocess.run([mpiexec, "-n", "1", *rank, "7", ":", "-n", "1", *rank, "8"], capture_output=True,
                       text=True, timeout=60, env=_env(lib), check=False)  # fmt: skip
    assert r.returncode != 0
    assert "rank 1 differs from rank 0 in the plan's checksum" in r.stdout
    assert "agreed" not in r.stdout


@pytest.mark.parametrize("ranks", [2, pytest.param(3, marks=pytest.mark.slow)])  # 3 ranks on 2 cores: 3 s
def test_a_stalled_rank_is_named_within_the_timeout(driver: Path, ranks: int) -> None:
    t0 = time.monotonic()
    r = _check(driver, "stall", "60", ranks=ranks, DEEPDSL_DP_TIMEOUT="2")
    assert time.monotonic() - t0 < 30  # not the 60 s rank 1 sleeps: the others' watchdog ended the job
    assert r.returncode != 0
    # named by the ledger: rank 1 has started no all-reduce, the others one (the first to time out says so)
    assert re.search(r"error: rank [02]: the all-reduce of bucket 0 waited 2 s for rank 1 \(its all-reduces "
                     r"started: 0, this rank's: 1\), which died or stalled", r.stdout), r.stdout  # fmt: skip
    assert "reduced" not in r.stdout


def test_a_missing_library_is_named(driver: Path, tmp_path: Path) -> None:
    nothing = tmp_path / "libmpi_abi.so.1"
    r = _check(driver, "allreduce", "--ranks", "2", "--rank", "0", ranks=0, jvm=(f"-Ddeepdsl.mpi.lib={nothing}",))
    assert r.returncode == 1
    assert f"no MPI library for the CPU device's ranks (libmpi: tried {nothing})" in r.stdout
    assert "pip install mpich==5.0.2" in r.stdout
    r = _check(driver, "allreduce", "--ranks", "2", "--rank", "0", ranks=0, jna=False)
    assert r.returncode == 1
    assert "JNA (net.java.dev.jna:jna:5.19.1, jna-5.19.1.jar) is not on the class path" in r.stdout


# ---- the emission ----


def _compile(tmp_path: Path, source: Path | str, *flags: str) -> tuple[int, str]:
    r = CliRunner().invoke(cli, ["compile", str(source), *flags, "-o", str(tmp_path / "out")])
    return r.exit_code, r.output


def test_the_step_issues_the_buckets_reductions(tmp_path: Path) -> None:
    code, out = _compile(tmp_path, MLP, "--set", "N=8", "--data-parallel")
    assert code == 0, out
    text = (tmp_path / "out" / "MLP.java").read_text()
    assert "private final Buf dp_scale = dataParallelScale();" in text
    pre = text[text.index("    void pre() {") : text.index("    void post() {")]
    post = text[text.index("    void post() {") :]
    post = post[: post.index("\n    }\n")]
    starts = re.findall(r"allReduceStart\((\d+), (\w+), dp_scale, ([\w, ]+)\);", pre)
    waits = re.findall(r"allReduceWait\((\d+), (\w+)\);", post)
    # bucket 0: the last layers' gradients in the order the backward pass makes them; 1: fc1.W (1.5 MB, over the
    # first bucket's 1 MB); 2: the state bucket (the loss)
    assert starts == [("2", "bucket2", "loss"), ("0", "bucket0", "fc3_db, fc3_dW, fc2_db, fc2_dW, fc1_db"),
                      ("1", "bucket1", "fc1_dW")]  # fmt: skip
    assert waits == [("0", "bucket0_reduced"), ("1", "bucket1_reduced"), ("2", "bucket2_reduced")]
    assert "allReduce" not in post.split("allReduceWait(2")[1]
    # the updates read the reduced gradients: slices of the waited buckets at their offsets
    assert "final Buf fc1_db_reduced = slice(bucket0_reduced, 153310, 500);" in text  # after 10+3000+300+150000
    # (one multi-tensor launch of every update, passes/multi_tensor.py: each parameter's segment reads its reduced
    # gradient)
    assert "{fc1_W_momentum, fc1_W, fc1_W_momentum, fc1_dW_reduced, fc1_W," in post
    assert "final Buf loss_reduced = slice(bucket2_reduced, 0);" in text
    assert "return dev.scalar(training.loss_reduced);" in text
    assert "protected boolean accumulates()" in text
    # a program compiled without the pass has none of it
    code, out = _compile(tmp_path / "plain", MLP, "--set", "N=8")
    plain = (tmp_path / "plain" / "out" / "MLP.java").read_text()
    assert code == 0 and "allReduce" not in plain and "dataParallel" not in plain and "void pre()" not in plain


def test_a_shards_dropout_mask_starts_at_its_offset(tmp_path: Path) -> None:
    f = tmp_path / "drop.ddsl"
    f.write_text(DROPOUT)
    code, out = _compile(tmp_path, f, "--data-parallel")
    assert code == 0, out
    text = (tmp_path / "out" / "Drop.java").read_text()
    # the shard's mask: the global batch's from the shard's first sample on (the step and the offset as longs)
    assert "dev.dropoutMaskAt(net_dropout1_dropout_mask_at, iteration, sampleOffset(), 0.5f, " in text
    assert "dp_offset" not in text and "dp/offset" not in text


# ---- whole programs ----


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """MLP, LeNet, TinyRes and Drop compiled with --data-parallel into dp/, MLP and Drop without into plain/."""
    folder = tmp_path_factory.mktemp("java_dp")
    (folder / "tiny.ddsl").write_text(RESIDUAL)
    (folder / "drop.ddsl").write_text(DROPOUT)
    for source, sets in ((MLP, ["N=8"]), (LENET, ["N=8"]), (folder / "tiny.ddsl", []), (folder / "drop.ddsl", [])):
        flags = [f"--set={s}" for s in sets]
        r = CliRunner().invoke(cli, ["compile", str(source), *flags, "--data-parallel", "-o", str(folder / "dp")])
        assert r.exit_code == 0, r.output
    for source, sets in ((MLP, ["--set=N=8"]), (folder / "drop.ddsl", [])):
        r = CliRunner().invoke(cli, ["compile", str(source), *sets, "-o", str(folder / "plain")])
        assert r.exit_code == 0, r.output
    for kind in ("dp", "plain"):
        src = folder / kind
        javac(src, [*src.glob("*.java"), *(src / "deepdsl" / "runtime").glob("*.java")], src / "build")
    return folder


def _java(folder: Path, kind: str, name: str, *args: str, ranks: int = 1, timeout: float = 300,
          **env: str) -> subprocess.CompletedProcess:  # fmt: skip
    mpiexec, lib = mpi()
    cmd = ["java", "-cp", f"{folder / kind / 'build'}:{jna_jar()}", name, "--device", "cpu", "--threads", "1", *args]
    if ranks > 1:
        cmd = [mpiexec, "-n", str(ranks), *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=folder,
                          env=_env(lib, **env), check=False)  # fmt: skip


def _params(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as f:
        return {k: f[k] for k in f.files}


def _bitwise(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> list[str]:
    assert a.keys() == b.keys()
    return [k for k in a if not np.array_equal(a[k], b[k])]


@pytest.mark.parametrize("name", ["MLP", "Drop"])
def test_one_rank_of_the_data_parallel_program_is_the_plain_program(programs: Path, name: str) -> None:
    common = ("--data", "synthetic", "--iters", "3", "--json")
    dp = _java(programs, "dp", name, *common, "--save", f"{name}_dp1.npz")
    plain = _java(programs, "plain", name, *common, "--save", f"{name}_plain1.npz")
    assert dp.returncode == plain.returncode == 0, dp.stderr + plain.stderr
    assert json.loads(dp.stdout)["losses"] == json.loads(plain.stdout)["losses"]
    assert _bitwise(_params(programs / f"{name}_dp1.npz"), _params(programs / f"{name}_plain1.npz")) == []


def test_a_program_without_the_pass_refuses_ranks_and_micro_batches(programs: Path) -> None:
    r = _java(programs, "plain", "MLP", "--data", "synthetic", "--iters", "1", ranks=2)
    assert r.returncode != 0 and "iter 1/1" not in r.stdout
    assert ("error: 2 ranks (MPICH/PMI): this program was compiled without the data-parallel pass; compile it with "
            "`deepdsl compile --data-parallel`") in r.stderr  # fmt: skip
    r = _java(programs, "plain", "MLP", "--data", "synthetic", "--iters", "1", "--micro-batches", "2")
    assert r.returncode == 1 and "error: --micro-batches 2: this program was compiled without" in r.stderr


def _numpy(source: Path, tag: str, folder: Path, sets: list[str]) -> tuple[dict, dict[str, np.ndarray]]:
    """The NumPy runner's run of two micro-batches (deepdsl run --micro-batches 2), its --json and parameters."""
    out = folder / f"numpy_{tag}.npz"
    flags = [f"--set={s}" for s in sets]
    r = subprocess.run([sys.executable, "-m", "deepdsl", "run", str(source), *flags, "--iters", "3", "--data",
                        "synthetic", "--micro-batches", "2", "--save", str(out), "--json"], capture_output=True,
                       text=True, timeout=300, env=launch_env(PYTHONPATH=str(ROOT)), check=False)  # fmt: skip
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout), _params(out)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "source", "sets"), [("MLP", MLP, ["N=8"]), ("LeNet", LENET, ["N=8"]),
                                                       ("TinyRes", "tiny.ddsl", []),
                                                       ("Drop", "drop.ddsl", [])])  # fmt: skip
def test_two_java_ranks_equal_two_micro_batches_bit_for_bit(programs: Path, name: str, source: Path | str,
                                                          sets: list[str]) -> None:  # fmt: skip
    common = ("--data", "synthetic", "--iters", "3", "--json")
    micro = _java(programs, "dp", name, *common, "--micro-batches", "2", "--save", f"{name}_micro.npz")
    assert micro.returncode == 0, micro.stderr
    ranks = _java(programs, "dp", name, *common, "--save", f"{name}_ranks.npz", ranks=2)
    assert ranks.returncode == 0, ranks.stderr
    outs = [line for line in ranks.stdout.splitlines() if line.strip()]
    assert len(outs) == 1, ranks.stdout + ranks.stderr  # rank 0 alone writes --json
    assert ranks.stderr.count("device: cpu") == 1 and "data parallel: rank 0 of 2 (MPICH/PMI)" in ranks.stderr
    one, two = json.loads(micro.stdout), json.loads(outs[0])
    assert one["losses"] == two["losses"] and one["test_loss"] == two["test_loss"]
    micro_params, rank_params = _params(programs / f"{name}_micro.npz"), _params(programs / f"{name}_ranks.npz")
    assert _bitwise(micro_params, rank_params) == []
    # the NumPy runner's two micro-batches: the same training within rounding
    got, numpy_params = _numpy(programs / source if isinstance(source, str) else source, name, programs, sets)
    np.testing.assert_allclose(two["losses"], got["losses"], rtol=1e-4)
    for k, v in numpy_params.items():
        if v.dtype == np.float32:
            np.testing.assert_allclose(rank_params[k], v, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(v).max())),
                                       err_msg=k)  # fmt: skip


def signal_rank_one(programs: Path, launcher: list[str], rank_variable: str, sig: signal.Signals,
                    env: dict[str, str]) -> tuple[subprocess.Popen, str, str, str]:  # fmt: skip
    """LeNet's data-parallel program as two ranks under `launcher` (each rank's pid written by `rank_variable`),
    rank 1 sent `sig` once training has started: the launcher's process, rank 1's pid, all it printed, its stderr.
    Its output is read by threads, so that a run that never starts (or never ends) fails the test, not hangs it."""
    pids = programs / f"pids_{sig.name}"
    pids.mkdir(exist_ok=True)
    java = f"java -cp {programs / 'dp' / 'build'}:{jna_jar()} LeNet --device cpu --threads 1 --data synthetic"
    script = f"echo $$ > {pids}/${rank_variable}; exec {java} --iters 100000"
    p = subprocess.Popen([*launcher, "sh", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         cwd=programs, env=env)  # fmt: skip
    out: list[str] = []
    err: list[str] = []
    readers = [threading.Thread(target=lambda f=f, into=into: into.extend(f), daemon=True)
               for f, into in ((p.stdout, out), (p.stderr, err))]  # fmt: skip
    for reader in readers:
        reader.start()
    pid = ""
    try:
        deadline = time.monotonic() + 120
        while not (pids / "1").exists() or not any("iter " in line for line in out):
            assert p.poll() is None, "".join(err)
            assert time.monotonic() < deadline, "the run did not start:\n" + "".join(out + err)
            time.sleep(0.05)
        pid = (pids / "1").read_text().strip()
        os.kill(int(pid), sig)
        p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        for reader in readers:
            reader.join(timeout=10)
    text = "".join(out + err)
    assert "iter 100000/100000" not in text
    return p, pid, text, "".join(err)


@pytest.mark.slow
def test_a_killed_or_stopped_rank_ends_the_run_with_an_error(programs: Path) -> None:
    """Rank 1 killed (SIGKILL) mid-run: the launcher ends the job naming it; rank 1 stopped (SIGSTOP): rank 0's
    watchdog names it within the timeout and MPI_Abort ends the job. Never a hang."""
    mpiexec, lib = mpi()
    for sig, timeout in ((signal.SIGKILL, "300"), (signal.SIGSTOP, "3")):
        p, pid, text, err = signal_rank_one(programs, [str(mpiexec), "-n", "2"], "PMI_RANK", sig,
                                            _env(lib, DEEPDSL_DP_TIMEOUT=timeout))  # fmt: skip
        assert p.returncode != 0
        if sig == signal.SIGKILL:
            assert "BAD TERMINATION" in text and f"PID {pid}" in text
        else:
            # named whether stopped before the all-reduce ("(its all-reduces started: ...") or inside it
            assert "error: rank 0: the all-reduce of bucket" in err
            assert re.search(r"waited 3 s for rank 1 \((its all-reduces started|it started it too)", err), err


@pytest.mark.slow
def test_a_resumed_two_rank_run_continues_exactly(programs: Path) -> None:
    """Two Java ranks saving after 2 steps (rank 0 alone, atomically), then 2 more from that file: the 4-step
    run's parameters, optimizer state (Adam's) and step counter, bit for bit."""
    args = ("--data", "synthetic")
    whole = _java(programs, "dp", "TinyRes", *args, "--iters", "4", "--save", "whole.npz", ranks=2)
    half = _java(programs, "dp", "TinyRes", *args, "--iters", "2", "--save", "half.npz", ranks=2)
    assert whole.returncode == half.returncode == 0, whole.stderr + half.stderr
    rest = _java(programs, "dp", "TinyRes", *args, "--iters", "2", "--load", "half.npz", "--save", "resumed.npz",
                 ranks=2)  # fmt: skip
    assert rest.returncode == 0, rest.stderr
    resumed = _params(programs / "resumed.npz")
    assert _bitwise(_params(programs / "whole.npz"), resumed) == []
    assert int(resumed["opt/iteration"]) == 4
    assert not [p for p in programs.iterdir() if ".tmp" in p.name]  # written atomically, by one rank
