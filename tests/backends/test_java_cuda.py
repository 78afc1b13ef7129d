"""The generated program's CUDA device (JCuda's driver API) run end to end without a GPU: JCuda loads a stand-in
libcuda.so.1 (fake_libcuda.c) whose kernels are the program's own .cu compiled for the CPU (cuda_emulator.py).
So the PTX lookup, the NVRTC fallback, the arena and tensor allocation, the step's calls (the library entry
points sized at run time, the generated kernels), the copies, the transfers for a save and a load are all
exercised, and the losses must equal the CPU device's. With `--kernels vendor` the GEMMs go to cuBLAS through
JavaCPP's CUDA presets, here stand-ins built with the sonames and symbol versions the presets' bindings need
(`fake_cuda13`), and the convolutions, pooling, batch norm, softmax and LRN to cuDNN, a stand-in built as the
presets' cuDNN bindings need it (`fake_cudnn9`)."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from cuda13_stand_ins import CUDA13, fake_cuda13, fake_cudnn9
from cuda_emulator import TILED, emulate, fake_driver, kernel_names
from helpers import ROOT, SMALL
from java_env import JAVA_MARKS, java, javac, jcuda_jars
from test_own_kernels import SPLIT
from transformer_nets import causal_attention

pytestmark = [
    *JAVA_MARKS,
    pytest.mark.skipif(shutil.which("g++") is None or shutil.which("gcc") is None, reason="no gcc/g++"),
]

# (class, source, --set, --data); LeNet as in test_java_run (a learning rate at which float32 differences stay
# small), on data with a small test set: its 256 synthetic test samples take half a minute through the CPU's fibers
NETWORKS = {
    "Small": ("small.ddsl", {}, "synthetic"),
    "Wide": ("wide.ddsl", {}, "synthetic"),
    "Causal": ("causal.ddsl", {}, "synthetic"),
    "LeNet": ("lenet_slow.ddsl", {"N": 8}, "npz:lenet_data.npz"),
    "SplitNet": ("split.ddsl", {}, "synthetic"),  # filter gradients whose reduction splits (test_own_kernels.py)
    "Odd": ("odd.ddsl", {}, "synthetic"),
}

# a ReLU's gradient over 3 x 1001 values: an element-wise kernel whose size is not a multiple of 4 (its scalar loop)
ODD = """
network Odd

input x : [3, 7]
label y : [3] classes 5

def body(x) {
  return full(relu(full(x, 1001)), 5)
}

layer model = body

loss    = softmax_cross_entropy(model(x), y)
predict = model(x)

train {
  data = synthetic(seed=4)
}
"""


# the library calls Small does not make, each run through its entry point sized at run time: a strided, padded
# and a grouped convolution and their gradients, LRN, padded max and average pools, a batch norm standing alone (its
# apply a device call in training), softmax and log softmax (the softmax of a log softmax: the same probabilities,
# both ops and their gradients), cross entropy, Adam
WIDE = """
network Wide

const N = 4
const K = 5

input x : [N, 3, 9, 9]
label y : [N] classes K

def body(x) {
  a = relu(conv(x, 4, kernel=3, stride=2, pad=1))
  b = max_pool(lrn(a, size=3, alpha=0.5, beta=0.75, k=1.5), 3, stride=1, pad=1)
  c = avg_pool(relu(conv(batch_norm(b), 4, kernel=3, pad=1, groups=2)), 3, stride=2, pad=1)
  return full(flatten(global_avg_pool(c)), K)
}

layer model = body

loss    = cross_entropy(softmax(log_softmax(model(x))), y)
predict = model(x)

train {
  data       = synthetic(seed=2)
  optimizer  = adam(lr=0.001)
}
"""


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Small, Wide, Causal and SplitNet, built as `build_programs` does: what every test but LeNet's runs (LeNet's
    fibers are slow)."""
    return build_programs(tmp_path_factory, ("Small", "Wide", "Causal", "SplitNet"))


@pytest.fixture(scope="module")
def lenet_programs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_programs(tmp_path_factory, ("LeNet",))


@pytest.fixture(scope="module")
def odd_programs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_programs(tmp_path_factory, ("Odd",))


