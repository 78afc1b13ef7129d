"""Data-parallel training (issue 32): the pass's buckets and their placement, gradient accumulation, the launchers'
environments, and `mpiexec -n 2 deepdsl run` on the NumPy runner checked bit for bit against the same training in
one process over 2 micro-batches, refusing ranks that differ, stopping (not hanging) when a rank dies or stalls,
and resuming exactly from a checkpoint."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from dp_nets import DROPOUT, RESIDUAL
from helpers import ROOT, one_blas_thread

from deepdsl import api
from deepdsl.build import Options
from deepdsl.distributed import (
    Accumulate,
    DistributedError,
    Session,
    World,
    checksum,
    load_mpi,
    parse_fault,
    world_from_env,
)
from deepdsl.ir import REGISTRY
from deepdsl.ops.collective import buckets_of, post_statements
from deepdsl.passes.data_parallel import Bucketing, data_parallel, gradient_buckets
from deepdsl.trainer import Trainer

NETWORKS = ROOT / "networks"
MLP = str(NETWORKS / "mlp.ddsl")
LENET = str(NETWORKS / "lenet.ddsl")

MPIEXEC = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or shutil.which("mpiexec")


def _has_mpi() -> bool:
    try:
        load_mpi()
    except DistributedError:
        return False
    return MPIEXEC is not None


needs_mpi = pytest.mark.skipif(not _has_mpi(), reason="needs mpi4py and mpiexec: pip install 'deepdsl[dist]'")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "SLURM_", "DEEPDSL_DP"))}
    env.update(PYTHONPATH=str(ROOT), OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", **extra)
    return env


def _deepdsl(*args: str, ranks: int = 1, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "deepdsl", *args]
    if ranks > 1:
        cmd = [str(MPIEXEC), "-n", str(ranks), *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, env=_env(**env), timeout=timeout, cwd=ROOT)


def _params(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as f:
        return {k: f[k] for k in f.files}


def _bitwise(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> list[str]:
    assert a.keys() == b.keys()
    return [k for k in a if not np.array_equal(a[k], b[k])]


# ---- the launchers' environments ----


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "node1", "MASTER_PORT": "29500"},
         (3, 8, 1, "torchrun")),
        ({"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "6", "OMPI_COMM_WORLD_LOCAL_RANK": "2"},
         (5, 6, 2, "Open MPI")),
        ({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1"}, (1, 2, 1, "MPICH/PMI")),
        ({"SLURM_PROCID": "9", "SLURM_NTASKS": "16", "SLURM_LOCALID": "1"}, (9, 16, 1, "Slurm")),
        ({"PMI_RANK": "0", "PMI_SIZE": "2", "SLURM_PROCID": "7", "SLURM_NTASKS": "16"}, (0, 2, 0, "MPICH/PMI")),
        # srun --mpi=pmi2 sets PMI_RANK and PMI_SIZE, no MPI_LOCALRANKID: Slurm's local rank, where it is the same world
        ({"PMI_RANK": "3", "PMI_SIZE": "4", "SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1"},
         (3, 4, 1, "MPICH/PMI")),
        ({"PMI_RANK": "1", "PMI_SIZE": "2", "SLURM_PROCID": "7", "SLURM_NTASKS": "16", "SLURM_LOCALID": "3"},
         (1, 2, 0, "MPICH/PMI")),
        ({}, (0, 1, 0, "single process")),
    ],
)  # fmt: skip
def test_every_launchers_environment_is_read(env: dict[str, str], expected: tuple) -> None:
    w = world_from_env(env)
    assert (w.rank, w.size, w.local_rank) == expected[:3]
    assert w.source.startswith(expected[3])


def test_torchruns_master_gives_ncclss_rendezvous_and_flags_override() -> None:
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
    assert world_from_env(env).nccl_comm_id == "10.0.0.1:29501"
    w = world_from_env(env, ranks=4, rank=3)
    assert (w.rank, w.size, w.source) == (3, 4, "the flags --ranks/--rank")
    assert world_from_env(env, ranks=4).rank == 0  # another world than the launcher's: rank from --rank or 0


@pytest.mark.parametrize(
    ("env", "flags", "message"),
    [
        ({"RANK": "x", "WORLD_SIZE": "2"}, {}, "RANK='x' is not a whole number"),
        ({"RANK": "2", "WORLD_SIZE": "2"}, {}, "rank 2 is outside a world of 2 ranks"),
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "0"}, {}, "SLURM_NTASKS='0'"),
        ({}, {"ranks": 2, "rank": 5}, "rank 5 is outside a world of 2"),
    ],
)  # fmt: skip
def test_a_wrong_environment_is_a_diagnostic(env: dict, flags: dict, message: str) -> None:
    with pytest.raises(DistributedError, match=message):
        world_from_env(env, **flags)


def test_fault_injection_syntax() -> None:
    assert parse_fault("1:3:kill") == (1, 3, "kill")
    assert parse_fault(None) is None
    with pytest.raises(DistributedError, match="RANK:STEP:kill"):
        parse_fault("1:kill")


def test_missing_mpi4py_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # import mpi4py fails as when it is not installed
    with pytest.raises(DistributedError, match=r"mpi4py.*pip install 'deepdsl\[dist\]'"):
        load_mpi()


# ---- the pass ----


def _train_graph(path: str, sets: dict | None = None) -> api.Compilation:
    return api.compile_file(path, sets or {}, stop_at="train")


def test_buckets_follow_backward_order_first_small_never_split() -> None:
    c = _train_graph(LENET)
    g = c.train
    cap = 600_000
    buckets, _ = gradient_buckets(g, Bucketing(bucket_bytes=cap, first_bytes=30_000))
    made = {s.out.name: i for i, s in enumerate(g.stmts)}
    order = [made[v.name] for b in buckets for v in b.values]
    assert order == sorted(order)  # backward-production order across and inside buckets
    assert buckets[0].names[0] == "fc2.b"  # the last layer's gradients come first
    assert buckets[0].nbytes <= 30_000 or len(buckets[0].values) == 1
    assert all(b.nbytes <= cap or len(b.values) == 1 for b in buckets)
    assert sorted(n for b in buckets for n in b.names) == sorted(p.value.name for p in g.trainable)
    assert len(buckets) >= 3


def test_starts_overlap_the_backward_pass_and_waits_precede_the_updates() -> None:
    opts = Options(buckets=Bucketing(bucket_bytes=300_000, first_bytes=10_000), verify=True)
    c = api.compile_file(LENET, {}, stop_at="plan", options=opts)
    g = c.build.train_plan.graph  # the order the plan runs
    pos = {s.out.name: i for i, s in enumerate(g.stmts)}
    starts = [s for s in g.stmts if s.op == "allreduce_start" and s.a["kind"] == "grad"]
    assert len(starts) >= 3
    for s in starts:
        last = max(pos[v.name] for v in s.inputs[1:])
        assert pos[s.out.name] == last + 1  # right after its last gradient exists
    first_wait = min(i for i, s in enumerate(g.stmts) if s.op == "allreduce_wait")
    heavy = {"conv2d_backward_data", "conv2d_backward_filter", "matmul", "linear", "max_pool2d_backward"}
    # every bucket but the last overlaps backward work that comes after its start
    for s in starts[:-1]:
        assert any(t.op in heavy for t in g.stmts[pos[s.out.name] + 1 : first_wait])
    post = post_statements(g)
    for i, s in enumerate(g.stmts):  # every update rule reads reduced gradients, after their wait
        if s.op.startswith(("sgd", "adam", "rmsprop")):
            assert s.out.name in post
            assert i > first_wait
    pre = [s for s in g.stmts if s.out.name not in post]
    assert not any(v.name in post for s in pre for v in s.inputs)  # pre never reads post


def test_the_state_bucket_holds_the_loss_and_running_statistics(tmp_path: Path) -> None:
    f = tmp_path / "tiny.ddsl"
    f.write_text(RESIDUAL)
    g = data_parallel(_train_graph(str(f)).train, Bucketing())
    state = [b for b in buckets_of(g) if b.kind == "state"]
    assert len(state) == 1
    names = set(state[0].names)
    assert "loss" in names
    assert {n for n in names if n.endswith(("running_mean", "running_var"))} == {
        p.value.name for p in g.params if p.kind == "state"
    }
    slices = {s.out.name for s in g.stmts if s.op == "bucket_slice"}
    assert dict(g.outputs)["loss"].name in slices
    assert all(v.name in slices for n, v in g.updates if n.endswith(("running_mean", "running_var")))


def test_without_buckets_the_program_is_unchanged() -> None:
    plain = api.compile_file(MLP, {}, stop_at="opt").opt
    assert not any(REGISTRY[s.op].name.startswith("allreduce") for s in plain.stmts)
    assert not any(d.kind == "scale" for d in plain.inputs)


# ---- gradient accumulation in one process ----


def _trainer(path: str, sets: dict, buckets: Bucketing | None, session: Session | None = None) -> Trainer:
    from deepdsl.data.named import fields_of, load_samples

    b = api.build(api.compile_file(path, sets).program, Options(buckets=buckets))
    data = load_samples("synthetic", {}, fields_of(b.program.graph.inputs), b.seed)
    return Trainer(b, data, session=session)


def _train(t: Trainer, steps: int) -> dict[str, np.ndarray]:
    for _ in range(steps):
        t.step()
    return {k: np.array(v) for k, v in t.state().items()}


def test_one_micro_batch_data_parallel_equals_the_plain_program_bit_for_bit() -> None:
    plain = _train(_trainer(MLP, {"N": 8}, None), 3)
    dp = _train(_trainer(MLP, {"N": 8}, Bucketing(bucket_bytes=200_000, first_bytes=5_000)), 3)
    assert _bitwise(plain, dp) == []


def test_micro_batches_equal_the_whole_batch_within_rounding() -> None:
    session = Session(World(), 2, Accumulate())
    micro = _train(_trainer(MLP, {"N": 8}, Bucketing(), session), 3)
    whole = _train(_trainer(MLP, {"N": 16}, None), 3)
    for k in whole:
        if whole[k].dtype.kind == "f":
            assert np.abs(micro[k] - whole[k]).max() <= 1e-6 * max(1.0, np.abs(whole[k]).max()), k
    assert _bitwise(micro, whole)  # not the same sums: rounding differs somewhere


def test_dropout_shards_draw_the_whole_batchs_masks(tmp_path: Path) -> None:
    mask = REGISTRY["dropout_mask"].numpy
    at = REGISTRY["dropout_mask_at"].numpy
    attrs = {"p": 0.5, "site": "d", "seed": 3}
    step = np.int64(4)
    whole = mask((step,), {**attrs, "shape": (8, 5)})
    parts = [at((step, np.int64(o)), {**attrs, "shape": (4, 5)}) for o in (0, 4)]
    assert np.array_equal(np.concatenate(parts), whole)
    for op in ("random_normal", "random_uniform"):
        a = {"site": "z", "seed": 1, "low": -1.0, "high": 1.0}
        whole = REGISTRY[op].numpy((step,), {**a, "shape": (6, 3)})
        parts = [REGISTRY[op + "_at"].numpy((step, np.int64(o)), {**a, "shape": (3, 3)}) for o in (0, 3)]
        assert np.array_equal(np.concatenate(parts), whole)
    # and the pass gives a dropout network the offset input and the shard's draws
    f = tmp_path / "drop.ddsl"
    f.write_text(DROPOUT)
    g = data_parallel(_train_graph(str(f)).train, Bucketing())
    assert any(d.kind == "offset" for d in g.inputs)
    assert any(s.op == "dropout_mask_at" for s in g.stmts) and not any(s.op == "dropout_mask" for s in g.stmts)
    micro = _train(_trainer(str(f), {"N": 4}, Bucketing(), Session(World(), 2, Accumulate())), 3)
    whole = _train(_trainer(str(f), {"N": 8}, None), 3)
    for k in whole:
        if whole[k].dtype.kind == "f":
            assert np.abs(micro[k] - whole[k]).max() <= 1e-6 * max(1.0, np.abs(whole[k]).max()), k


CLIPPED = """
network Clipped
const N = 4
input x : [N, 12]
label y : [N] classes 3
layer fc1 = full(16)
layer fc2 = full(3)
net = fc2 o relu o fc1
loss    = softmax_cross_entropy(net(x), y)
predict = net(x)
train {
  data = synthetic
  optimizer = sgd(lr=0.5, momentum=0.9, clip=0.05)
  iterations = 3
  seed = 4
}
"""


def test_gradient_clipping_takes_the_norm_of_the_reduced_gradients(tmp_path: Path) -> None:
    f = tmp_path / "clipped.ddsl"
    f.write_text(CLIPPED)
    g = data_parallel(_train_graph(str(f)).train, Bucketing())
    post = post_statements(g)
    assert [s.out.name in post for s in g.stmts if s.op in ("sum_squares", "clip_scale")] == [True] * 5
    micro = _train(_trainer(str(f), {"N": 4}, Bucketing(), Session(World(), 2, Accumulate())), 3)
    whole = _train(_trainer(str(f), {"N": 8}, None), 3)
    for k in whole:
        if whole[k].dtype.kind == "f":
            assert np.abs(micro[k] - whole[k]).max() <= 1e-6 * max(1.0, np.abs(whole[k]).max()), k


def test_the_checksum_sees_the_seed() -> None:
    a, b = _trainer(MLP, {"N": 8}, Bucketing()), _trainer(MLP, {"N": 8}, Bucketing())
    g = a.build.train_plan.graph
    assert checksum(g, a.state()) == checksum(g, b.state())
    b.arrays["fc1.W"] = b.arrays["fc1.W"] + np.float32(1e-7)
    assert checksum(g, a.state()) != checksum(g, b.state())


# ---- two processes under mpiexec ----


def _compare(cli, tmp_path: Path, net: str, *flags: str) -> subprocess.CompletedProcess:  # noqa: ANN001
    """Two ranks under mpiexec, bit for bit one process's two micro-batches; the ranks' run. The one process is
    this one (the cli fixture): what is compared is its parameters, and a Python started for it cost more CPU than
    its run; its BLAS on one thread, as the ranks' (OPENBLAS_NUM_THREADS=1)."""
    one, two = tmp_path / "micro.npz", tmp_path / "ranks.npz"
    common = ("run", net, "--iters", "3", "--data", "synthetic", *flags)
    with one_blas_thread():
        r1 = cli(*common, "--micro-batches", "2", "--save", str(one))
    assert r1.exit_code == 0, r1.output
    r2 = _deepdsl(*common, "--save", str(two), "--json", ranks=2)
    assert r2.returncode == 0, r2.stderr
    assert _bitwise(_params(one), _params(two)) == []
    return r2


