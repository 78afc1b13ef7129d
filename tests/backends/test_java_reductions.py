"""The Java program's CUDA device runs the large reductions as the PyCUDA runner does (ir/reductions.py): each pass
(a batch norm's mean and variance with its running statistics, dgamma with dbeta and the inverse deviation, a bias
gradient) one `dev.pass` call launching the same generated kernel on the same grid, once: the partial sums in the
pass's workspace of the plan, added up by the last block to finish; the CPU device runs the statements' own code.
Run on the stand-in driver (fake_libcuda.c), whose kernels are the program's own .cu compiled for the CPU
(cuda_emulator.py), which logs every launch by name ($FAKE_CUDA_LAUNCH_LOG): so a step's launches are counted and
compared with the PyCUDA runner's and with `deepdsl ir --stats`."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from cuda_emulator import TILED, emulate, fake_driver, kernel_names
from java_env import JAVA_MARKS, java, javac, jcuda_jars

from deepdsl import api
from deepdsl.backends.cuda import translation
from deepdsl.passes.pipeline import kernels as kernel_count

pytestmark = [
    *JAVA_MARKS,
    pytest.mark.skipif(shutil.which("g++") is None or shutil.which("gcc") is None, reason="no gcc/g++"),
]

# a batch norm and a residual add, large enough that every statistic and gradient sum splits over blocks
# (16 x 32 x 16 values a channel, 8 channels: ir/reductions.py SPLIT_MIN)
RESBN = """
network ResBn

const N = 16
const K = 5

input x : [N, 3, 32, 16]
label y : [N] classes K

def body(x) {
  a = relu(batch_norm(conv(x, 8, kernel=3, pad=1)))
  b = batch_norm(conv(a, 8, kernel=3, pad=1))
  return full(flatten(global_avg_pool(relu(a + b))), K)
}

layer model = body

loss    = cross_entropy(softmax(model(x)), y)
predict = model(x)

train {
  optimizer  = sgd(lr=0.01, momentum=0.9)
}
"""


@pytest.fixture(scope="module")
def resbn(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ResBn compiled with --ptx into src/ and built into build/, its kernels for the CPU in ResBn/, the stand-in
    driver in fake/, a training set (no test set: a run's launches are its training steps')."""
    from click.testing import CliRunner

    from deepdsl.cli import cli

    folder = tmp_path_factory.mktemp("java_reductions")
    (folder / "resbn.ddsl").write_text(RESBN)
    rng = np.random.default_rng(0)
    np.savez(folder / "data.npz", x=rng.standard_normal((32, 3, 32, 16)).astype(np.float32),
             y=rng.integers(0, 5, 32))  # fmt: skip
    src = folder / "src"
    r = CliRunner().invoke(cli, ["compile", str(folder / "resbn.ddsl"), "-o", str(src), "--ptx", "--arch", "sm_90"])
    assert r.exit_code == 0, r.output
    unit = (src / "ResBn.cu").read_text()
    names = kernel_names(unit)
    (folder / "ResBn").mkdir()
    emulate(unit, names, folder / "ResBn", [k for k in names if k not in TILED])
    javac(src, [*src.glob("*.java"), *(src / "deepdsl" / "runtime").glob("*.java")], folder / "build")
    fake_driver(folder / "fake")
    return folder


def _cuda(folder: Path, *args: str, log: Path | None = None, watch: dict | None = None) -> dict:
    env = {
        **os.environ,
        "LD_LIBRARY_PATH": str(folder / "fake"),
        "DEEPDSL_FAKE_CUDA_KERNELS": str(folder / "ResBn" / "emulated.so"),
        **({"FAKE_CUDA_LAUNCH_LOG": str(log)} if log else {}),
        **(watch or {}),
    }
    cp = f"{folder / 'build'}:{folder / 'src'}:{jcuda_jars()}/*"
    cache = f"-Dorg.bytedeco.javacpp.cachedir={folder / 'javacpp'}"
    cmd = ["java", cache, "-cp", cp, "ResBn", "--data", "npz:data.npz", "--device", "cuda", *args, "--json"]
    r = subprocess.run(cmd, cwd=folder, capture_output=True, text=True, timeout=600, env=env, check=False)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _passes(folder: Path) -> set[str]:
    """The kernels of the ReductionPass constants of the generated class."""
    text = (folder / "src" / "ResBn.java").read_text()
    return set(re.findall(r'ReductionPass\.(?:split|direct)\(\s*"(\w+)"', text))


@pytest.mark.slow  # the slow tier: the default suite's four-minute budget
def test_the_cuda_device_runs_the_split_passes_and_gives_the_cpu_devices_losses(resbn: Path) -> None:
    log = resbn / "three_steps.log"
    got = _cuda(resbn, "--iters", "3", log=log)
    r = java(resbn / "build", "ResBn", "--data", "npz:data.npz", "--device", "cpu", "--iters", "3", "--json",
             cwd=resbn)  # fmt: skip
    assert r.returncode == 0, r.stderr
    want = json.loads(r.stdout)
    assert got["device"] == "cuda"
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-4)
    assert got["peak_bytes"] == want["peak_bytes"]
    # the NumPy runner's losses too
    from click.testing import CliRunner

    from deepdsl.cli import cli

    ran = CliRunner().invoke(cli, ["run", str(resbn / "resbn.ddsl"), "--data", f"npz:{resbn / 'data.npz'}",
                                   "--iters", "3", "--json"])  # fmt: skip
    assert ran.exit_code == 0, ran.output
    np.testing.assert_allclose(got["losses"], json.loads(ran.output)["losses"], rtol=1e-4)
    launched = Counter(log.read_text().split())
    passes = _passes(resbn)
    assert passes and all(launched[k] > 0 for k in passes), (passes, launched)
    # the one-block-per-channel kernels of the statistics are not launched on the CUDA device; of the channel sums
    # only the linear layer's bias gradient (16 rows: below a pass, on the PyCUDA runner a kernel of its own too),
    # once in each of the two steps that launch (the first, and the second, captured; the third replays the graph)
    assert launched["channelMean"] == launched["channelVar"] == 0, launched
    prog = translation.program(api.build(api.compile_source(RESBN, "resbn.ddsl").program).train_plan)
    alone = [x for x in prog.launches if x.op == "channel_sum" and x.loop != "split"]
    assert launched["channelSum"] == 2 * len(alone) == 2, (launched, alone)


