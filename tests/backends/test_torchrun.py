"""The CUDA devices' data-parallel runs launched as torchrun launches them (issue 32): plain processes, no MPI, with
torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT,
TORCHELASTIC_*), so that the ranks meet through NCCL's own rendezvous at NCCL_COMM_ID = MASTER_ADDR:(MASTER_PORT+1)
(set by the programs). Without a GPU: the Java CUDA device on the stand-in driver and the PyCUDA runner on the
emulated GPU, with the stand-in NCCL (fake_libnccl.c), which outside an MPI launch meets and reduces over TCP
sockets as NCCL's bootstrap does (rank 0 listens at NCCL_COMM_ID, the others connect). Two ranks must equal one
process of `--micro-batches 2` bit for bit; a rank whose peer never comes, or dies, must end with an error, never
hang. Then the same under the real `torchrun` where it is installed (DEEPDSL_TORCHRUN=PATH, or `torchrun` on
PATH: PyTorch), and scripts/gpu_nccl_check.py (the GPU machine's NCCL step) run end to end on the emulated GPU."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from java_env import JAVA_MARKS, jcuda_jars, jna_jar, launch_env, mpi
from test_gpu_data_parallel import HERE, ROOT, _build_kernels, _differ, _env, needs_mpich
from test_gpu_data_parallel import _run as _gpu_run
from test_java_nccl import _params
from test_java_nccl import _run as _java_run

pytestmark = pytest.mark.slow

TORCHRUN = os.environ.get("DEEPDSL_TORCHRUN") or shutil.which("torchrun")
needs_torchrun = pytest.mark.skipif(
    TORCHRUN is None or not Path(TORCHRUN).exists(),
    reason="no torchrun: install PyTorch (its `torchrun` on PATH) or set DEEPDSL_TORCHRUN=/path/to/torchrun",
)
MLP = str(ROOT / "networks" / "mlp.ddsl")
LAUNCHERS = ("PMI_", "PMIX_", "OMPI_", "SLURM_", "HYDRA_", "MPI_LOCAL", "TORCHELASTIC_", "NCCL_", "FAKE_NCCL")


def _free_port() -> int:
    """A port free now whose next one is free too (MASTER_PORT and NCCL's MASTER_PORT+1)."""
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            if port >= 65000:
                continue
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
            return port
    raise AssertionError("no two free ports in a row")


def _plain(env: dict[str, str]) -> dict[str, str]:
    """`env` without any launcher's variables: what a process that no MPI launcher started sees."""
    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")
    return {k: v for k, v in env.items() if not k.startswith(LAUNCHERS) and k not in names}


def _torchrun_env(base: dict[str, str], rank: int, size: int, port: int, local_rank: int | None = None) -> dict:
    """The variables torchrun gives worker `rank` of `size` on one node (as torchrun 2.15 sets them)."""
    local = rank if local_rank is None else local_rank
    return {**_plain(base), "RANK": str(rank), "WORLD_SIZE": str(size), "LOCAL_RANK": str(local),
            "LOCAL_WORLD_SIZE": str(size), "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1", "ROLE_RANK": str(rank),
            "ROLE_WORLD_SIZE": str(size), "ROLE_NAME": "default", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port), "TORCHELASTIC_RUN_ID": "deepdsl-test", "TORCHELASTIC_RESTART_COUNT": "0",
            "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_USE_AGENT_STORE": "True",
            "OMP_NUM_THREADS": "1"}  # fmt: skip


def _launch(cmds: list[list[str]], envs: list[dict[str, str]], cwd: Path, timeout: float = 300) -> list[dict]:
    """Each command a plain process with its environment, all at once (no launcher); their return codes and output.
    A process not done within `timeout` fails the test (a hang), after every one is killed."""
    procs = [subprocess.Popen(c, env=e, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for c, e in zip(cmds, envs, strict=True)]  # fmt: skip
    t0 = time.monotonic()
    got = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=max(1.0, timeout - (time.monotonic() - t0)))
            got.append({"rc": p.returncode, "stdout": out, "stderr": err})
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        outs = [p.communicate() for p in procs]
        pytest.fail(f"a rank hung past {timeout} s: {[o[1][-2000:] for o in outs]}")
    for g in got:
        objects = [line for line in g["stdout"].splitlines() if line.startswith("{")]
        g["objects"] = len(objects)
        if len(objects) == 1:
            g.update(json.loads(objects[0]))
    return got