@needs_mpi
def test_two_ranks_equal_two_micro_batches_bit_for_bit_mlp(cli, tmp_path: Path) -> None:  # noqa: ANN001
    r2 = _compare(cli, tmp_path, MLP, "--set", "N=8")
    outs = [line for line in r2.stdout.splitlines() if line.strip()]
    assert len(outs) == 1  # rank 0 alone writes --json
    result = json.loads(outs[0])
    assert len(result["losses"]) == 3 and "test_accuracy" in result


@pytest.mark.slow
@needs_mpi
def test_two_ranks_equal_two_micro_batches_bit_for_bit_lenet(cli, tmp_path: Path) -> None:  # noqa: ANN001
    _compare(cli, tmp_path, LENET, "--set", "N=8")


@needs_mpi
def test_two_ranks_equal_two_micro_batches_bit_for_bit_batch_norm_residual(cli, tmp_path: Path) -> None:  # noqa: ANN001
    f = tmp_path / "tiny.ddsl"
    f.write_text(RESIDUAL)
    _compare(cli, tmp_path, str(f))


@pytest.mark.slow
@needs_mpi
def test_rank_zero_alone_prints_and_the_test_figures_are_one_process(tmp_path: Path) -> None:
    args = ("run", MLP, "--set", "N=8", "--iters", "2", "--data", "synthetic")
    r1 = _deepdsl(*args, "--micro-batches", "2")
    r2 = _deepdsl(*args, ranks=2)
    assert r1.returncode == r2.returncode == 0, r2.stderr
    assert r2.stdout.count("device: cpu") == 1
    tested1 = [line for line in r1.stdout.splitlines() if line.startswith("test ")]
    tested2 = [line for line in r2.stdout.splitlines() if line.startswith("test ")]
    assert tested1 and tested1 == tested2


