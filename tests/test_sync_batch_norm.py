"""Synchronised batch norm (issue 32, `sync_batch_norm`): under data-parallel training each batch norm's batch
statistics are those of the global batch (PyTorch's SyncBatchNorm). The pass's small blocking all-reduces of
the per-channel statistics (forward) and of sum(g), sum(g xh) (backward); two ranks of the NumPy runner under
`mpiexec -n 2` equal one process with the whole batch within rounding, and differ from the per-rank default;
the refusals (micro-batches, batch norm without a scale) are diagnostics. The PyCUDA runner's two ranks:
tests/backends/test_gpu_sync_batch_norm.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from dp_nets import RESIDUAL
from helpers import one_blas_thread
from test_distributed import _deepdsl, _params, _train_graph, needs_mpi

from deepdsl.ir.printer import format_graph
from deepdsl.ops.collective import buckets_of, post_statements
from deepdsl.passes.data_parallel import Bucketing, data_parallel

SYNC = RESIDUAL.replace("  seed = 5\n", "  seed = 5\n  sync_batch_norm = true\n")
assert SYNC != RESIDUAL
# the comparisons with the whole batch train with SGD: Adam's first steps move each weight by about lr times the
# sign of its gradient, so where a gradient element is near 0 its rounding becomes a difference of up to lr (7e-6
# of a convolution's weights measured with adam(lr=0.01), for one rank against the plain program)
BY_SGD = RESIDUAL.replace("adam(lr=0.01)", "sgd(lr=0.1, momentum=0.9)")
assert BY_SGD != RESIDUAL

NO_SCALE = """
network NoScale
const N = 4
input x : [N, 6]
label y : [N] classes 3
layer fc1 = full(8)
layer fc2 = full(3)
net = fc2 o relu o batch_norm(affine=false, name="bn") o fc1
loss    = softmax_cross_entropy(net(x), y)
predict = net(x)
train {
  data = synthetic
  optimizer = sgd(lr=0.1)
  iterations = 2
}
"""


def _file(tmp_path: Path, text: str, name: str = "tiny.ddsl") -> str:
    f = tmp_path / name
    f.write_text(text)
    return str(f)


# ---- the pass ----


def test_the_pass_puts_a_blocking_all_reduce_at_each_batch_norms_statistics(tmp_path: Path) -> None:
    g = data_parallel(_train_graph(_file(tmp_path, RESIDUAL)).train, Bucketing(sync_batch_norm=True))
    stmts = list(g.stmts)
    starts = [i for i, s in enumerate(stmts) if s.op == "allreduce_start" and s.a["kind"] == "stats"]
    assert len(starts) == 6  # three batch norms: the forward statistics and the backward sums of each
    for i in starts:  # blocking: its wait right after it, before anything reads the statistics
        assert stmts[i + 1].op == "allreduce_wait" and stmts[i + 1].inputs[0] == stmts[i].out
        assert stmts[i + 1].a["kind"] == "stats"
    post = post_statements(g)
    assert not any(stmts[i + 1].out.name in post for i in starts)  # they run in the forward/backward pass
    forward = [stmts[i] for i in starts if stmts[i].a["names"][0].endswith(":batch_mean")]
    backward = [stmts[i] for i in starts if stmts[i].a["names"][0].endswith(".gamma")]
    assert len(forward) == len(backward) == 3
    assert all(s.a["names"][1].endswith(":batch_mean_square") for s in forward)
    assert all(s.a["names"][1].endswith(".beta") for s in backward)
    buckets = buckets_of(g)
    assert len({b.index for b in buckets}) == len(buckets)
    # the scale and shift's gradients are global already: no gradient bucket reduces them a second time, and the
    # running statistics (equal on every rank) are not averaged in the state bucket
    grads = [n for b in buckets if b.kind == "grad" for n in b.names]
    assert grads and not any(n.endswith((".gamma", ".beta")) for n in grads)
    assert [b.names for b in buckets if b.kind == "state"] == [("loss",)]
    text = format_graph(g)
    assert text.count("allreduce_start(") == len(buckets)
    assert text.count("kind=stats") == 12  # the starts and the waits


def test_the_ir_command_shows_them(tmp_path: Path, cli) -> None:  # noqa: ANN001
    f = _file(tmp_path, RESIDUAL)
    text = cli("ir", f, "--stage", "opt", "--data-parallel", "--sync-batch-norm").stdout
    assert text.count("kind=stats") == 12, text
    plan = cli("ir", f, "--stage", "plan", "--data-parallel", "--sync-batch-norm").stdout
    assert plan.count(" allreduce_start ") == text.count("allreduce_start(") == 8  # 6, a gradient and a state bucket
    assert "kind=stats" not in cli("ir", f, "--stage", "opt", "--data-parallel").stdout
    r = cli("ir", f, "--sync-batch-norm")
    assert r.exit_code == 2 and "add --data-parallel" in r.stderr


def test_without_the_setting_the_pass_is_the_per_rank_default(tmp_path: Path) -> None:
    g = data_parallel(_train_graph(_file(tmp_path, RESIDUAL)).train, Bucketing())
    assert not any(b.kind == "stats" for b in buckets_of(g))
    assert any(n.endswith(".gamma") for b in buckets_of(g) if b.kind == "grad" for n in b.names)


def test_the_train_block_key_and_the_flag_reach_memcheck(tmp_path: Path, cli) -> None:  # noqa: ANN001
    for args in ((_file(tmp_path, SYNC),), (_file(tmp_path, RESIDUAL, "plain.ddsl"), "--sync-batch-norm")):
        r = cli("memcheck", *args, "--ranks", "2", "--json")
        assert r.exit_code == 0, r.output
        d = json.loads(r.stdout)["data_parallel"]
        assert d["sync_batch_norm"] is True
        stats = [b for b in d["buckets"] if b["kind"] == "stats"]
        assert len(stats) == 6 and all(b["bytes"] == 2 * 6 * 4 for b in stats)
        assert d["gradient_bytes"] == sum(b["bytes"] for b in d["buckets"] if b["kind"] == "grad")
        text = cli("memcheck", *args, "--ranks", "2", "--totals").stdout
        assert "synchronised batch norm: 6 blocking all-reduces" in text
    r = cli("memcheck", _file(tmp_path, RESIDUAL, "plain.ddsl"), "--ranks", "2", "--json")
    assert json.loads(r.stdout)["data_parallel"]["sync_batch_norm"] is False


# ---- refusals: diagnostics, exit 1 ----


def test_micro_batches_are_refused_at_the_train_blocks_key(tmp_path: Path, cli) -> None:  # noqa: ANN001
    f = _file(tmp_path, SYNC)
    line = SYNC.splitlines().index("  sync_batch_norm = true") + 1
    for command in (("run", f, "--iters", "1"), ("memcheck", f)):
        r = cli(*command, "--micro-batches", "2")
        assert r.exit_code == 1, r.output
        assert f"{f}:{line}:3: error: sync_batch_norm" in r.stderr
        assert "--micro-batches" in r.stderr and "Traceback" not in r.output
    r = cli("run", _file(tmp_path, RESIDUAL, "plain.ddsl"), "--iters", "1", "--micro-batches", "2",
            "--sync-batch-norm")  # fmt: skip
    assert r.exit_code == 1, r.output
    assert "error: --sync-batch-norm" in r.stderr and "--micro-batches" in r.stderr


def test_batch_norm_without_a_scale_is_refused_where_it_is_written(tmp_path: Path, cli) -> None:  # noqa: ANN001
    f = _file(tmp_path, NO_SCALE)
    line = NO_SCALE.splitlines().index(next(x for x in NO_SCALE.splitlines() if "affine=false" in x)) + 1
    r = cli("memcheck", f, "--ranks", "2", "--sync-batch-norm")
    assert r.exit_code == 1, r.output
    assert f"{f}:{line}:" in r.stderr and "affine=false" in r.stderr and "Traceback" not in r.output
    assert cli("memcheck", f, "--ranks", "2").exit_code == 0  # the per-rank default takes it


def test_the_key_takes_true_or_false(tmp_path: Path, cli) -> None:  # noqa: ANN001
    r = cli("check", _file(tmp_path, SYNC.replace("sync_batch_norm = true", "sync_batch_norm = 2")))
    assert r.exit_code == 1 and "'sync_batch_norm' must be true or false" in r.stderr
    r = cli("compile", _file(tmp_path, RESIDUAL), "--sync-batch-norm", "-o", str(tmp_path / "out"))
    assert r.exit_code == 2 and "--sync-batch-norm synchronises the ranks of a data-parallel program" in r.stderr
    # the flag's negation overrides the train block's key
    r = cli("memcheck", _file(tmp_path, SYNC, "sync.ddsl"), "--ranks", "2", "--no-sync-batch-norm", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["data_parallel"]["sync_batch_norm"] is False


# ---- two ranks under mpiexec against one process with the whole batch ----

# the largest difference allowed, relative to the largest magnitude of the tensor (at least 1): float32 rounding of
# sums in another order (the per-rank sums then their all-reduce, and the moments about the running mean against
# the centred variance over the whole batch), through three SGD steps. Measured: 1.2e-7 (2.1e-7 after 20 steps); the
# per-rank default is 4.7e-5 to 1.4e-2 away
TOLERANCE = 1e-6


def _far(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict[str, float]:
    """Each float tensor's largest difference relative to its largest magnitude (at least 1)."""
    assert a.keys() == b.keys()
    return {k: float(np.abs(a[k] - b[k]).max() / max(1.0, np.abs(b[k]).max())) for k in a if a[k].dtype.kind == "f"}


