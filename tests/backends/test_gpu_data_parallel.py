"""The PyCUDA runner's data-parallel training (issue 32) without a GPU: `mpiexec -n 2` of `deepdsl run --device
cuda` with the runner on the emulated GPU (cuda_emulator.EmulatedDriver, through emulated_rank.py) and NCCL's
stand-in (fake_libnccl.c, built against MPICH's ABI: its all-reduce is MPI's on the emulated device memory, its calls
recorded into the captured CUDA graph and made at each replay). Two ranks of batch N must give the parameters of one
process with `--micro-batches 2` on the same runner bit for bit, inside the graph and call for call; a dropout
network's shards must draw what the whole batch draws (the *_at kernels' offsets); NCCL missing or too old, other
seeds, a stalled rank are errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from cuda_emulator import EmulatedDriver

from deepdsl import running
from deepdsl.cli import cli

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).parent
sys.path.insert(0, str(ROOT / "tests"))
from dp_nets import DROPOUT, RESIDUAL  # noqa: E402

VENV = Path(sys.executable).parent.parent
MPIEXEC = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or shutil.which("mpiexec")
MPICH = VENV / "lib" / "libmpi.so.12"  # MPICH's own ABI, which mpi4py's wheel loads

needs_mpich = pytest.mark.skipif(
    MPIEXEC is None or not MPICH.exists() or not (VENV / "include" / "mpi.h").exists()
    or shutil.which("g++") is None,
    reason="needs mpiexec and MPICH's libmpi.so.12 and mpi.h (pip install 'deepdsl[dist]') and g++",
)  # fmt: skip


def _env(work: Path, nccl: bool = True, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "OMPI_", "SLURM_", "DEEPDSL_DP", "MPI_LOCAL", "NCCL_", "FAKE_NCCL"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}  # fmt: skip
    env.update(PYTHONPATH=str(ROOT), OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", EMULATED_GPUS="2",
               LD_LIBRARY_PATH=str(work / ("nccl" if nccl else "nonccl")), DEEPDSL_DP_TIMEOUT="120")  # fmt: skip
    env.update(extra)
    return env


def _run(work: Path, net: str, *args: str, ranks: int = 1, tag: str = "", nccl: bool = True,
         own: tuple[tuple[str, ...], ...] = (), as_json: bool = True, **extra: str) -> dict:  # fmt: skip
    """`deepdsl run NET --device cuda` on the emulated GPU (under `mpiexec -n ranks` for ranks > 1; `own`: each
    rank's own further arguments): rank 0's --json object with the return code, its output and the ranks'
    all-reduce counts (FAKE_NCCL_CALLS)."""
    path = {"mlp": str(ROOT / "networks" / "mlp.ddsl"), "lenet": str(ROOT / "networks" / "lenet.ddsl")}.get(net)
    path = path or str(work / f"{net}.ddsl")
    emulated = work / f"emulated_{net}"  # one build of the kernels per network (the ranks share it)
    cmd = [sys.executable, str(HERE / "emulated_rank.py"), str(emulated), "run", path, "--data", "synthetic",
           "--device", "cuda", "--kernels", "own", *(["--json"] if as_json else []), *args]  # fmt: skip
    if ranks > 1:
        calls = ["sh", "-c", f'FAKE_NCCL_CALLS={work}/calls{tag}.$PMI_RANK exec "$@"', "sh"]
        if own:
            cmd = [
                str(MPIEXEC),
                *[x for k, more in enumerate(own) for x in ([":"] if k else []) + ["-n", "1", *cmd, *more]],
            ]
        else:
            cmd = [str(MPIEXEC), "-n", str(ranks), *calls, *cmd]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=work, env=_env(work, nccl, **extra),
                       check=False)  # fmt: skip
    out = [line for line in r.stdout.splitlines() if line.startswith("{")]
    got = {"rc": r.returncode, "stdout": r.stdout, "stderr": r.stderr, "objects": len(out)}
    if len(out) == 1:
        got.update(json.loads(out[0]))
    if ranks > 1:
        got["calls"] = [int(p.read_text()) if (p := work / f"calls{tag}.{k}").exists() else None for k in range(ranks)]
    return got


def _build_kernels(work: Path, net: str, *sets: str) -> None:
    """The network's emulated kernels built by one process (no iteration) before two ranks start (else both would
    write the same library at once)."""
    if not (work / f"emulated_{net}" / "emulated.so").exists():
        got = _run(work, net, "--iters", "0", "--micro-batches", "2", *sets)
        assert got["rc"] == 0, got["stderr"]


def _params(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as f:
        return {k: f[k] for k in f.files}


def _differ(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> list[str]:
    """The arrays that are not the same bit for bit."""
    assert a.keys() == b.keys()
    return [k for k in a if a[k].dtype != b[k].dtype or a[k].tobytes() != b[k].tobytes()]


def _two_ranks_equal_two_micro_batches(work: Path, net: str, iters: int, buckets: int, *sets: str,
                                       eager: bool = True) -> None:  # fmt: skip
    """Two ranks of N (graph on from step 2, then call for call) against one process of two micro-batches of N on
    the same runner: the same losses and parameters, bit for bit; every step's buckets all-reduced on both ranks."""
    base = ["--iters", str(iters), *sets]
    micro = _run(work, net, *base, "--micro-batches", "2", "--save", f"{net}_micro.npz")
    assert micro["rc"] == 0, micro["stderr"]
    assert micro["gpu_graph"] == "off (--micro-batches 2)"
    want = _params(work / f"{net}_micro.npz")
    for flags, graph in (((), "on"), (("--no-graph",), "off (--no-graph)"))[: 2 if eager else 1]:
        tag = f"{net}{''.join(flags)}"
        two = _run(work, net, *base, *flags, "--save", f"{tag}.npz", ranks=2, tag=tag)
        assert two["rc"] == 0, two["stderr"]
        assert two["objects"] == 1  # rank 0 alone writes --json
        assert two["gpu_graph"] == graph
        assert two["calls"] == [buckets * iters + 1] * 2  # each step's buckets, and the start-up check's
        assert two["losses"] == micro["losses"]
        assert _differ(_params(work / f"{tag}.npz"), want) == []
    # what the micro-batches allocate beside the one-micro-batch rank's plan: memcheck's accumulators
    path = ROOT / "networks" / f"{net}.ddsl" if net in ("mlp", "lenet") else work / f"{net}.ddsl"
    mem = CliRunner().invoke(cli, ["memcheck", str(path), *sets, "--micro-batches", "2", "--json"])
    assert micro["gpu_planned_bytes"] - two["gpu_planned_bytes"] == json.loads(mem.output)["accumulator_bytes"] > 0