@needs_mpi
def test_ranks_with_other_seeds_are_refused() -> None:
    run = [sys.executable, "-m", "deepdsl", "run", MLP, "--set", "N=8", "--iters", "2", "--data", "synthetic"]
    cmd = [str(MPIEXEC), "-n", "1", *run, "--seed", "1", ":", "-n", "1", *run, "--seed", "2"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=120, cwd=ROOT)
    assert r.returncode != 0
    assert "the ranks do not run the same training" in r.stderr
    assert "iter 1/2" not in r.stdout  # refused before the first step


@needs_mpi
@pytest.mark.parametrize("fault", ["kill", pytest.param("stall", marks=pytest.mark.slow)])  # stall: 4 s
def test_a_dead_or_stalled_rank_stops_the_run_with_an_error(fault: str) -> None:
    t0 = time.monotonic()
    r = _deepdsl("run", MLP, "--set", "N=8", "--iters", "5", "--data", "synthetic", ranks=2, timeout=90,
                 DEEPDSL_DP_FAULT=f"1:2:{fault}", DEEPDSL_DP_TIMEOUT="3")  # fmt: skip
    assert r.returncode != 0
    assert time.monotonic() - t0 < 60
    text = r.stdout + r.stderr
    assert "iter 5/5" not in text
    if fault == "stall":
        assert "rank 1 (its last: bucket" in r.stderr and "dead or stalled" in r.stderr
    else:
        pids = dict(re.findall(r"rank (\d+) (\d+)", text.split("process ids: ")[1].splitlines()[0]))
        assert "BAD TERMINATION" in text and f"PID {pids['1']}" in text  # the launcher names rank 1's process