def build_programs(tmp_path_factory: pytest.TempPathFactory, names: tuple[str, ...],
                   options: tuple[str, ...] = ()) -> Path:  # fmt: skip
    """The programs `names` of NETWORKS compiled with --ptx (and `options`: `--precision bf16`) into src/, built
    into build/; their kernels for the CPU in NAME.so; the stand-in driver in fake/."""
    from click.testing import CliRunner

    from deepdsl.cli import cli

    folder = tmp_path_factory.mktemp("java_cuda")
    (folder / "small.ddsl").write_text(SMALL)
    (folder / "wide.ddsl").write_text(WIDE)
    (folder / "split.ddsl").write_text(SPLIT)
    (folder / "odd.ddsl").write_text(ODD)
    # attention: batched matmuls, each operand transposed or not, and plain ones for the weight gradients
    (folder / "causal.ddsl").write_text(causal_attention() + "train {\n  data = synthetic(seed=3)\n}\n")
    (folder / "lenet_slow.ddsl").write_text(
        (ROOT / "networks" / "lenet.ddsl").read_text().replace("lr=0.01,", "lr=0.001,")
    )
    src = folder / "src"
    rng = np.random.default_rng(0)
    np.savez(folder / "lenet_data.npz", x=rng.random((32, 1, 28, 28), np.float32), y=rng.integers(0, 10, 32),
             x_test=rng.random((16, 1, 28, 28), np.float32), y_test=rng.integers(0, 10, 16))  # fmt: skip
    for name in names:
        source, sets, _ = NETWORKS[name]
        flags = [f"--set={k}={v}" for k, v in sets.items()]
        r = CliRunner().invoke(
            cli, ["compile", str(folder / source), *flags, *options, "-o", str(src), "--ptx", "--arch", "sm_90"]
        )
        assert r.exit_code == 0, r.output
        unit = (src / f"{name}.cu").read_text()
        kernels = kernel_names(unit)  # every kernel but the tiled GEMMs loops over its output (grid or block stride)
        work = folder / name
        work.mkdir()
        # (a bf16 program's typed entries, dd_k_gemm_hhh, are tiled as their entries are: java/bf16.py)
        emulate(unit, kernels, work, [k for k in kernels if re.sub(r"_[hf]+$", "", k) not in TILED])
    javac(src, [*src.glob("*.java"), *(src / "deepdsl" / "runtime").glob("*.java")], folder / "build")
    fake_driver(folder / "fake")
    return folder


def run(folder: Path, name: str, *args: str, classpath: str | None = None, nvrtc: bool = False,
        vendor: Sequence[Path] = (), calls: Path | None = None, convolutions: Path | None = None,
        extra: dict[str, str] | None = None) -> dict:  # fmt: skip
    """The program on the stand-in GPU (--device cuda unless args say otherwise), as its --json object; the folders
    `vendor` (stand-ins for the CUDA libraries) on LD_LIBRARY_PATH too, the stand-in cuBLAS's count of GEMMs
    written to `calls`, the stand-in cuDNN's count of convolutions to `convolutions`, `extra` added to the
    environment. JavaCPP unpacks its natives into a cache of the test's own: it links there to a library it found
    itself (with pathsFirst), so a shared cache could lead one run to another's stand-ins."""
    cp = classpath or f"{folder / 'build'}:{folder / 'src'}:{jcuda_jars()}/*"
    libs = [str(folder / "fake"), *map(str, vendor)]
    if nvrtc:
        import nvidia.cuda_nvrtc as wheel  # the test extra's NVRTC, for JCuda's JNvrtc

        libs.append(os.path.join(next(iter(wheel.__path__)), "lib"))
    env = {
        **os.environ,
        "LD_LIBRARY_PATH": ":".join(libs),
        "DEEPDSL_FAKE_CUDA_KERNELS": str(folder / name / "emulated.so"),
        **({"FAKE_CUBLAS_CALLS": str(calls)} if calls else {}),
        **({"FAKE_CUDNN_CALLS": str(convolutions)} if convolutions else {}),
        **(extra or {}),
    }
    cache = f"-Dorg.bytedeco.javacpp.cachedir={folder / 'javacpp'}"
    cmd = ["java", cache, "-cp", cp, name, "--data", NETWORKS[name][2], *args]
    if "--device" not in args:
        cmd += ["--device", "cuda"]
    r = subprocess.run([*cmd, "--json"], cwd=folder, capture_output=True, text=True, timeout=600, env=env, check=False)
    # (--predict writes its file and no JSON object)
    return {"rc": r.returncode, "stderr": r.stderr, **(json.loads(r.stdout) if r.returncode == 0 and r.stdout else {})}


def cpu(folder: Path, name: str, *args: str) -> dict:
    r = java(folder / "build", name, "--data", NETWORKS[name][2], "--device", "cpu", *args, "--json", cwd=folder)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


_REFERENCES: dict[tuple, dict] = {}


def reference(folder: Path, name: str, *args: str) -> dict:
    """cpu(folder, name, *args), run once per module: several tests compare the CUDA device with the same CPU run
    (Small's three steps, five times), a JVM of its own each time. Only for runs that neither read nor write a
    parameter file (nothing another test changes); each caller gets its own copy."""
    assert not {"--save", "--load", "--predict"} & set(args), args
    key = (folder, name, args)
    if key not in _REFERENCES:
        _REFERENCES[key] = cpu(folder, name, *args)
    return copy.deepcopy(_REFERENCES[key])