@needs_mpich
def test_two_gpu_ranks_over_nccl_equal_two_micro_batches_in_the_graph(work: Path) -> None:
    """The default suite's two-rank run: the small dropout network, its step replayed as a graph."""
    _two_ranks_equal_two_micro_batches(work, "drop", 3, 2, eager=False)


@needs_mpich
@pytest.mark.slow
def test_two_gpu_ranks_over_nccl_equal_two_micro_batches_mlp(work: Path) -> None:
    _two_ranks_equal_two_micro_batches(work, "mlp", 3, 3, "--set", "N=8")


@needs_mpich
@pytest.mark.slow
def test_two_gpu_ranks_over_nccl_equal_two_micro_batches_lenet(work: Path) -> None:
    _two_ranks_equal_two_micro_batches(work, "lenet", 2, 3, "--set", "N=4")


@needs_mpich
@pytest.mark.slow
def test_two_gpu_ranks_over_nccl_equal_two_micro_batches_batch_norm_residual(work: Path) -> None:
    _two_ranks_equal_two_micro_batches(work, "res", 3, 2)


@needs_mpich
@pytest.mark.slow
def test_two_gpu_ranks_draw_dropout_at_their_global_positions(work: Path) -> None:
    """A dropout network: the shards' masks are the global batch's (the *_at kernels from the shard's offset), so two
    ranks equal two micro-batches bit for bit, and the NumPy runner's micro-batches within rounding."""
    _two_ranks_equal_two_micro_batches(work, "drop", 3, 2)
    r = CliRunner().invoke(cli, ["run", str(work / "drop.ddsl"), "--iters", "3", "--data", "synthetic", "--device",
                                 "cpu", "--micro-batches", "2", "--save", str(work / "drop_cpu.npz")])  # fmt: skip
    assert r.exit_code == 0, r.output
    gpu, cpu = _params(work / "drop_micro.npz"), _params(work / "drop_cpu.npz")
    for k in cpu:
        np.testing.assert_allclose(gpu[k], cpu[k], rtol=1e-5, atol=1e-6, err_msg=k)