@pytest.mark.slow  # 4 s (the default suite's four minutes)
@needs_mpi
def test_a_resumed_two_rank_run_continues_exactly(tmp_path: Path) -> None:
    f = tmp_path / "tiny.ddsl"
    f.write_text(RESIDUAL)
    whole, half, resumed = tmp_path / "whole.npz", tmp_path / "half.npz", tmp_path / "resumed.npz"
    args = ("run", str(f), "--data", "synthetic")
    assert _deepdsl(*args, "--iters", "4", "--save", str(whole), ranks=2).returncode == 0
    assert _deepdsl(*args, "--iters", "2", "--save", str(half), ranks=2).returncode == 0
    r = _deepdsl(*args, "--iters", "2", "--load", str(half), "--save", str(resumed), ranks=2)
    assert r.returncode == 0, r.stderr
    assert _bitwise(_params(whole), _params(resumed)) == []
    assert int(_params(resumed)["opt/iteration"]) == 4
    assert not list(tmp_path.glob("*.tmp*"))  # written atomically, by one rank


# ---- memcheck and the cost model ----


def test_memcheck_reports_one_ranks_buckets_and_what_holding_gradients_costs(cli) -> None:  # noqa: ANN001
    r = cli("memcheck", LENET, "--ranks", "2", "--micro-batches", "2", "--bucket-mb", "0.5", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)["data_parallel"]
    assert (d["ranks"], d["micro_batches"], d["global_batch"]) == (2, 2, 4 * 64)
    grads = [b for b in d["buckets"] if b["kind"] == "grad"]
    assert len(grads) >= 3 and d["gradient_bytes"] == sum(b["bytes"] for b in grads)
    assert d["gradient_bytes"] == 4 * 431_080  # every trainable parameter's gradient, reduced once
    assert d["peak_bytes"] == json.loads(r.stdout)["peak_bytes"]  # the plan reported is the rank's own
    assert d["extra_bytes"] == d["peak_bytes"] - d["single_process_peak_bytes"]
    text = cli("memcheck", LENET, "--ranks", "2", "--totals").stdout
    assert "gradients live until their bucket is reduced" in text