@pytest.mark.parametrize(
    "name",
    [
        "Small",
        pytest.param("Wide", marks=pytest.mark.slow),  # 2.6 s, for the default's 4 minutes (Small, SplitNet stay)
        "SplitNet",
        pytest.param("Causal", marks=pytest.mark.slow),
        pytest.param("LeNet", marks=pytest.mark.slow),
    ],  # fmt: skip
)
def test_the_cuda_device_gives_the_cpu_devices_losses(request: pytest.FixtureRequest, name: str) -> None:
    programs = request.getfixturevalue("programs" if name != "LeNet" else "lenet_programs")
    got = run(programs, name, "--iters", "3")
    assert got["rc"] == 0, got["stderr"]
    want = reference(programs, name, "--iters", "3")
    assert got["device"] == "cuda"
    assert f"kernels from {name}.sm_90.ptx" in got["stderr"]
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-4)
    assert got["test_accuracy"] == pytest.approx(want["test_accuracy"])
    # the arena and every tensor, taken from the driver's free memory
    assert got["gpu_memory_bytes"] >= got["peak_bytes"] == want["peak_bytes"]


def test_the_cuda_device_allocates_what_the_plan_says(programs: Path) -> None:
    """SplitNet with our kernels: filter gradients whose reduction splits (their partial sums in the statements'
    planned workspace, in the arena) and SGD's updates as one multi-tensor launch (its table in the one allocation
    the class's settings size, memcheck's gpu_table_bytes). The stand-in driver's free memory (what cuMemAlloc took)
    falls by exactly what the device allocates at the start, by the plan: nothing beside it later."""
    from click.testing import CliRunner

    from deepdsl.cli import cli

    log = programs / "SplitNet.allocs.log"
    got = run(programs, "SplitNet", "--iters", "3", "--kernels", "own", extra={"FAKE_CUDA_LAUNCH_LOG": str(log)})
    assert got["rc"] == 0, got["stderr"]
    launched = log.read_text().split()
    assert "dd_k_conv2d_backward_filter_finish" in launched  # a filter gradient did split, in its workspace
    assert any(k.startswith("multiTensor") for k in launched)  # and the updates are one launch reading a table
    assert got["gpu_memory_bytes"] == got["gpu_planned_bytes"]
    r = CliRunner().invoke(cli, ["memcheck", str(programs / "split.ddsl"), "--json"])
    assert r.exit_code == 0, r.output
    mem = json.loads(r.output)
    # memcheck counts the PyCUDA runner's tables; the Java kernels read the settings a flag may override (SGD's
    # momentum, weight decay and rate) from the GPU, three more pointers in each of the 8 segments' rows
    assert got["gpu_table_bytes"] == mem["gpu_table_bytes"] + 8 * 3 * 8 and mem["gpu_table_bytes"] > 0
    # beside memcheck's peak (the parameters and optimiser state, the batch, the arena) and the tables, the device
    # holds its step counter (8 bytes) and the settings' 16 float slots (NetworkTensors.MAX_SETTINGS); no cuDNN
    # scratch under --kernels own
    assert got["gpu_planned_bytes"] == mem["peak_bytes"] + got["gpu_table_bytes"] + 8 + 16 * 4


@pytest.mark.slow  # 6 s (the default suite's four minutes)
def test_parameters_move_between_the_gpu_and_files(programs: Path) -> None:
    whole = reference(programs, "Small", "--iters", "4")["losses"]
    first = run(programs, "Small", "--iters", "2", "--save", "gpu.npz")
    assert first["rc"] == 0, first["stderr"]
    rest = cpu(programs, "Small", "--load", "gpu.npz", "--iters", "2")["losses"]
    np.testing.assert_allclose(first["losses"] + rest, whole, rtol=1e-4)
    cpu(programs, "Small", "--iters", "2", "--save", "cpu.npz")
    again = run(programs, "Small", "--load", "cpu.npz", "--iters", "2")
    assert again["rc"] == 0, again["stderr"]
    np.testing.assert_allclose(again["losses"], whole[2:], rtol=1e-4)


