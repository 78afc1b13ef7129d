"""Synchronised batch norm (issue 32, `sync_batch_norm`) on the PyCUDA runner without a GPU: two ranks under
`mpiexec -n 2` of `deepdsl run --device cuda --sync-batch-norm` on the emulated GPU with NCCL's stand-in
(tests/backends/conftest.py's `work`) train the batch-norm/residual network as the NumPy runner's two synchronised
ranks do, within rounding, eagerly and inside the captured CUDA graph; each step adds the statistics' blocking
all-reduces to the gradient buckets'."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from cuda_emulator import EmulatedDriver
from test_distributed import _deepdsl
from test_gpu_data_parallel import HERE, MPIEXEC, _env, _params, needs_mpich
from test_sync_batch_norm import BY_SGD, SYNC, _far

from deepdsl import running
from deepdsl.cli import cli

# the largest difference allowed between the GPU's and the NumPy runner's synchronised ranks, relative to the
# tensor's largest magnitude (at least 1): float32 rounding of the same sums in other orders (the emulated kernels'
# reductions against NumPy's), through three SGD steps. Measured: 1.2e-7; the per-rank default is 4.7e-5 and more
# away
TOLERANCE = 1e-6


def _gpu_ranks(work: Path, name: str, *args: str) -> dict:
    """Two ranks of `deepdsl run --device cuda` on the emulated GPU, each building its kernels in a folder of its own
    (the synchronised program's kernels are not those the other tests built): rank 0's --json object and the
    ranks' all-reduce counts."""
    run = ["run", str(work / "sync_res.ddsl"), "--data", "synthetic", "--device", "cuda", "--kernels", "own",
           "--json", *args]  # fmt: skip
    ranks = [["-n", "1", "sh", "-c", f'FAKE_NCCL_CALLS={work}/calls_{name}.{k} exec "$@"', "sh", sys.executable,
              str(HERE / "emulated_rank.py"), str(work / f"emulated_sync_{k}"), *run] for k in range(2)]  # fmt: skip
    r = subprocess.run([str(MPIEXEC), *ranks[0], ":", *ranks[1]], capture_output=True, text=True, timeout=300,
                       cwd=work, env=_env(work), check=False)  # fmt: skip
    assert r.returncode == 0, r.stderr
    out = [line for line in r.stdout.splitlines() if line.startswith("{")]
    assert len(out) == 1, r.stdout  # rank 0 alone writes --json
    got = json.loads(out[0])
    got["calls"] = [int((work / f"calls_{name}.{k}").read_text()) for k in range(2)]
    return got


@needs_mpich
@pytest.mark.slow
def test_two_synchronised_gpu_ranks_equal_the_numpy_runners(work: Path) -> None:
    (work / "sync_res.ddsl").write_text(BY_SGD)
    iters = ("--iters", "3")
    sync = _gpu_ranks(work, "sync", *iters, "--sync-batch-norm", "--save", str(work / "gpu_sync.npz"))
    assert sync["gpu_graph"] == "on"  # step 1 eager, then captured and replayed
    plain = _gpu_ranks(work, "plain", *iters, "--save", str(work / "gpu_plain.npz"))
    # per step: 2 gradient buckets without, and a statistics all-reduce per batch norm forward and backward with
    # (3 batch norms); and the start-up check's
    assert plain["calls"] == [2 * 3 + 1] * 2
    assert sync["calls"] == [(2 + 2 * 3) * 3 + 1] * 2
    f, cpu = str(work / "sync_res.ddsl"), {}
    for flags, name in ((("--sync-batch-norm",), "sync"), ((), "plain")):
        r = _deepdsl("run", f, *iters, "--data", "synthetic", "--device", "cpu", *flags, "--json", "--save",
                     str(work / f"cpu_{name}.npz"), ranks=2)  # fmt: skip
        assert r.returncode == 0, r.stderr
        cpu[name] = json.loads(r.stdout.strip().splitlines()[-1])
    np.testing.assert_allclose(sync["losses"], cpu["sync"]["losses"], rtol=1e-6)
    want, per_rank = _params(work / "cpu_sync.npz"), _params(work / "cpu_plain.npz")
    near = _far(_params(work / "gpu_sync.npz"), want)
    assert max(near.values()) <= TOLERANCE, sorted(near.items(), key=lambda kv: -kv[1])[:3]
    # the GPU's per-rank default is the NumPy runner's, and far from the synchronised training (its statistics are
    # over other samples)
    assert max(_far(_params(work / "gpu_plain.npz"), per_rank).values()) <= TOLERANCE
    apart = _far(per_rank, want)
    assert max(apart.values()) > 100 * TOLERANCE, apart


def test_micro_batches_stay_refused_on_the_gpu_runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--micro-batches with sync_batch_norm on --device cuda (the emulated GPU): the diagnostic at the train block's
    key (exit 1), as on the NumPy runner."""
    monkeypatch.setattr(running, "open_device", lambda *a, **k: (EmulatedDriver(tmp_path / "emulated"), "cuda", None))
    f = tmp_path / "sync.ddsl"
    f.write_text(SYNC)
    line = SYNC.splitlines().index("  sync_batch_norm = true") + 1
    r = CliRunner().invoke(cli, ["run", str(f), "--iters", "1", "--data", "synthetic", "--device", "cuda",
                                 "--micro-batches", "2"])  # fmt: skip
    assert r.exit_code == 1, r.output
    assert f"{f}:{line}:3: error: sync_batch_norm" in r.output and "--micro-batches" in r.output