def _emulate_the_gpu(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    """`--device cuda` in this process opens the emulated GPU (its kernels built in `folder`); cpu stays itself."""
    cpu = running.open_device

    def emulated(device: str, double: bool = False, kernels: str = "auto", tf32: bool = False, gpu: int = 0) -> tuple:
        if device == "cpu":
            return cpu(device)
        return EmulatedDriver(folder), "cuda (emulated)", None

    monkeypatch.setattr(running, "open_device", emulated)


def test_micro_batches_on_the_gpu_runner_draw_the_whole_batchs_dropout(tmp_path: Path, monkeypatch) -> None:
    """In one process (no MPI, no NCCL): the dropout network's two micro-batches on the emulated GPU give the NumPy
    runner's training within rounding, which they do only where each micro-batch's masks start at its offset in the
    global batch (the same masks for both would differ)."""
    _emulate_the_gpu(monkeypatch, tmp_path / "emulated")
    (tmp_path / "drop.ddsl").write_text(DROPOUT)
    runs = {}
    for device in ("cuda", "cpu"):
        r = CliRunner().invoke(cli, ["run", str(tmp_path / "drop.ddsl"), "--iters", "3", "--data", "synthetic",
                                     "--micro-batches", "2", "--device", device, "--json", "--save",
                                     str(tmp_path / f"{device}.npz")])  # fmt: skip
        assert r.exit_code == 0, r.output
        runs[device] = json.loads(r.output.strip().splitlines()[-1])
    assert runs["cuda"]["device"] == "cuda" and runs["cuda"]["gpu_graph"] == "off (--micro-batches 2)"
    np.testing.assert_allclose(runs["cuda"]["losses"], runs["cpu"]["losses"], rtol=1e-6)
    gpu, cpu = _params(tmp_path / "cuda.npz"), _params(tmp_path / "cpu.npz")
    for k in cpu:
        np.testing.assert_allclose(gpu[k], cpu[k], rtol=1e-5, atol=1e-7, err_msg=k)


@needs_mpich
def test_a_missing_or_old_nccl_is_named(work: Path) -> None:
    one = ("--iters", "1", "--set", "N=8", "--ranks", "2", "--rank", "0")
    missing = _run(work, "mlp", *one, nccl=False)
    assert missing["rc"] == 1
    assert "error: rank 0: data-parallel training on the GPU needs NCCL 2.19 or later (libnccl.so.2): pip install " \
           "nvidia-nccl-cu13" in missing["stderr"]  # fmt: skip
    old = _run(work, "mlp", *one, FAKE_NCCL_VERSION="21805")
    assert old["rc"] == 1
    assert "NCCL 2.18.5" in old["stderr"] and "is older than 2.19" in old["stderr"]


@needs_mpich
@pytest.mark.slow
def test_torchruns_master_is_ncclS_rendezvous_and_other_seeds_are_refused(work: Path) -> None:
    args = ("--iters", "2", "--set", "N=8")
    _build_kernels(work, "mlp", "--set", "N=8")
    master = _run(work, "mlp", *args, ranks=2, tag="master", as_json=False, MASTER_ADDR="127.0.0.1",
                  MASTER_PORT="29500")  # fmt: skip
    assert master["rc"] == 0, master["stderr"]
    assert "2 rank(s) [MPICH/PMI (PMI_RANK=0, PMI_SIZE=2)] x 1 micro-batch(es) of 8: global batch 16 (NCCL 2.29.3 " \
           "(libnccl.so.2), 2 ranks, rendezvous NCCL_COMM_ID=127.0.0.1:29501)" in master["stdout"]  # fmt: skip
    plain = _run(work, "mlp", *args, ranks=2, tag="plain", as_json=False)
    assert "rendezvous the id broadcast through MPI" in plain["stdout"]
    losses = [line.split("loss ")[1].split()[0] for line in master["stdout"].splitlines() if "iter " in line]
    assert len(losses) == 2 and losses == [line.split("loss ")[1].split()[0] for line in plain["stdout"].splitlines()
                                           if "iter " in line]  # fmt: skip
    seeds = _run(work, "mlp", *args, ranks=2, tag="seeds", own=(("--seed", "1"), ("--seed", "2")))
    assert seeds["rc"] == 1
    assert "the checksum of the plan and the parameters of rank 1 differs from rank 0's" in seeds["stderr"]


@needs_mpich
@pytest.mark.slow
def test_a_stalled_gpu_rank_stops_the_other_within_the_timeout(work: Path) -> None:
    _build_kernels(work, "mlp", "--set", "N=8")
    t0 = time.monotonic()
    got = _run(work, "mlp", "--iters", "4", "--set", "N=8", ranks=2, tag="stall", DEEPDSL_DP_TIMEOUT="5",
               DEEPDSL_DP_FAULT="1:2:stall")  # fmt: skip
    assert got["rc"] != 0 and time.monotonic() - t0 < 120
    assert "error: rank 0: a step waited 5 s for the other ranks, which died or stalled (DEEPDSL_DP_TIMEOUT); the " \
           "communicator was aborted" in got["stderr"]  # fmt: skip


def test_bf16_gradients_are_packed_into_the_float32_buckets(tmp_path: Path, monkeypatch) -> None:
    """Under --precision bf16 a weight's gradient is stored in bf16 and its bucket in float32 (ops/collective.py): the
    pack kernel widens it. The batch-norm/residual network's two micro-batches on the emulated GPU give the bf16 NumPy
    runner's losses within bf16 rounding."""
    _emulate_the_gpu(monkeypatch, tmp_path / "emulated")
    (tmp_path / "res.ddsl").write_text(RESIDUAL)
    losses = {}
    for device in ("cuda", "cpu"):
        r = CliRunner().invoke(cli, ["run", str(tmp_path / "res.ddsl"), "--iters", "3", "--data", "synthetic",
                                     "--micro-batches", "2", "--precision", "bf16", "--device", device,
                                     "--json"])  # fmt: skip
        assert r.exit_code == 0, r.output
        losses[device] = json.loads(r.output.strip().splitlines()[-1])["losses"]
    # the bf16 tests' tolerance for a few steps (test_bf16_cuda.py): bf16 ulps, not an unwidened bucket's garbage
    np.testing.assert_allclose(losses["cuda"], losses["cpu"], rtol=5e-3)


@needs_mpich
@pytest.mark.slow  # 4.4 s; the two-rank runs below keep NCCL's path in the default tier
def test_one_forced_gpu_rank_goes_through_nccl_and_equals_the_plain_run(work: Path) -> None:
    """DEEPDSL_DP_FORCE=1 (scripts/gpu_check.sh's one-rank NCCL run): one process, no launcher, still through the
    data-parallel pass and a one-rank NCCL communicator (every step's buckets all-reduced, inside the graph and call
    for call), and the plain run's losses and parameters bit for bit."""
    base = ("--iters", "3")
    plain = _run(work, "drop", *base, "--save", "drop_plain.npz")
    assert plain["rc"] == 0, plain["stderr"]
    want = _params(work / "drop_plain.npz")
    for flags, graph in (((), "on"), (("--no-graph",), "off (--no-graph)")):
        tag = f"force{''.join(flags)}"
        calls = work / f"calls{tag}.0"
        one = _run(work, "drop", *base, *flags, "--save", f"{tag}.npz", DEEPDSL_DP_FORCE="1",
                   FAKE_NCCL_CALLS=str(calls))  # fmt: skip
        assert one["rc"] == 0, one["stderr"]
        assert one["gpu_graph"] == graph
        assert int(calls.read_text()) == 2 * 3 + 1  # each step's two buckets, and the start-up check's
        assert one["losses"] == plain["losses"]
        assert _differ(_params(work / f"{tag}.npz"), want) == []