@pytest.mark.slow  # 5 s (the default suite's four minutes)
def test_without_ptx_the_source_is_compiled_at_start_or_the_reason_given(programs: Path) -> None:
    bare = programs / "no_ptx"
    bare.mkdir(exist_ok=True)
    shutil.copy(programs / "src" / "Small.cu", bare)
    cp = f"{programs / 'build'}:{bare}:{jcuda_jars()}/*"
    got = run(programs, "Small", "--iters", "2", classpath=cp, nvrtc=True)
    assert got["rc"] == 0, got["stderr"]
    assert "Small.cu, compiled at start with NVRTC" in got["stderr"]
    np.testing.assert_allclose(got["losses"], reference(programs, "Small", "--iters", "2")["losses"], rtol=1e-4)

    refused = run(programs, "Small", "--iters", "1", classpath=cp)  # no NVRTC to be found
    assert refused["rc"] == 1 and "deepdsl compile --ptx --arch sm_90" in refused["stderr"]
    nothing = f"{programs / 'build'}:{jcuda_jars()}/*"
    auto = run(programs, "Small", "--iters", "1", "--device", "auto", classpath=nothing)
    assert auto["rc"] == 0 and auto["device"] == "cpu"
    assert "CUDA not used: neither Small.sm_90.ptx nor Small.cu is on the class path" in auto["stderr"]


def test_a_setting_reaches_the_gpu_kernels(programs: Path) -> None:
    # 3 steps: step 3's loss shows the update of step 2, the first replay of the graph, which reads the setting
    got = run(programs, "Small", "--iters", "3", "--lr", "0.05")
    assert got["rc"] == 0 and "graph: on)" in got["stderr"], got["stderr"]
    np.testing.assert_allclose(
        got["losses"], reference(programs, "Small", "--iters", "3", "--lr", "0.05")["losses"], rtol=1e-4
    )
    assert not np.allclose(got["losses"], reference(programs, "Small", "--iters", "3")["losses"], rtol=1e-4)


def _float4_kernels(java: str) -> set[str]:
    """The CUDA kernels of the class's constants with a float4 loop: Kernel.vectorised, and their variants."""
    made = dict(re.findall(r'static final Kernel (\w+) =\s*Kernel\.vectorised\(\s*"(\w+)"', java))
    for const, name in re.findall(r'static final Kernel \w+ = (\w+)\.variant\("(\w+)"\);', java):
        if const in made:
            made[name] = name
    return set(made.values())