# ---- the stand-in NCCL itself: TCP against MPI ----

PROBE = r"""
import ctypes, sys
import numpy as np
lib = ctypes.CDLL(sys.argv[1])
rank, size = int(sys.argv[2]), int(sys.argv[3])
class Id(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]
uid = Id()
assert lib.ncclGetUniqueId(ctypes.byref(uid)) == 0
comm = ctypes.c_void_p()
lib.ncclCommInitRank.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, Id, ctypes.c_int]
status = lib.ncclCommInitRank(ctypes.byref(comm), size, uid, rank)
if status:
    sys.exit(f"ncclCommInitRank: {status}")
p, n, i = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
lib.ncclAllReduce.argtypes = [p, p, n, i, i, p, p]
lib.ncclBroadcast.argtypes = [p, p, n, i, i, p, p]
rng = np.random.default_rng(1234 + rank)
out = {}
x = (rng.standard_normal(100003) * np.exp(rng.uniform(-20, 20, 100003))).astype(np.float32)  # all magnitudes
for name, array, op in (("sum", x, 0), ("max", x, 2), ("int64", rng.integers(-2**40, 2**40, 999), 0)):
    a = array.copy()
    kind = 7 if a.dtype == np.float32 else 4
    assert lib.ncclAllReduce(a.ctypes.data, a.ctypes.data, a.size, kind, op, comm, None) == 0
    out[name] = a
b = np.full(17, float(rank), np.float32) + np.arange(17, dtype=np.float32)
assert lib.ncclBroadcast(b.ctypes.data, b.ctypes.data, b.size, 7, size - 1, comm, None) == 0
out["broadcast"] = b
np.savez(sys.argv[4], **out)
lib.ncclCommDestroy(comm)
"""


@needs_mpich
def test_the_stand_in_reduces_over_tcp_as_mpi_does_bit_for_bit(work: Path) -> None:
    """Two plain processes (torchrun's environment) meet at NCCL_COMM_ID and reduce over TCP; the same calls under
    mpiexec go through MPI: the sums (float32 over magnitudes 1e-9..1e9), maxima, int64 sums and a broadcast from
    the last rank are the same bytes, and the float sums are r0 + r1 exactly."""
    from test_gpu_data_parallel import MPIEXEC

    (work / "probe.py").write_text(PROBE)
    lib = str(work / "nccl" / "libnccl.so.2")
    port = _free_port()
    envs = [_torchrun_env(dict(os.environ), r, 2, port) | {"NCCL_COMM_ID": f"127.0.0.1:{port + 1}",
                                                          "NCCL_DEBUG": "INFO"} for r in (0, 1)]  # fmt: skip
    tcp = _launch([[sys.executable, "probe.py", lib, str(r), "2", f"tcp{r}.npz"] for r in (0, 1)], envs, work, 120)
    assert [g["rc"] for g in tcp] == [0, 0], [g["stderr"] for g in tcp]
    assert all("(the stand-in, over TCP) - Init COMPLETE" in g["stderr"] for g in tcp)
    env = _plain(dict(os.environ)) | {"NCCL_DEBUG": "INFO", "NCCL_COMM_ID": "127.0.0.1:1"}  # one id (MPI: no socket)
    r = subprocess.run([str(MPIEXEC), "-n", "2", "sh", "-c", f'exec {sys.executable} probe.py {lib} $PMI_RANK 2 '
                        'mpi$PMI_RANK.npz'], cwd=work, env=env, capture_output=True, text=True, timeout=120,
                       check=False)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "(the stand-in, over MPI) - Init COMPLETE" in r.stderr
    got = [_params(work / f"tcp{k}.npz") for k in (0, 1)] + [_params(work / f"mpi{k}.npz") for k in (0, 1)]
    assert all(_differ(g, got[0]) == [] for g in got[1:])
    rng = [np.random.default_rng(1234 + k) for k in (0, 1)]
    xs = [(g.standard_normal(100003) * np.exp(g.uniform(-20, 20, 100003))).astype(np.float32) for g in rng]
    assert got[0]["sum"].tobytes() == (xs[0] + xs[1]).tobytes()
    assert got[0]["broadcast"].tolist() == (np.arange(17) + 1.0).tolist()


