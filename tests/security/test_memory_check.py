"""`run` counts what it allocates and refuses, before allocating, a footprint over what the process may use
(issue 36, item 5): MemAvailable, the address-space and data limits (ulimit -v, -d) and the cgroup's limit."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from security_env import ROOT

from deepdsl import api
from deepdsl.data.named import fields_of, load_samples
from deepdsl.initializers import _CHUNK, init_array, init_scratch_bytes
from deepdsl.memory.footprint import Footprint, check_fits, footprint, memory_limits
from deepdsl.trainer import Trainer

MLP = str(ROOT / "networks" / "mlp.ddsl")
BIG = """network Big
const N = 8
input x : [N, 4096]
label y : [N] classes 10
layer fc1 = full(32768)
layer fc2 = full(10)
net = fc2 o relu o fc1
loss = softmax_cross_entropy(net(x), y)
predict = net(x)
train {
  data = synthetic
  optimizer = sgd(lr=0.01, momentum=0.9)
  iterations = 1
}
"""  # 134M parameters: 513 MiB, with momentum, copies, arena and the kernels' temporaries some 3.5 GiB


def _fake_system(root: Path, cgroup_lines: str, files: dict[str, str]) -> tuple[str, str]:
    proc, cgroup = root / "proc", root / "cgroup"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text("MemTotal:       32000000 kB\nMemAvailable:   16000000 kB\n")
    (proc / "self" / "cgroup").write_text(cgroup_lines)
    (proc / "self" / "status").write_text("VmSize:   100000 kB\nVmData:    50000 kB\n")
    for name, text in files.items():
        (cgroup / name).parent.mkdir(parents=True, exist_ok=True)
        (cgroup / name).write_text(text)
    return str(proc), str(cgroup)


def test_memory_limits_reads_a_cgroup_v2_folder_and_its_parents(tmp_path: Path) -> None:
    proc, cgroup = _fake_system(tmp_path, "0::/user.slice/job\n", {
        "cgroup.controllers": "cpu memory\n",
        "memory.max": "max\n",  # the root: no limit
        "user.slice/memory.max": f"{3 * 2**30}\n",
        "user.slice/memory.current": f"{2 * 2**30}\n",  # the parent leaves 1 GiB ...
        "user.slice/job/memory.max": f"{8 * 2**30}\n",
        "user.slice/job/memory.current": f"{2**30}\n",  # ... though the job's own limit leaves 7
    })  # fmt: skip
    limits = memory_limits(proc, cgroup)
    assert limits["MemAvailable"] == 16000000 * 1024
    assert limits["the cgroup's memory.max"] == 2**30


def test_memory_limits_reads_a_cgroup_v1_folder(tmp_path: Path) -> None:
    proc, cgroup = _fake_system(tmp_path, "4:memory:/job\n3:cpu:/\n0::/\n", {
        "memory/memory.limit_in_bytes": "9223372036854771712\n",  # v1's "no limit"
        "memory/memory.usage_in_bytes": f"{2**30}\n",
        "memory/job/memory.limit_in_bytes": f"{2 * 2**30}\n",
        "memory/job/memory.usage_in_bytes": f"{2**29}\n",
    })  # fmt: skip
    limits = memory_limits(proc, cgroup)
    assert limits["the cgroup's memory.limit_in_bytes"] == 3 * 2**29
    assert "the cgroup's memory.max" not in limits  # no unified hierarchy mounted in the fake folder


def test_no_cgroup_limit_and_no_ulimit_leave_memavailable(tmp_path: Path) -> None:
    proc, cgroup = _fake_system(tmp_path, "0::/\n", {"cgroup.controllers": "", "memory.max": "max\n"})
    limits = memory_limits(proc, cgroup)
    if resource.getrlimit(resource.RLIMIT_AS)[0] == resource.RLIM_INFINITY:
        assert "the address-space limit (ulimit -v)" not in limits
    assert limits["MemAvailable"] == 16000000 * 1024 and not any("cgroup" in k for k in limits)


def test_check_fits_names_the_limit() -> None:
    f = Footprint(2**30, 2**30, 2**30, 2**30)
    with pytest.raises(Exception, match=r"needs at least 4.00 GiB .*kernel temporaries 1.00 GiB.* but 1.00 GiB is "
                                        r"available \(the address-space limit \(ulimit -v\)\)"):  # fmt: skip
        check_fits(f, 2**30, {"MemAvailable": 2**34, "the address-space limit (ulimit -v)": 2**30})


def test_initialisers_hold_one_chunk_of_scratch_whatever_the_size() -> None:
    """he() of 8 chunks: beside its float32 result, at most init_scratch_bytes, one chunk's (the whole tensor's
    float64 values and their scaled copy were 16 bytes an element)."""
    count = 8 * _CHUNK
    tracemalloc.start()
    try:
        a = init_array("w", (count,), "he", (), 100, 100, 1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert a.dtype == np.float32
    assert peak - a.nbytes <= init_scratch_bytes(count) < 16 * count


@pytest.mark.parametrize(("net", "n"), [(MLP, 8192), (str(ROOT / "networks" / "autoencoder.ddsl"), 2048)])
def test_the_footprint_covers_what_two_steps_allocate(net: str, n: int) -> None:
    b = api.build(api.compile_file(net, {"N": n}).program)
    data = load_samples("synthetic", {}, fields_of(b.program.graph.inputs), b.seed)
    f = footprint(b.train_plan)
    tracemalloc.start()
    try:
        t = Trainer(b, data)
        t.step()
        t.step()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= f.total, f"traced {peak / 2**20:.0f} MiB, counted {f.total / 2**20:.0f} MiB"


MEASURE = """
import resource, subprocess, sys
limit = int(sys.argv[1])
def lower():
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
r = subprocess.run(sys.argv[2:], capture_output=True, text=True, preexec_fn=lower)
print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)
print(r.stderr)
"""


def test_run_is_refused_before_allocating_under_a_lowered_address_space_limit(tmp_path: Path) -> None:
    """ulimit -v 1.5 GiB, a run of some 3.5 GiB: exit 1 naming the limit, before the 513 MiB weight exists."""
    (tmp_path / "big.ddsl").write_text(BIG)
    command = [sys.executable, "-m", "deepdsl", "run", str(tmp_path / "big.ddsl"), "--iters", "1", "--device", "cpu"]
    r = subprocess.run([sys.executable, "-c", MEASURE, str(3 * 2**29), *command], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    first, stderr = r.stdout.split("\n", 1)
    status, peak = map(int, first.split())
    assert status == 1, stderr
    assert "needs at least" in stderr and "the address-space limit (ulimit -v)" in stderr, stderr
    assert "Traceback" not in stderr and "MemoryError" not in stderr
    assert peak < 400 * 2**20, f"peak RSS {peak / 2**20:.0f} MiB: it allocated before refusing"