def test_the_cuda_devices_launches_a_step_are_the_pycuda_runners_and_ir_stats(resbn: Path) -> None:
    log = resbn / "one_step.log"
    _cuda(resbn, "--iters", "1", "--kernels", "own", log=log)
    launched = log.read_text().split()
    build = api.build(api.compile_source(RESBN, "resbn.ddsl").program)
    prog = translation.program(build.train_plan)
    # the reduction passes' launches: one a pass, split ones too (a split-K filter gradient's finishing launch,
    # `finishes`, is the convolution's own, not a pass's)
    split = [x for x in prog.launches if x.loop == "split"]
    assert any(x.grid[1] > 1 for x in split)
    assert not [x for x in prog.launches if x.kernel.endswith("_finish") and not x.finishes]
    passes = _passes(resbn)
    assert sum(k in passes for k in launched) == len(split) > 0
    # the whole step: as many launches as the PyCUDA runner's program; `ir --stats` counts them too, but
    # for an op's epilogue launched after it (a conv's bias add), which it counts with its statement, and a split-K
    # filter gradient's finishing launch (`finishes`: its splits depend on the planned workspace, which the IR lacks)
    epilogues = sum(x.kernel.endswith("_epilogue") or x.finishes for x in prog.launches)
    assert any(x.finishes for x in prog.launches)
    assert len(launched) == len(prog.launches) == kernel_count(build.train_plan.graph) + epilogues


def _pass_launches(java_text: str, calls: str) -> tuple[int, int]:
    """The `dev.pass` calls in `calls` (a launch each on a CUDA device, split or not) and how many of them are split
    (as the class's constants say)."""
    kinds = dict(re.findall(r"static final ReductionPass (\w+) =\s*ReductionPass\.(split|direct)\(", java_text))
    called = re.findall(r"dev\.pass\((\w+),", calls)
    return len(called), sum(kinds[c] == "split" for c in called)


@pytest.mark.parametrize("limit", [None, 0])
@pytest.mark.parametrize("network", ["resbn", "lenet"])
def test_the_classs_pass_calls_launch_what_the_pycuda_runners_passes_do(network: str, limit: int | None) -> None:
    """Without running anything: the generated class's pass calls stand for as many launches as the PyCUDA
    runner's passes, also where no workspace is allowed (`--workspace-limit 0`: no split pass on either device)."""
    from helpers import ROOT

    from deepdsl.backends.java import java_program
    from deepdsl.build import Options

    source = RESBN if network == "resbn" else (ROOT / "networks" / "lenet.ddsl").read_text()
    b = api.build(api.compile_source(source, f"{network}.ddsl").program, Options(workspace_limit=limit))
    prog = translation.program(b.train_plan)
    passes = [x for x in prog.launches if x.loop == "split"]
    text = java_program(b.program, b.train_plan, b.infer_plan, b.eval_plan or b.train_plan, limit or 0).java
    training = text[text.index("private final class Training") :]
    training = training[: training.index("\n  }\n")]
    assert _pass_launches(text, training) == (len(passes), sum(x.grid[1] > 1 for x in passes))
    assert ("ReductionPass.split(" in text) == (limit is None)
    assert not re.search(r"ReductionPass\.(split|direct)\([^;]*_finish", text)  # no finishing kernel: one launch


@pytest.mark.slow  # two runs of four steps with the own convolutions on the emulator: ~20 s
def test_the_split_passes_replayed_in_a_graph_give_the_steps_call_for_call_bits(resbn: Path) -> None:
    """Four training steps on the CUDA device: the first call for call, the second captured, steps 2-4 graph launches
    (three), against four steps under --no-graph: the same losses and parameters bit for bit. Each split pass's last
    block wraps the module's block counter back to zero (library.cu `dd_last_block`), so the replays start from the
    zero it was loaded with; a counter left behind would leave a replayed pass's results unwritten."""
    counts = resbn / "graph.launches"
    runs = {}
    for name, flags in (("on", ()), ("off", ("--no-graph",))):
        save = resbn / f"replay_{name}.npz"
        runs[name] = _cuda(resbn, "--iters", "4", "--save", str(save), *flags, log=None,
                           watch={"FAKE_CUDA_GRAPH_LAUNCHES": str(counts)})  # fmt: skip
        runs[name]["arrays"] = dict(np.load(save))
        runs[name]["graph_launches"] = int(counts.read_text().split()[0])
    assert runs["on"]["gpu_graph"] == "on" and runs["on"]["graph_launches"] == 3
    assert runs["off"]["graph_launches"] == 0
    assert np.isfinite(runs["on"]["losses"]).all()
    assert runs["on"]["losses"] == runs["off"]["losses"]
    on, off = runs["on"]["arrays"], runs["off"]["arrays"]
    assert on.keys() == off.keys() and on
    for k in on:
        assert on[k].tobytes() == off[k].tobytes(), k