# ---- the PyCUDA runner on the emulated GPU, as torchrun launches it ----


def _losses(stdout: str) -> list[str]:
    """The losses of rank 0's progress lines, as printed."""
    return re.findall(r"iter +\d+/\d+ +loss ([-0-9.]+)", stdout)


def _gpu_rank(work: Path, rank: int, size: int, port: int, *args: str, tag: str = "", **extra: str) -> tuple:
    """Rank `rank`'s command (`deepdsl run` of the MLP on the emulated GPU) and its environment."""
    cmd = [sys.executable, str(HERE / "emulated_rank.py"), str(work / "emulated_mlp"), "run", MLP, "--data",
           "synthetic", "--device", "cuda", "--kernels", "own", "--set", "N=8", *args]  # fmt: skip
    env = _torchrun_env(_env(work), rank, size, port) | {"FAKE_NCCL_CALLS": str(work / f"calls{tag}.{rank}"), **extra}
    return cmd, env


@needs_mpich
def test_two_gpu_ranks_launched_as_torchrun_does_equal_two_micro_batches(work: Path) -> None:
    """`deepdsl run --device cuda` as two plain processes with torchrun's variables (no MPI): NCCL's rendezvous at
    MASTER_ADDR:(MASTER_PORT+1), the stand-in over TCP, the step's buckets all-reduced inside the replayed graph;
    the parameters of one process of --micro-batches 2 bit for bit; each rank on its LOCAL_RANK's GPU."""
    _build_kernels(work, "mlp", "--set", "N=8")
    iters = 3
    micro = _gpu_run(work, "mlp", "--iters", str(iters), "--set", "N=8", "--micro-batches", "2", "--save",
                     "tr_micro.npz")  # fmt: skip
    assert micro["rc"] == 0, micro["stderr"]
    port = _free_port()
    ranks = [_gpu_rank(work, r, 2, port, "--iters", str(iters), "--save", "tr_two.npz", tag="tr", NCCL_DEBUG="INFO")
             for r in (0, 1)]  # fmt: skip
    got = _launch([c for c, _ in ranks], [e for _, e in ranks], work)
    assert [g["rc"] for g in got] == [0, 0], [g["stderr"][-3000:] for g in got]
    said = got[0]["stdout"]
    assert "2 rank(s) [torchrun (RANK=0, WORLD_SIZE=2)]" in said, said[-3000:]
    assert f"2 ranks, rendezvous NCCL_COMM_ID=127.0.0.1:{port + 1})" in said  # MASTER_PORT + 1
    assert "iter" not in got[1]["stdout"]  # rank 0 alone prints
    assert all("nranks 2 cudaDev 0 busId 0" in g["stderr"] and "over TCP) - Init COMPLETE" in g["stderr"]
               for g in got)  # fmt: skip
    assert "graph: on" in said
    assert [int((work / f"callstr.{r}").read_text()) for r in (0, 1)] == [3 * iters + 1] * 2
    assert _losses(said) == [f"{x:.4f}" for x in micro["losses"]]
    assert _differ(_params(work / "tr_two.npz"), _params(work / "tr_micro.npz")) == []
    # LOCAL_RANK picks the GPU: with one emulated GPU, rank 1 (local rank 1) is refused, naming GPU 1
    port = _free_port()
    ranks = [_gpu_rank(work, r, 2, port, "--iters", "1", EMULATED_GPUS="1", DEEPDSL_DP_TIMEOUT="10") for r in (0, 1)]
    one_gpu = _launch([c for c, _ in ranks], [e for _, e in ranks], work, 120)
    assert one_gpu[1]["rc"] == 1 and "GPU 1 (this rank's local rank) is not among this machine's 1" in \
        one_gpu[1]["stderr"]  # fmt: skip
    assert one_gpu[0]["rc"] != 0  # its peer never came: an error, not a hang