@needs_mpi
def test_two_synchronised_ranks_equal_one_process_of_the_whole_batch(cli, tmp_path: Path) -> None:  # noqa: ANN001
    f = _file(tmp_path, BY_SGD)
    whole, sync, per_rank = tmp_path / "whole.npz", tmp_path / "sync.npz", tmp_path / "per_rank.npz"
    args = ("run", f, "--iters", "3", "--data", "synthetic")
    # the one process of the whole batch is this one (its parameters are what is compared, within a tolerance; a
    # Python started for it cost more CPU than its run), its BLAS on one thread as the ranks'
    with one_blas_thread():
        r = cli(*args, "--set", "N=8", "--save", str(whole))
    assert r.exit_code == 0, r.output
    r = _deepdsl(*args, "--sync-batch-norm", "--save", str(sync), ranks=2)
    assert r.returncode == 0, r.stderr
    r = _deepdsl(*args, "--save", str(per_rank), ranks=2)
    assert r.returncode == 0, r.stderr
    a, b, c = _params(sync), _params(whole), _params(per_rank)
    running = [k for k in b if k.endswith(("running_mean", "running_var"))]
    assert len(running) == 6
    near = _far(a, b)
    assert max(near.values()) <= TOLERANCE, sorted(near.items(), key=lambda kv: -kv[1])[:3]
    # the per-rank statistics are over other samples: far from the whole batch's (the first batch norm's running
    # mean least: the mean of the equal shards' means is the whole batch's, only the parameters drift apart)
    apart, first = _far(c, b), "model.cbn1.bn.running_mean"
    assert all(v > 100 * TOLERANCE for k, v in apart.items() if k.startswith("model.") and k != first), apart
    assert apart[first] > 10 * TOLERANCE


def test_one_synchronised_rank_is_the_plain_program_within_rounding(tmp_path: Path) -> None:
    """A compiled synchronised program run by one process (the Java program's case; `deepdsl run` compiles the
    plain program then): its statistics from the moments about the running mean, not bit for bit the centred
    variance's, but within rounding, the running variance's correction included (the scale 1)."""
    from test_distributed import _train, _trainer

    from deepdsl.distributed import Accumulate, Session, World

    f = _file(tmp_path, BY_SGD)
    plain = _train(_trainer(f, {}, None), 3)
    synced = _train(_trainer(f, {}, Bucketing(sync_batch_norm=True), Session(World(), 1, Accumulate())), 3)
    near = _far(synced, plain)
    assert max(near.values()) <= TOLERANCE, sorted(near.items(), key=lambda kv: -kv[1])[:3]