def test_memcheck_counts_the_micro_batches_accumulators_in_the_gpu_peak_and_the_budget(cli) -> None:  # noqa: ANN001
    """Each bucket's accumulator (what both CUDA devices allocate beside the arena for --micro-batches M) is in the
    GPU peak and comes out of --gpu-mem's budget: a budget the plain plan fits, with too little room beside it for
    the accumulators, does not fit with two micro-batches."""
    one = json.loads(cli("memcheck", LENET, "--ranks", "2", "--json").stdout)  # the same plan, one micro-batch
    two = json.loads(cli("memcheck", LENET, "--ranks", "2", "--micro-batches", "2", "--json").stdout)
    held = sum(b["bytes"] for b in two["data_parallel"]["buckets"])
    assert held == 4 * 431_080 + 4 and two["accumulator_bytes"] == two["data_parallel"]["accumulator_bytes"] == held
    assert "accumulator_bytes" not in one and one["data_parallel"]["accumulator_bytes"] == 0
    assert two["peak_bytes"] == one["peak_bytes"] and two["gpu_peak_bytes"] == one["gpu_peak_bytes"] + held
    assert "1.64 MiB in all" in cli("memcheck", LENET, "--micro-batches", "2", "--totals").stdout
    budget = str(one["peak_bytes"] + held // 2)
    assert cli("memcheck", LENET, "--ranks", "2", "--gpu-mem", budget, "--remat", "none").exit_code == 0
    tight = cli("memcheck", LENET, "--ranks", "2", "--micro-batches", "2", "--gpu-mem", budget, "--remat", "none",
                "--json")  # fmt: skip
    assert tight.exit_code == 1 and json.loads(tight.stdout)["fits"] is False


def _cost_model():  # noqa: ANN202
    import importlib.util

    spec = importlib.util.spec_from_file_location("dp_cost_model", ROOT / "scripts" / "dp_cost_model.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["dp_cost_model"] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_the_cost_models_paper_estimate_agrees_with_its_simulation() -> None:
    cm = _cost_model()
    opts = Options(buckets=Bucketing(bucket_bytes=400_000, first_bytes=20_000))
    g = api.compile_file(LENET, {}, stop_at="plan", options=opts).build.train_plan.graph
    quiet = cm.Machine(contention=0.0, jitter=0.0)
    sch = cm.schedule(g, 0.01, quiet)
    assert abs(sum(sch.seconds) - 0.01) < 1e-6  # calibrated to the step asked for
    for gpus in (1, 8, 64):
        paper, (sim, stalled) = cm.paper(sch, gpus, quiet), cm.simulate(sch, gpus, quiet)
        assert abs(paper - sim) <= 1e-3 * sim  # the closed form ignores a start that a stall delays
    # a network far slower than its compute: the reductions cannot hide, both say so
    slow = cm.Machine(contention=0.0, jitter=0.0, nvlink_busbw=1e8)
    paper, (sim, stalled) = cm.paper(sch, 8, slow), cm.simulate(sch, 8, slow)
    assert stalled > 0.005 and abs(paper - sim) <= 1e-2 * sim
    total = sum(cm.allreduce_seconds(b, 8, slow) for b in sch.sizes.values())
    assert sim >= 0.01 and sim <= 0.01 + total + 1e-9


def test_the_cost_model_adds_up_synchronised_batch_norms_blocking_all_reduces() -> None:
    cm = _cost_model()
    net = str(NETWORKS / "examples" / "cifar_resnet.ddsl")
    quiet = cm.Machine(contention=0.0, jitter=0.0)
    graphs = [api.compile_file(net, {}, stop_at="plan", options=Options(buckets=Bucketing(sync_batch_norm=on)))
              .build.train_plan.graph for on in (False, True)]  # fmt: skip
    plain, sync = (cm.schedule(g, 0.01, quiet) for g in graphs)
    assert not plain.stats and len(sync.stats) >= 2 and len(sync.stats) % 2 == 0  # forward and backward, each bn
    start = {b: i for i, b in sync.starts.items()}
    for i, b in sync.waits.items():  # a stats all-reduce waits before the next one starts: blocking
        assert i > start[b] and (b not in sync.stats or not any(start[b] < j < i for j in sync.starts))
    for gpus in (8, 64):
        latency = cm.allreduce_seconds(4, gpus, quiet)  # what a stats all-reduce costs at least
        p, (s, stalled) = cm.paper(sync, gpus, quiet), cm.simulate(sync, gpus, quiet)
        assert abs(p - s) <= 1e-3 * s
        assert stalled >= len(sync.stats) * latency  # none hides: their latencies add up
        assert s >= cm.simulate(plain, gpus, quiet)[0] + len(sync.stats) * latency - 1e-9


@pytest.mark.slow
@needs_mpi
def test_two_ranks_of_two_micro_batches_equal_four_micro_batches_within_rounding(tmp_path: Path) -> None:
    four, both = tmp_path / "four.npz", tmp_path / "both.npz"
    args = ("run", MLP, "--set", "N=4", "--iters", "3", "--data", "synthetic")
    assert _deepdsl(*args, "--micro-batches", "4", "--save", str(four)).returncode == 0
    r = _deepdsl(*args, "--micro-batches", "2", "--save", str(both), ranks=2)
    assert r.returncode == 0, r.stderr
    a, b = _params(four), _params(both)
    for k in a:  # (a0 + a1) + (b0 + b1) against ((a0 + a1) + b0) + b1: the same sum in another order
        if a[k].dtype.kind == "f":
            assert np.abs(a[k] - b[k]).max() <= 1e-6 * max(1.0, np.abs(a[k]).max()), k