@pytest.mark.parametrize("name", ["Small", pytest.param("Odd", marks=pytest.mark.slow)])
def test_element_wise_kernels_launch_a_thread_per_float4_where_the_size_allows(request: pytest.FixtureRequest,
                                                                               name: str) -> None:  # fmt: skip
    """A kernel with a float4 loop is launched for n / 4 threads where its element count n is a multiple of 4 (the
    stand-in's allocations are 16-byte aligned, the plan's offsets multiples of 256), for n otherwise (Odd's ReLU
    gradient over 3 x 1001 values), the losses still the CPU device's."""
    programs = request.getfixturevalue("programs" if name != "Odd" else "odd_programs")
    grids = programs / f"{name}_grids.log"
    grids.unlink(missing_ok=True)
    got = run(programs, name, "--iters", "2", "--no-graph", extra={"FAKE_CUDA_LAUNCH_GRIDS": str(grids)})
    assert got["rc"] == 0, got["stderr"]
    np.testing.assert_allclose(got["losses"], reference(programs, name, "--iters", "2")["losses"], rtol=1e-4)
    vectorised = _float4_kernels((programs / "src" / f"{name}.java").read_text())
    lines = [line.split() for line in grids.read_text().splitlines()]
    launched = [(k, int(gx), int(bx), int(n)) for k, gx, bx, n in lines if k in vectorised]
    assert launched, vectorised
    for k, gx, bx, n in launched:
        threads = n // 4 if n % 4 == 0 else n
        assert (gx, bx) == (max(1, min(1 << 16, -(-threads // 256))), 256), (k, n, gx)
    if name == "Small":
        assert any(n % 4 == 0 and n >= 1024 for _, _, _, n in launched), launched  # fewer blocks for float4s
    else:
        assert any(n % 4 and n >= 1024 for _, _, _, n in launched), launched  # the scalar loop's grid


@pytest.fixture(scope="module")
def cuda13(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fake_cuda13(tmp_path_factory.mktemp("cuda13"))


@pytest.fixture(scope="module")
def cudnn9(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fake_cudnn9(tmp_path_factory.mktemp("cudnn9"))


@pytest.mark.parametrize(
    "name", ["Small", "Causal", *(pytest.param(n, marks=pytest.mark.slow) for n in ("Wide", "LeNet"))]
)
def test_gemms_through_cublas_give_the_cpu_devices_losses(
    request: pytest.FixtureRequest, cuda13: Path, cudnn9: Path, name: str
) -> None:
    programs = request.getfixturevalue("programs" if name != "LeNet" else "lenet_programs")
    calls = programs / f"{name}.cublas_calls"
    got = run(programs, name, "--iters", "3", "--kernels", "vendor", vendor=[cuda13, cudnn9], calls=calls)
    assert got["rc"] == 0, got["stderr"]
    assert "GEMMs: cuBLAS 13.0.0" in got["stderr"]
    # each has a linear layer: forward, backward-data and backward-filter in each of 3 steps, and the test pass
    assert int(calls.read_text()) >= 10
    want = reference(programs, name, "--iters", "3")
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-4)
    assert got["test_accuracy"] == pytest.approx(want["test_accuracy"])


@pytest.mark.slow  # three Java runs on the stand-ins (8 s)
def test_kernels_own_and_auto_choose_as_they_say(programs: Path, cuda13: Path, cudnn9: Path) -> None:
    calls, convolutions = programs / "own.cublas_calls", programs / "own.cudnn_calls"
    own = run(programs, "Small", "--iters", "1", "--kernels", "own", vendor=[cuda13, cudnn9], calls=calls,
              convolutions=convolutions)  # fmt: skip
    assert own["rc"] == 0, own["stderr"]
    assert "GEMMs: own kernel (--kernels own)" in own["stderr"] and not calls.exists()  # cuBLAS not even loaded
    assert "convolutions, pooling, batch norm, softmax and LRN: own kernels (--kernels own)" in own["stderr"]
    assert not convolutions.exists()
    auto = run(programs, "Small", "--iters", "1", vendor=[cuda13, cudnn9])
    # the device line names each library's file: which of several installed copies the loader took
    said = (f"GEMMs: cuBLAS 13.0.0 ({cuda13}/libcublas.so.13); convolutions, pooling, batch norm, softmax and LRN: "
            f"cuDNN 9.0.0 ({cudnn9}/libcudnn_graph.so.9);")  # fmt: skip
    assert auto["rc"] == 0 and said in auto["stderr"]
    no_cudnn = run(programs, "Small", "--iters", "1", vendor=[cuda13])
    assert no_cudnn["rc"] == 0
    own_dnn = "libcublas.so.13); convolutions, pooling, batch norm, softmax and LRN: own kernels (cuDNN does"
    assert own_dnn in no_cudnn["stderr"]
    without = run(programs, "Small", "--iters", "1")
    assert without["rc"] == 0
    assert "GEMMs: own kernel (cuBLAS does not load (libcudart.so.13 not found))" in without["stderr"]


def test_kernels_vendor_without_cublas_names_what_is_missing(programs: Path, tmp_path: Path) -> None:
    jars = jcuda_jars()
    for k, missing in enumerate(CUDA13):
        folder = fake_cuda13(tmp_path / missing, CUDA13[:k])
        got = run(programs, "Small", "--iters", "1", "--kernels", "vendor", vendor=[folder])
        assert got["rc"] == 1
        assert f"--kernels vendor: cuBLAS does not load ({missing} not found): it needs cuBLAS 13" in got["stderr"]
        assert "pip install nvidia-cublas" in got["stderr"]
    no_jars = f"{programs / 'build'}:{programs / 'src'}:" + ":".join(map(str, jars.glob("jcuda*.jar")))
    got = run(programs, "Small", "--iters", "1", "--kernels", "vendor", classpath=no_jars)
    assert got["rc"] == 1 and "the JavaCPP CUDA classes are not on the class path" in got["stderr"]
    assert "org.bytedeco:cuda:13.1-9.19-1.5.13" in got["stderr"]
    bad = run(programs, "Small", "--kernels", "cublas")
    assert bad["rc"] == 2 and "--kernels takes vendor, own or auto, not 'cublas'" in bad["stderr"]


def graph_launches(path: Path) -> tuple[int, int]:
    """The stand-in driver's count of graph launches and of the nodes they ran."""
    launches, nodes = path.read_text().split()
    return int(launches), int(nodes)


@pytest.mark.slow  # the graph's replays also in test_java_reductions' slow check (10 s)
def test_the_train_step_is_replayed_as_a_cuda_graph(programs: Path) -> None:
    counts = programs / "graph.launches"
    watch = {"FAKE_CUDA_GRAPH_LAUNCHES": str(counts)}
    on = run(programs, "Small", "--iters", "4", extra=watch)
    assert on["rc"] == 0, on["stderr"]
    assert "graph: on)" in on["stderr"]
    assert on["gpu_graph"] == "on"  # --json says it too (scripts/bench_gpu.py's Java rows read it)
    launches, nodes = graph_launches(counts)
    assert launches == 3 and nodes >= 3 * 10  # steps 2-4, each the step's every launch and copy
    off = run(programs, "Small", "--iters", "4", "--no-graph", extra=watch)
    assert off["rc"] == 0, off["stderr"]
    assert "graph: off (--no-graph)" in off["stderr"] and graph_launches(counts) == (0, 0)
    assert off["gpu_graph"] == "off (--no-graph)"
    # each step's batch and dropout counter are sent into the buffers the graph reads: the same losses
    assert on["losses"] == off["losses"]  # the same kernels on the same values: bit for bit
    # a replay that leaves out one launch (the step's last: an update) is caught by the losses after the first
    broken = run(programs, "Small", "--iters", "4", extra={**watch, "FAKE_CUDA_GRAPH_SKIP": "-1"})
    assert broken["rc"] == 0, broken["stderr"]
    assert graph_launches(counts) == (3, nodes - 3)
    assert broken["losses"][:2] == on["losses"][:2]
    assert not np.allclose(broken["losses"][2:], on["losses"][2:], rtol=1e-4)


def test_cublas_gemms_are_captured_in_the_graph(programs: Path, cuda13: Path, cudnn9: Path) -> None:
    counts, calls = programs / "cublas.launches", programs / "graph.cublas_calls"
    losses, gemms = {}, {}
    for flag in ("--graph", "--no-graph"):
        args = ("--iters", "4", "--kernels", "vendor", *([flag] if flag == "--no-graph" else []))
        got = run(programs, "Small", *args, vendor=[cuda13, cudnn9], calls=calls,
                  extra={"FAKE_CUDA_GRAPH_LAUNCHES": str(counts)})  # fmt: skip
        assert got["rc"] == 0, got["stderr"]
        assert "GEMMs: cuBLAS 13.0.0" in got["stderr"]
        losses[flag], gemms[flag] = got["losses"], int(calls.read_text())
        assert graph_launches(counts)[0] == (3 if flag == "--graph" else 0)
    # the stand-in cuBLAS computes a captured GEMM at each replay, on the stream it was given: as many as without
    assert gemms["--graph"] == gemms["--no-graph"] >= 4 * 3
    assert losses["--graph"] == losses["--no-graph"]


@pytest.mark.parametrize("name", ["Small", pytest.param("Wide", marks=pytest.mark.slow),
                                  pytest.param("LeNet", marks=pytest.mark.slow)])  # fmt: skip
def test_convolutions_through_cudnn_give_the_cpu_devices_losses(
    request: pytest.FixtureRequest, cuda13: Path, cudnn9: Path, name: str
) -> None:
    programs = request.getfixturevalue("programs" if name != "LeNet" else "lenet_programs")
    counts, convolutions = programs / f"{name}.launches", programs / f"{name}.cudnn_calls"
    want = reference(programs, name, "--iters", "3")
    done = {}
    for flag in ("--graph", "--no-graph"):
        args = ("--iters", "3", "--kernels", "vendor", *([flag] if flag == "--no-graph" else []))
        got = run(programs, name, *args, vendor=[cuda13, cudnn9], convolutions=convolutions,
                  extra={"FAKE_CUDA_GRAPH_LAUNCHES": str(counts)})  # fmt: skip
        assert got["rc"] == 0, got["stderr"]
        assert "convolutions, pooling, batch norm, softmax and LRN: cuDNN 9.0.0 (" in got["stderr"]
        np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-4)
        assert got["test_accuracy"] == pytest.approx(want["test_accuracy"])
        done[flag], memory = int(convolutions.read_text()), got["gpu_memory_bytes"]
        assert graph_launches(counts)[0] == (2 if flag == "--graph" else 0)
    # forward and backward-filter of each convolution in each of 3 steps, and the forward of the test pass; the
    # stand-in computes a captured convolution at each replay: as many with the graph as without
    assert done["--graph"] == done["--no-graph"] >= 3 * 2 + 1
    # the stand-in's first algorithm needs an im2col matrix of scratch (which the device allocates) and refuses a
    # smaller workspace: without one the other algorithm is chosen, and the GPU holds no scratch
    lean = run(programs, name, "--iters", "3", "--kernels", "vendor", "--workspace-limit", "0",
               vendor=[cuda13, cudnn9])  # fmt: skip
    assert lean["rc"] == 0, lean["stderr"]
    np.testing.assert_allclose(lean["losses"], want["losses"], rtol=1e-4)
    assert lean["gpu_memory_bytes"] < memory


def cudnn_ops(path: Path) -> dict[str, int]:
    """The stand-in cuDNN's count of each pooling, batch-norm, softmax and LRN call it computed."""
    return {name: int(count) for name, count in (line.split() for line in path.read_text().splitlines())}


@pytest.mark.slow
def test_pooling_softmax_and_lrn_through_cudnn_give_the_cpu_devices_losses(programs: Path, cuda13: Path,
                                                                           cudnn9: Path) -> None:  # fmt: skip
    ops, counts = programs / "Wide.cudnn_ops", {}
    want = cpu(programs, "Wide", "--iters", "3", "--save", "wide_cpu.npz")
    for flag in ("--graph", "--no-graph"):
        args = ("--iters", "3", "--kernels", "vendor", "--save", "wide_gpu.npz",
                *([flag] if flag == "--no-graph" else []))  # fmt: skip
        got = run(programs, "Wide", *args, vendor=[cuda13, cudnn9], extra={"FAKE_CUDNN_OPS_CALLS": str(ops)})
        assert got["rc"] == 0, got["stderr"]
        assert f"graph: {'on' if flag == '--graph' else 'off'}" in got["stderr"]
        np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-4)
        assert got["test_accuracy"] == pytest.approx(want["test_accuracy"])
        # the parameters too: Adam moves each by about its rate whatever the gradient's size, so a gradient sent
        # elsewhere (a max pool's to another element of its window) shows there before it shows in the losses
        with np.load(programs / "wide_gpu.npz") as gpu, np.load(programs / "wide_cpu.npz") as host:
            for name in host.files:
                np.testing.assert_allclose(gpu[name], host[name], rtol=1e-4, atol=1e-6, err_msg=name)
        counts[flag] = cudnn_ops(ops)
    # each of 3 steps: the max pool and the average pool, the softmax and the log softmax, the LRN, each forward
    # and backward; the forwards in the test pass too. Replays compute the captured calls: as many as call for call
    assert counts["--graph"] == counts["--no-graph"]
    got = counts["--graph"]
    assert got["cudnnPoolingBackward"] == 2 * 3 and got["cudnnSoftmaxBackward"] == 2 * 3
    assert got["cudnnLRNCrossChannelBackward"] == 3
    assert got["cudnnPoolingForward"] > 2 * 3 and got["cudnnSoftmaxForward"] > 2 * 3
    assert got["cudnnLRNCrossChannelForward"] > 3
    # the batch norm's apply in each training step (the test pass's apply is a kernel of the program); its gradient
    # never: our one pass on the statements' dgamma and dbeta, which cuDNN's backward would compute again
    assert got["cudnnBatchNormalizationForwardInference"] == 3 and got["cudnnBatchNormalizationBackward"] == 0


def test_a_call_cudnn_refuses_runs_our_kernel_under_auto_and_is_an_error_under_vendor(
    programs: Path, cuda13: Path, cudnn9: Path
) -> None:
    ops = programs / "refused.cudnn_ops"
    refuse = {"FAKE_CUDNN_OPS_CALLS": str(ops), "FAKE_CUDNN_REFUSE": "cudnnSetLRNDescriptor"}
    auto = run(programs, "Wide", "--iters", "2", vendor=[cuda13, cudnn9], extra=refuse)
    assert auto["rc"] == 0, auto["stderr"]
    np.testing.assert_allclose(auto["losses"], reference(programs, "Wide", "--iters", "2")["losses"], rtol=1e-4)
    got = cudnn_ops(ops)
    assert got["cudnnLRNCrossChannelForward"] == got["cudnnLRNCrossChannelBackward"] == 0  # our kernels
    assert got["cudnnPoolingBackward"] == 2 * 2 and got["cudnnSoftmaxBackward"] == 2 * 2  # the rest: cuDNN
    # said once per call refused (LRN forward and backward share the refused descriptor), where it happens
    notes = [line for line in auto["stderr"].splitlines() if line.startswith("note: cuDNN refuses")]
    assert len(notes) == 2 and all(line.endswith("): our kernel runs it") for line in notes), auto["stderr"]
    # refused at the call, not at its descriptor: the error names it
    strict = run(programs, "Wide", "--iters", "2", "--kernels", "vendor", vendor=[cuda13, cudnn9],
                 extra={"FAKE_CUDNN_REFUSE": "cudnnPoolingBackward"})  # fmt: skip
    assert strict["rc"] == 1
    assert ("error: --kernels vendor: cuDNN refuses a call (cudnnPoolingBackward returned cuDNN status 3000); "
            "--kernels auto runs our kernel there") in strict["stderr"]  # fmt: skip


def test_kernels_vendor_without_cudnn_names_what_is_missing(programs: Path, cuda13: Path, cudnn9: Path,
                                                            tmp_path: Path) -> None:  # fmt: skip
    got = run(programs, "Small", "--iters", "1", "--kernels", "vendor", vendor=[cuda13])
    assert got["rc"] == 1
    assert "--kernels vendor: cuDNN does not load (libcudnn" in got["stderr"]
    assert "not found): it needs cuDNN 9" in got["stderr"] and "pip install nvidia-cudnn-cu13" in got["stderr"]
    partial = tmp_path / "partial"  # a sub-library missing: the one it is is named
    shutil.copytree(cudnn9, partial)
    (partial / "libcudnn_cnn.so.9").unlink()
    got = run(programs, "Small", "--iters", "1", "--kernels", "vendor", vendor=[cuda13, partial])
    assert got["rc"] == 1 and "cuDNN does not load (libcudnn_cnn.so.9 not found)" in got["stderr"], got["stderr"]


@pytest.mark.slow  # both devices' Find on the stand-ins (9 s)
def test_the_cuda_device_finds_the_convolution_algorithms_the_python_runner_does(
    programs: Path, cuda13: Path, cudnn9: Path, tmp_path: Path
) -> None:
    """cuDNN's algorithms by timing (the stand-in's cudnnFind...Ex and fake times) on the Java CUDA device: for each
    convolution the algorithm and scratch the Python runner finds for the same shapes; the one shared scratch is
    the most of them (--json), and the losses are the CPU device's. Under --deterministic: the heuristic's, as the
    Python runner's under deterministic=True."""
    from cuda_emulator import EmulatedDriver, fake_vendor

    from deepdsl import api
    from deepdsl.backends.cuda.runner import GpuRunner
    from deepdsl.backends.cuda.vendor import open_vendor

    build = api.build(api.compile_source(SMALL, "small.ddsl", {}).program)
    arrays = {p.value.name: np.zeros(p.value.type.shape, np.float32) for p in build.train_plan.graph.params}
    stand_ins = fake_vendor(tmp_path / "vendor")
    want = reference(programs, "Small", "--iters", "2")
    rest = set()  # the GPU memory measured less the shared scratch: the same, whichever algorithms (one scratch)
    for flags, deterministic in (((), False), (("--deterministic",), True)):
        driver = EmulatedDriver(tmp_path / str(deterministic), vendor=open_vendor("vendor", [stand_ins]))
        runner = GpuRunner(driver, build.train_plan, build.infer_plan, arrays, deterministic=deterministic)
        python = {(c["call"], c["shape"]): (c["algorithm"], c["workspace_bytes"]) for c in runner.convolutions}
        runner.close()
        got = run(programs, "Small", "--iters", "2", "--kernels", "vendor", *flags, vendor=[cuda13, cudnn9])
        assert got["rc"] == 0, got["stderr"]
        java = {(c["call"], c["shape"]): (c["algorithm"], c["workspace_bytes"]) for c in got["gpu_convolutions"]}
        assert java == python and len(java) >= 4, (java, python)
        assert got["gpu_deterministic"] is deterministic
        assert all((c["time_ms"] is None) == deterministic for c in got["gpu_convolutions"])
        assert got["gpu_vendor_scratch_bytes"] >= max(w for _, w in java.values())
        rest.add(got["gpu_memory_bytes"] - got["gpu_vendor_scratch_bytes"])
        np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-4)
        line = "the fastest cuDNN finds" if not deterministic else "cuDNN's heuristic, deterministic"
        assert line in got["stderr"]
    assert len(rest) == 1


def test_precision_tf32_runs_cublas_and_cudnn_in_tf32_math(programs: Path, cuda13: Path, cudnn9: Path) -> None:
    """--precision tf32 on the CUDA device: every GEMM in CUBLAS_TF32_TENSOR_OP_MATH and every convolution in
    CUDNN_TENSOR_OP_MATH (the stand-ins count them), said on the device line and in --json; fp32 runs none so; the
    CPU device runs tf32 as fp32 and says so."""
    gemms, convolutions = programs / "Small.tf32_gemms", programs / "Small.tf32_convolutions"
    counted = {"FAKE_CUBLAS_TF32_CALLS": str(gemms), "FAKE_CUDNN_TF32_CALLS": str(convolutions)}
    want = reference(programs, "Small", "--iters", "3")
    for precision in ("fp32", "tf32"):
        got = run(programs, "Small", "--iters", "3", "--kernels", "vendor", "--precision", precision,
                  vendor=[cuda13, cudnn9], extra=counted)  # fmt: skip
        assert got["rc"] == 0, got["stderr"]
        assert got["precision"] == precision and "precision_note" not in got
        tf32 = int(gemms.read_text()), int(convolutions.read_text())
        assert (min(tf32) > 0) if precision == "tf32" else tf32 == (0, 0)
        assert (", TF32;" in got["stderr"]) == (precision == "tf32")
        np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-2)  # TF32 keeps ~3 decimal digits
    on_cpu = reference(programs, "Small", "--iters", "1", "--precision", "tf32")
    assert on_cpu["precision"] == "fp32" and "no TF32 math" in on_cpu["precision_note"]


def test_precision_bf16_of_an_fp32_program_names_the_compile_that_plans_it(programs: Path) -> None:
    """bf16 is planned at compile time (two bytes a bf16 value): an fp32 program's --precision bf16 is a usage error
    naming `deepdsl compile --precision bf16` (tests/backends/test_java_bf16.py runs such a program)."""
    r = java(programs / "build", "Small", "--data", "synthetic", "--device", "cpu", "--precision", "bf16",
             cwd=programs)  # fmt: skip
    assert r.returncode == 2
    assert "compiled for fp32" in r.stderr and "`deepdsl compile --precision bf16`" in r.stderr