@needs_mpich
def test_a_gpu_rank_whose_peer_never_comes_or_dies_ends_with_an_error(work: Path) -> None:
    """Never a hang: rank 0 started alone (its peer never comes) fails when the stand-in's rendezvous times out
    (FAKE_NCCL_TIMEOUT) or, where NCCL would wait longer, at the runner's own deadline (DEEPDSL_DP_TIMEOUT), naming
    the rendezvous; rank 1 told another MASTER_PORT cannot reach rank 0; a rank killed mid-run makes the other's
    NCCL report the peer gone (ncclRemoteError) and its watchdog end it."""
    _build_kernels(work, "mlp", "--set", "N=8")
    port = _free_port()
    at = f"NCCL_COMM_ID=127.0.0.1:{port + 1}"
    t0 = time.monotonic()
    cmd, env = _gpu_rank(work, 0, 2, port, "--iters", "2", FAKE_NCCL_TIMEOUT="4", NCCL_DEBUG="WARN")
    (alone,) = _launch([cmd], [env], work, 120)
    assert alone["rc"] == 1 and time.monotonic() - t0 < 60, alone["stderr"]
    assert f"error: rank 0: ncclCommInitRank failed (NCCL error 2: unhandled system error (run with NCCL_DEBUG=INFO " \
           f"for details)) at NCCL's rendezvous ({at}): did every rank start, and can they reach it?" \
           in alone["stderr"]  # fmt: skip
    assert f"waited 4 s at NCCL_COMM_ID 127.0.0.1:{port + 1} for 1 of its 1 peer ranks" in alone["stderr"]
    # the stand-in patient (as NCCL), the runner's deadline ends both: rank 1 looks for rank 0 at another port
    other = _free_port()
    ranks = [_gpu_rank(work, r, 2, (port, other)[r], "--iters", "2", DEEPDSL_DP_TIMEOUT="4") for r in (0, 1)]
    t0 = time.monotonic()
    apart = _launch([c for c, _ in ranks], [e for _, e in ranks], work, 120)
    assert [g["rc"] for g in apart] == [1, 1] and time.monotonic() - t0 < 60
    for r, p in ((0, port), (1, other)):
        assert f"error: rank {r}: NCCL's rendezvous (NCCL_COMM_ID=127.0.0.1:{p + 1}) did not finish within 4 s " \
               "(DEEPDSL_DP_TIMEOUT): another rank did not start, died or stalled" in apart[r]["stderr"]  # fmt: skip
    # a rank killed mid-run: the other's NCCL reports it gone, its watchdog aborts
    port = _free_port()
    ranks = [_gpu_rank(work, r, 2, port, "--iters", "100000", NCCL_DEBUG="WARN") for r in (0, 1)]
    procs = [subprocess.Popen(c, env=e, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for c, e in ranks]  # fmt: skip
    try:
        _progress(procs[0], 3)
        procs[1].kill()
        _, err = procs[0].communicate(timeout=60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert procs[0].returncode == 1, err
    assert "error: rank 0: NCCL reported NCCL error 6: remote process exited or there was a network error (a rank " \
           "died or the network failed); the communicator was aborted" in err  # fmt: skip
    assert "rank 1's connection closed during a collective (the process died or aborted)" in err


def _progress(proc: subprocess.Popen, step: int, timeout: float = 180) -> None:
    """Read `proc`'s output until the progress line of `step` (rank 0 prints it)."""
    t0 = time.monotonic()
    while not re.search(rf"iter +{step}/", line := proc.stdout.readline()):
        assert line or proc.poll() is None, proc.stderr.read()
        assert time.monotonic() - t0 < timeout, "the run did not start"


# ---- the Java CUDA device on the stand-in driver, as torchrun launches it ----


def _java_rank(folder: Path, rank: int, size: int, port: int, *args: str, tag: str = "", **extra: str) -> tuple:
    """Rank `rank`'s command (the compiled MLP on the stand-in GPU 0) and its torchrun environment."""
    _, lib = mpi()
    cp = f"{folder / 'build'}:{folder / 'src'}:{jcuda_jars()}/*:{jna_jar()}"
    cmd = ["java", "-Ddeepdsl.gpu=0", f"-Dorg.bytedeco.javacpp.cachedir={folder / 'javacpp'}", "-cp", cp, "MLP",
           "--data", "synthetic", "--device", "cuda", "--kernels", "own", *args]  # fmt: skip
    env = launch_env(LD_LIBRARY_PATH=str(folder / "fake"), DEEPDSL_FAKE_CUDA_KERNELS=str(folder / "MLP" /
                     "emulated.so"), PATH=f"{lib.parent / 'bin'}:/usr/bin:/bin")  # fmt: skip
    env = _torchrun_env(env, rank, size, port) | {"FAKE_NCCL_CALLS": str(folder / f"nccl{tag}.{rank}"), **extra}
    return cmd, env


@pytest.mark.java
@JAVA_MARKS[1]
def test_two_java_cuda_ranks_launched_as_torchrun_does_equal_two_micro_batches(program: Path) -> None:
    """The compiled program's CUDA device as two plain processes with torchrun's variables: NCCL_COMM_ID set by the
    program to MASTER_ADDR:(MASTER_PORT+1), the stand-in over TCP, the all-reduces inside the replayed graph; the
    one-process --micro-batches 2 run's losses and parameters bit for bit; LOCAL_RANK picks the GPU. Rank 0 alone
    (its peer never comes) ends at the program's rendezvous deadline, or at NCCL's own failure, naming the
    rendezvous."""
    iters = 3
    micro = _java_run(program, "--iters", str(iters), "--micro-batches", "2", "--save", "tr_micro.npz", ranks=0)
    assert micro["rc"] == 0, micro["stderr"]
    port = _free_port()
    ranks = [_java_rank(program, r, 2, port, "--json", "--iters", str(iters), "--save", "tr_two.npz", tag="tr",
                        NCCL_DEBUG="INFO") for r in (0, 1)]  # fmt: skip
    got = _launch([c for c, _ in ranks], [e for _, e in ranks], program)
    assert [g["rc"] for g in got] == [0, 0], [g["stderr"][-3000:] for g in got]
    assert [g["objects"] for g in got] == [1, 0]  # rank 0 alone writes --json
    assert f"2 ranks, rendezvous NCCL_COMM_ID=127.0.0.1:{port + 1}" in got[0]["stderr"]  # MASTER_PORT + 1
    assert all("nranks 2 cudaDev 0 busId 0" in g["stderr"] and "over TCP) - Init COMPLETE" in g["stderr"]
               for g in got)  # fmt: skip
    assert [int((program / f"nccltr.{r}").read_text()) for r in (0, 1)] == [3 * iters + 1] * 2
    assert got[0]["losses"] == micro["losses"]
    want = _params(program / "tr_micro.npz")
    assert all(np.array_equal(v, want[k]) for k, v in _params(program / "tr_two.npz").items())
    # LOCAL_RANK picks the GPU: rank 1 (local rank 1) without -Ddeepdsl.gpu=0 is refused, the stand-in driver having one
    cmd, env = _java_rank(program, 1, 2, _free_port(), "--iters", "1")
    (local,) = _launch([[a for a in cmd if a != "-Ddeepdsl.gpu=0"]], [env], program, 120)
    assert local["rc"] == 1
    assert "GPU 1 (deepdsl.gpu, a rank's local rank) is not among this machine's 1 GPU" in local["stderr"]
    # rank 0 alone: the program's deadline (the stand-in as patient as NCCL), then the stand-in's own timeout
    port = _free_port()
    at = f"NCCL_COMM_ID=127.0.0.1:{port + 1}"
    for extra, said in (({"DEEPDSL_DP_TIMEOUT": "4"}, f"error: rank 0: NCCL's rendezvous ({at}) did not finish "
                         "within 4 s (the timeout is deepdsl.collective.timeout or DEEPDSL_DP_TIMEOUT): another rank "
                         "did not start, died or stalled"),
                        ({"FAKE_NCCL_TIMEOUT": "4"}, f"error: rank 0: ncclCommInitRank failed: NCCL error 2 "
                         f"(rendezvous {at}: did every rank start, and can they reach it?)")):  # fmt: skip
        cmd, env = _java_rank(program, 0, 2, port, "--iters", "2", **extra)
        t0 = time.monotonic()
        (alone,) = _launch([cmd], [env], program, 120)
        assert alone["rc"] == 1 and time.monotonic() - t0 < 60
        assert said in alone["stderr"], alone["stderr"]


# ---- the real torchrun (PyTorch's), where installed ----


def _under_torchrun(work: Path, tag: str, *torchrun: str) -> list[str]:
    """torchrun's command line running a rank's command (the arguments after it) through `sh`, which writes the
    MASTER_ADDR:MASTER_PORT the rank was given and its process id to files, and points FAKE_NCCL_CALLS at a file
    of its own."""
    # no `$$`: torchrun substitutes its macros in the arguments with string.Template, where `$$` means `$`; the
    # shell's `read` (a builtin) opens /proc/self/stat as itself
    each = (f'echo "$MASTER_ADDR:$MASTER_PORT" > {work}/master{tag}.$RANK; read pid rest < /proc/self/stat; '
            f'echo $pid > {work}/pid{tag}.$RANK; FAKE_NCCL_CALLS={work}/calls{tag}.$RANK exec "$@"')  # fmt: skip
    return [str(TORCHRUN), *torchrun, "--no-python", "sh", "-c", each, "sh"]


def _end_ranks(work: Path, tag: str) -> None:
    """Kill the ranks of `tag` still alive (by the process ids they wrote, where that process's command line still
    names `work`: not a process id reused since): a torchrun killed on a test's timeout leaves its workers behind."""
    for f in work.glob(f"pid{tag}.*"):
        try:
            pid = int(f.read_text())
            if str(work) in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                os.kill(pid, signal.SIGKILL)
        except (ValueError, OSError):
            pass


def _torchrun(cmd: list[str], env: dict[str, str], cwd: Path, tag: str, timeout: float = 300) -> dict:
    """Run torchrun's command line to its end (failing the test past `timeout`: a hang); no rank outlives it."""
    p = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        pytest.fail(f"torchrun hung past {timeout} s: {err[-3000:]}")
    finally:
        if p.poll() is None:
            p.kill()
        _end_ranks(cwd, tag)
    return {"rc": p.returncode, "stdout": out, "stderr": err}


def _masters(work: Path, tag: str) -> tuple[str, int]:
    """The MASTER_ADDR and MASTER_PORT torchrun gave the ranks (the same to both)."""
    seen = {(work / f"master{tag}.{r}").read_text().strip() for r in (0, 1)}
    assert len(seen) == 1, seen
    host, port = seen.pop().rsplit(":", 1)
    return host, int(port)


@needs_torchrun
@needs_mpich
def test_the_real_torchrun_launches_two_gpu_ranks_equal_to_two_micro_batches(work: Path) -> None:
    """`torchrun --standalone --nproc_per_node=2 --no-python python emulated_rank.py ... run mlp.ddsl --device cuda`:
    torchrun's own store holds MASTER_PORT, NCCL's rendezvous is MASTER_ADDR:(MASTER_PORT+1), the stand-in meets
    and reduces over TCP; two ranks equal one process of --micro-batches 2 bit for bit."""
    _build_kernels(work, "mlp", "--set", "N=8")
    iters = 3
    micro = _gpu_run(work, "mlp", "--iters", str(iters), "--set", "N=8", "--micro-batches", "2", "--save",
                     "rt_micro.npz")  # fmt: skip
    assert micro["rc"] == 0, micro["stderr"]
    cmd = _under_torchrun(work, "rt", "--standalone", "--nproc_per_node=2")
    cmd += [sys.executable, str(HERE / "emulated_rank.py"), str(work / "emulated_mlp"), "run", MLP, "--data",
            "synthetic", "--device", "cuda", "--kernels", "own", "--set", "N=8", "--iters", str(iters), "--save",
            "rt_two.npz"]  # fmt: skip
    r = _torchrun(cmd, _plain(_env(work)) | {"NCCL_DEBUG": "INFO"}, work, "rt")
    assert r["rc"] == 0, r["stderr"][-4000:]
    host, port = _masters(work, "rt")
    assert "2 rank(s) [torchrun (RANK=0, WORLD_SIZE=2)]" in r["stdout"]
    assert f"2 ranks, rendezvous NCCL_COMM_ID={host}:{port + 1})" in r["stdout"]  # MASTER_PORT + 1
    assert r["stderr"].count("nranks 2 cudaDev 0 busId 0") == 2 and "over TCP) - Init COMPLETE" in r["stderr"]
    assert [int((work / f"callsrt.{k}").read_text()) for k in (0, 1)] == [3 * iters + 1] * 2
    assert _losses(r["stdout"]) == [f"{x:.4f}" for x in micro["losses"]]
    assert _differ(_params(work / "rt_two.npz"), _params(work / "rt_micro.npz")) == []


@needs_torchrun
@needs_mpich
def test_under_the_real_torchrun_a_killed_gpu_rank_ends_the_run_with_an_error(work: Path) -> None:
    """A rank killed (SIGKILL) mid-run under torchrun: the run ends with torchrun's error naming the rank and its
    signal, within the timeout; no rank is left behind."""
    _build_kernels(work, "mlp", "--set", "N=8")
    cmd = _under_torchrun(work, "kill", "--standalone", "--nproc_per_node=2")
    cmd += [sys.executable, str(HERE / "emulated_rank.py"), str(work / "emulated_mlp"), "run", MLP, "--data",
            "synthetic", "--device", "cuda", "--kernels", "own", "--set", "N=8", "--iters", "100000"]  # fmt: skip
    p = subprocess.Popen(cmd, env=_plain(_env(work)), cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)  # fmt: skip
    try:
        _progress(p, 3)
        pids = [int((work / f"pidkill.{r}").read_text()) for r in (0, 1)]
        os.kill(pids[1], signal.SIGKILL)
        t0 = time.monotonic()
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
        _end_ranks(work, "kill")
    assert p.returncode != 0 and time.monotonic() - t0 < 60
    assert re.search(r"local_rank: +1 \(pid: " + str(pids[1]) + r"\)[\s\S]*Signal 9 \(SIGKILL\)", err), err[-3000:]
    assert not Path(f"/proc/{pids[0]}").exists() or "zombie" in Path(f"/proc/{pids[0]}/status").read_text().lower()


@needs_torchrun
@pytest.mark.java
@JAVA_MARKS[1]
def test_the_real_torchrun_launches_two_java_cuda_ranks_equal_to_two_micro_batches(program: Path) -> None:
    """`torchrun --nproc_per_node=2 --master_addr=127.0.0.1 --master_port=P --no-python java ... MLP --device cuda`:
    torchrun's store at P, the program's NCCL rendezvous at P+1 (the stand-in over TCP); the one-process
    --micro-batches 2 run's losses and parameters bit for bit."""
    iters = 3
    micro = _java_run(program, "--iters", str(iters), "--micro-batches", "2", "--save", "rj_micro.npz", ranks=0)
    assert micro["rc"] == 0, micro["stderr"]
    port = _free_port()
    java, env = _java_rank(program, 0, 1, port, "--json", "--iters", str(iters), "--save", "rj_two.npz")
    cmd = _under_torchrun(program, "rj", "--nnodes=1", "--nproc_per_node=2", "--master_addr=127.0.0.1",
                          f"--master_port={port}") + java  # fmt: skip
    r = _torchrun(cmd, _plain(env) | {"NCCL_DEBUG": "INFO"}, program, "rj")
    assert r["rc"] == 0, r["stderr"][-4000:]
    assert _masters(program, "rj") == ("127.0.0.1", port)
    assert f"2 ranks, rendezvous NCCL_COMM_ID=127.0.0.1:{port + 1}" in r["stderr"]  # MASTER_PORT + 1
    assert r["stderr"].count("nranks 2 cudaDev 0 busId 0") == 2 and "over TCP) - Init COMPLETE" in r["stderr"]
    objects = [line for line in r["stdout"].splitlines() if line.startswith("{")]
    assert len(objects) == 1  # rank 0 alone writes --json
    assert [int((program / f"callsrj.{k}").read_text()) for k in (0, 1)] == [3 * iters + 1] * 2
    assert json.loads(objects[0])["losses"] == micro["losses"]
    want = _params(program / "rj_micro.npz")
    assert all(np.array_equal(v, want[k]) for k, v in _params(program / "rj_two.npz").items())


def _torch_python() -> str | None:
    """The Python whose torchrun TORCHRUN is (its script's `#!` line), which has PyTorch."""
    try:
        first = Path(str(TORCHRUN)).read_bytes()[:300].split(b"\n")[0].decode()
    except (OSError, UnicodeDecodeError):
        return None
    python = first[2:].strip().split()[0] if first.startswith("#!") and first[2:].strip() else ""
    return python if python and Path(python).exists() else None


@needs_torchrun
@needs_mpich
def test_the_gpu_machines_nccl_check_runs_end_to_end_under_the_real_torchrun(work: Path, tmp_path: Path) -> None:
    """scripts/gpu_nccl_check.py as scripts/gpu_check.sh runs it (in the repository, on the Python that has
    PyTorch), with the runner on the emulated GPU (DEEPDSL_NCCL_CHECK_RUNNER: emulated_rank.py) and the stand-in
    NCCL: the one-rank torchrun runs (DEEPDSL_DP_FORCE=1) equal the plain run and say NCCL's "Init COMPLETE"; the two
    ranks sharing GPU 0 train and equal --micro-batches 2 (the stand-in does not refuse a shared GPU as NCCL does)."""
    python = _torch_python()
    if python is None:
        pytest.skip(f"{TORCHRUN} is not a Python script whose interpreter exists (the check runs on torch's Python)")
    _build_kernels(work, "lenet", "--set", "N=2")  # before the script's runs, each of which has 120 s
    runner = f"{sys.executable} {HERE / 'emulated_rank.py'} {work / 'emulated_lenet'}"
    env = _plain(_env(work)) | {"DEEPDSL_NCCL_CHECK_RUNNER": runner, "EMULATED_GPUS": "1"}
    r = subprocess.run([python, "scripts/gpu_nccl_check.py", str(tmp_path), "--set N=2", "2"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    report = json.loads((tmp_path / "nccl_pycuda.json").read_text())
    assert r.returncode == 0 and report["pass"] is True, (r.stdout, r.stderr[-3000:])
    for tag in ("nccl_one_rank", "nccl_one_rank_nograph"):
        assert report[tag]["against_plain"]["equal"] is True
        assert "nranks 1 cudaDev 0" in report[tag]["nccl_init"][0] and "over TCP" in report[tag]["nccl_init"][0]
        assert "torch.distributed.run --standalone --nproc_per_node=1" in (tmp_path / f"{tag}.log").read_text()
    assert report["nccl_one_rank_nograph"]["gpu_graph"] == "off (--no-graph)"
    two = report["two_ranks_one_gpu"]
    assert two["outcome"] == "trained" and two["against_micro_batches_2"]["equal"] is True
    assert "--nproc_per_node=2 --no-python env LOCAL_RANK=0" in (tmp_path / "nccl_two_ranks.log").read_text()
