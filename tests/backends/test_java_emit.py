"""The Java emitter: every network compiles to Java that javac accepts, LeNet's class is a golden file, the
command line's errors, and the loop kernels against `evaluate` (random index expressions and the index form of
every registry op, all in one JVM)."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from helpers import GOLDEN, NETWORKS, ROOT
from java_env import JAVA_MARKS, java, javac, launch_env, mpi
from ops.test_registry_complete import EXAMPLES
from oracle_inputs import op_inputs

from deepdsl.backends.java.kernels import java_cost, java_kernel, split_of
from deepdsl.backends.java.unit_axes import padded
from deepdsl.checkpoint import save_npz
from deepdsl.ir import REGISTRY
from deepdsl.ir.analysis import out_vars
from deepdsl.ir.groups import is_flat
from deepdsl.ir.indexexpr import FUNCTIONS, IE, Affine, Apply, Const, Read, Reduce, Var
from deepdsl.ir.types import DType, TensorType
from deepdsl.ops.elementwise import gelu_index
from deepdsl.ops.indexed import evaluate

pytestmark = JAVA_MARKS


# the default suite compiles the networks that exercise what differs between them: VGG-16's arena needs long
# offsets, GoogLeNet's steps are split into methods (Java's 64 KB limit); `-m slow` compiles all seven
COMPILED = ("mlp", "lenet", "vgg16", "googlenet")


@pytest.mark.parametrize(
    "nets", [COMPILED, pytest.param(tuple(p.stem for p in NETWORKS), marks=pytest.mark.slow)], ids=["some", "all"]
)
def test_every_network_compiles_with_javac(cli, tmp_path: Path, nets: tuple[str, ...]) -> None:  # noqa: ANN001
    out = tmp_path / "java"
    for net in nets:
        r = cli("compile", str(ROOT / "networks" / f"{net}.ddsl"), "-o", str(out))  # the real sizes
        assert r.exit_code == 0, r.output
    classes = sorted(out.glob("*.java"))
    assert len(classes) == len(nets)
    for path in [*out.rglob("*.java"), *out.rglob("*.cu")]:  # ASCII: javac reads it under any locale's encoding
        assert path.read_bytes().isascii(), f"{path.relative_to(out)} holds a non-ASCII character"
    split = re.compile(r"\n    private void [a-z]\w*\(\) \{")  # a part of a step, named after its layers
    assert any(split.search(c.read_text()) for c in classes)
    javac(out, [*classes, *sorted((out / "deepdsl" / "runtime").glob("*.java"))], tmp_path / "build")
    for source in classes:  # straight-line steps split into parts where a method would grow too large
        for body in re.findall(r"\n    (?:private )?void \w+\(\) \{\n(.*?)\n    \}\n", source.read_text(), re.S):
            assert body.count(";") <= 250, source.name


def test_lenet_golden(cli, golden, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the train block's data path is compiled in as seen from here
    r = cli("compile", str(ROOT / "networks" / "lenet.ddsl"), "-o", str(tmp_path / "LeNet.java"))
    assert r.exit_code == 0, r.output
    golden(GOLDEN / "java" / "LeNet.java", (tmp_path / "LeNet.java").read_text())
    # the kernels' source beside the class; without --ptx the CUDA device compiles it at start, and says so
    assert (tmp_path / "LeNet.cu").read_text().count('extern "C" __global__') > 20
    assert "compiles LeNet.cu with NVRTC when it starts" in r.stdout
    assert {p.name for p in (tmp_path / "deepdsl" / "runtime").glob("*.java")} >= {
        "Buf.java",
        "CpuDevice.java",
        "CpuLosses.java",
        "CudaDevice.java",
        "Device.java",
        "Network.java",
        "Npz.java",
        "Data.java",
    }


def test_compile_usage_errors(cli, tmp_path: Path) -> None:
    lenet = str(ROOT / "networks" / "lenet.ddsl")
    r = cli("compile", lenet, "-o", str(tmp_path / "Net.java"))
    assert r.exit_code == 2 and "LeNet.java" in r.output
    assert cli("compile", lenet).exit_code == 2
    bad = tmp_path / "bad.ddsl"
    bad.write_text("network B\nconst N = 2\ninput x : [N, 4]\nloss = relux(x)\n")
    r = cli("compile", str(bad), "-o", str(tmp_path))
    assert r.exit_code == 1 and "relux" in r.output


def test_maven_project_layout(cli, tmp_path: Path) -> None:
    r = cli("compile", str(ROOT / "networks" / "mlp.ddsl"), "--maven", str(tmp_path / "mlp"))
    assert r.exit_code == 0, r.output
    pom = (tmp_path / "mlp" / "pom.xml").read_text()
    for artifact in ("jcuda", "jcuda-natives", "openblas", "javacpp"):
        assert f"<artifactId>{artifact}</artifactId>" in pom
    assert "<openblas.version>0.3.31-1.5.13</openblas.version>" in pom and "<id>cuda13</id>" in pom
    assert "<mainClass>MLP</mainClass>" in pom and "linux-x86_64" in pom
    assert (tmp_path / "mlp" / "src" / "main" / "java" / "MLP.java").is_file()
    assert (tmp_path / "mlp" / "src" / "main" / "resources" / "MLP.cu").is_file()  # in the jar: on the class path
    assert (tmp_path / "mlp" / "src" / "main" / "java" / "deepdsl" / "runtime" / "Network.java").is_file()
    assert "<artifactId>jna</artifactId>" not in pom  # one rank: no MPI, no NCCL, no JNA


def test_a_data_parallel_maven_project_brings_jna(cli, tmp_path: Path) -> None:
    """JNA is the data-parallel runtime's binding to MPI and libc: `--data-parallel --maven` puts it in the pom, so
    that the jar runs under mpiexec without a class path of the user's making (it did not: 'JNA ... is not on the
    class path')."""
    r = cli("compile", str(ROOT / "networks" / "mlp.ddsl"), "--data-parallel", "--maven", str(tmp_path / "mlp"))
    assert r.exit_code == 0, r.output
    pom = (tmp_path / "mlp" / "pom.xml").read_text()
    jna = pom.index("<artifactId>jna</artifactId>")
    assert pom.rindex("<dependency>", 0, jna) > pom.index("<dependencies>")  # the build's own, not a profile's
    assert pom.index("<version>5.19.1</version>", jna) < pom.index("</dependency>", jna)


def test_the_pinned_versions_are_the_tested_ones() -> None:
    """The versions a user's build gets (the pom `--maven` writes, the JNA the runtime's messages name, the jars
    scripts/gpu_prepare.sh carries to a GPU) are those of .ci/jcuda/pom.xml, the jars every Java test compiles and
    runs against: a version bumped in one place alone fails here."""
    import xml.etree.ElementTree as ET

    from deepdsl.backends import java as java_backend

    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    tested: dict[str, set[str]] = {}
    for dep in ET.parse(ROOT / ".ci" / "jcuda" / "pom.xml").getroot().iterfind(".//m:dependency", ns):
        tested.setdefault(dep.findtext("m:artifactId", namespaces=ns), set()).add(
            dep.findtext("m:version", namespaces=ns)
        )
    versions = java_backend.JAVACPP_VERSIONS
    assert tested["jcuda"] == tested["jcuda-natives"] == {java_backend.JCUDA_VERSION}
    assert tested["javacpp"] == {versions["javacpp"]}
    assert tested["openblas"] == {versions["openblas"]}
    assert tested["cuda"] == {versions["cuda13"]}
    assert versions["cuda13"].endswith("-" + versions["javacpp"]) and versions["openblas"].endswith(
        "-" + versions["javacpp"]
    )
    (jna,) = tested["jna"]
    assert re.findall(r"<version>([^<]+)</version>", java_backend.JNA) == [jna]
    runtime = ROOT / "deepdsl" / "runtime"
    named = {v for f in ("MpiCollective.java", "NcclCollective.java")
             for v in re.findall(r"jna[:-](\d+\.\d+\.\d+)", (runtime / f).read_text())}  # fmt: skip
    assert named == {jna}
    prepare = (ROOT / "scripts" / "gpu_prepare.sh").read_text()
    assert set(re.findall(r"jcuda-(\d+\.\d+\.\d+)\.jar", prepare)) == {java_backend.JCUDA_VERSION}
    assert set(re.findall(r"javacpp-(\d+\.\d+\.\d+)", prepare)) == {versions["javacpp"]}
    assert set(re.findall(r"CUDA_PRESETS=cuda-(\S+)", prepare)) == {versions["cuda13"]}


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("mvn") is None, reason="mvn is not on PATH")
def test_maven_package_builds_a_runnable_jar(cli, tmp_path: Path) -> None:
    project = tmp_path / "mlp"
    assert cli("compile", str(ROOT / "networks" / "mlp.ddsl"), "--set", "N=4", "--maven", str(project)).exit_code == 0
    subprocess.run(["mvn", "-B", "-q", "package"], cwd=project, check=True)
    assert "MLP.cu" in subprocess.run(["jar", "tf", "target/mlp-1.0.jar"], cwd=project, capture_output=True,
                                      text=True, check=True).stdout  # fmt: skip
    r = subprocess.run(["java", "-jar", "target/mlp-1.0.jar", "--data", "synthetic", "--iters", "2", "--device", "cpu"],
                       cwd=project, capture_output=True, text=True, check=False)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "iter 2/2" in r.stdout
    assert "GEMM OpenBLAS 0.3.31, " in r.stdout.splitlines()[0]  # the pom brings OpenBLAS and its natives
    # the CUDA 12 presets' profile: JavaCPP and OpenBLAS of their release (one JavaCPP version per build)
    subprocess.run(["mvn", "-B", "-q", "-P", "cuda12", "clean", "package"], cwd=project, check=True)
    jars = {p.name for p in (project / "target" / "lib").iterdir()}
    assert {"cuda-12.9-9.10-1.5.12.jar", "javacpp-1.5.12.jar", "openblas-0.3.30-1.5.12.jar"} <= jars, jars
    assert not any("1.5.13" in jar for jar in jars), jars
    r = subprocess.run(["java", "-jar", "target/mlp-1.0.jar", "--data", "synthetic", "--iters", "1", "--device", "cpu"],
                       cwd=project, capture_output=True, text=True, check=False)  # fmt: skip
    assert r.returncode == 0 and "GEMM OpenBLAS 0.3.30, " in r.stdout.splitlines()[0], r.stdout + r.stderr


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("mvn") is None, reason="mvn is not on PATH")
def test_a_data_parallel_maven_jar_trains_under_mpiexec(cli, tmp_path: Path) -> None:
    """The jar of `--data-parallel --maven`, as `mvn package` builds it, under `mpiexec -n 2` (the dist extra's
    MPICH, its library found beside mpiexec): the same losses as one process of two micro-batches."""
    mpiexec, lib = mpi()
    project = tmp_path / "mlp"
    args = ["compile", str(ROOT / "networks" / "mlp.ddsl"), "--set", "N=8", "--data-parallel", "--maven", str(project)]
    assert cli(*args).exit_code == 0
    subprocess.run(["mvn", "-B", "-q", "package"], cwd=project, check=True)
    run = ["java", "-jar", "target/mlp-1.0.jar", "--device", "cpu", "--data", "synthetic", "--iters", "3", "--json"]
    env = launch_env(PATH=f"{lib.parent / 'bin'}:{os.environ.get('PATH', '')}", OPENBLAS_NUM_THREADS="1")
    ranks = subprocess.run([mpiexec, "-n", "2", *run], cwd=project, capture_output=True, text=True, env=env,
                           timeout=120, check=False)  # fmt: skip
    assert ranks.returncode == 0, ranks.stderr
    micro = subprocess.run([*run, "--micro-batches", "2"], cwd=project, capture_output=True, text=True, env=env,
                           timeout=120, check=False)  # fmt: skip
    assert micro.returncode == 0, micro.stderr
    assert json.loads(ranks.stdout)["losses"] == json.loads(micro.stdout)["losses"]


# ---- kernels: random index expressions and every op's index form, against `evaluate` ----

_FNS = [*FUNCTIONS, "+", "-", "*", "/", "^", "<", ">=", "==", "and", "or", "not", "neg", "select"]


def _random_ie(rng: random.Random, out: tuple[tuple[str, int], ...], shapes: list[tuple[int, ...]]) -> IE:
    def read(scope: dict[str, int]) -> IE:
        k = rng.randrange(len(shapes))
        index = []
        for dim in shapes[k]:
            var = rng.choice(sorted(scope))
            coeff = rng.choice([1, 1, 1, 2, -1])
            index.append(Affine(((var, coeff),), rng.choice([0, 0, 1, -1, dim - 1])))
        return Read(k, tuple(index))

    def expr(depth: int, scope: dict[str, int]) -> IE:
        roll = rng.random()
        if depth == 0 or roll < 0.25:
            return read(scope) if rng.random() < 0.8 else Const(rng.choice([0.5, 2.0, -1.0, 3.0]))
        if roll < 0.35:
            return Var(rng.choice(sorted(scope)))
        if roll < 0.5:
            names = [f"r{depth}{k}" for k in range(rng.choice([1, 2]))]
            inner = {**scope, **{n: rng.choice([1, 2, 3]) for n in names}}
            return Reduce(rng.choice(["sum", "max"]), tuple((n, inner[n]) for n in names), expr(depth - 1, inner))
        fn = rng.choice(_FNS)
        arity = 3 if fn == "select" else 1 if fn in ("not", "neg") else FUNCTIONS.get(fn, 2)
        if fn == "^":
            return Apply(fn, (expr(depth - 1, scope), Const(rng.choice([2.0, 3.0]))))
        return Apply(fn, tuple(expr(depth - 1, scope) for _ in range(arity)))

    return expr(3, dict(out))


def _cases() -> list[tuple[str, IE, tuple, list[np.ndarray]]]:
    rng = random.Random(6)
    data = np.random.default_rng(6)
    cases = []
    for k in range(40):
        out = tuple((f"i{j}", rng.choice([1, 2, 3, 5])) for j in range(rng.choice([0, 1, 2, 3])))
        shapes = [tuple(rng.choice([1, 2, 3, 4]) for _ in range(rng.choice([0, 1, 2, 3])))
                  for _ in range(rng.choice([1, 2, 3]))]  # fmt: skip
        if not out:
            out = (("i0", 4),)
        xs = [data.uniform(0.1, 2.0, s).astype(np.float32) for s in shapes]
        cases.append((f"random{k}", _random_ie(rng, out, shapes), out, xs))
        if k < 12:  # a subexpression used several times (a reduction, a boolean): computed once, in a local
            sub = _random_ie(rng, out, shapes)
            test = Apply("<", (sub, Const(1.0)))
            shared = Apply("select", (test, Apply("*", (sub, sub)), Apply("+", (test, Apply("-", (Const(0.5), sub))))))
            cases.append((f"shared{k}", shared, out, xs))
    cases += _collapse_cases(data)
    cases += _column_cases(data)
    cases += _split_cases(np.random.default_rng(11))  # its own stream: the cases after it keep their data
    cases += _gelu_cases(data)
    for name in sorted(REGISTRY):  # every op with an index form runs through the same generated loops
        form = REGISTRY[name].index_form
        if form is None or name not in EXAMPLES:
            continue
        types, attrs = EXAMPLES[name]
        out_type = REGISTRY[name].shape(tuple(types), dict(attrs))
        body = form(tuple(types), out_type, dict(attrs))
        # both signs, zeros and the op's kinks (tests/oracle_inputs.py); ids in {0, 1} for integer inputs
        xs = [x.astype(np.float32) for x in op_inputs(REGISTRY[name], tuple(types), data, ints=(0, 2))]
        cases.append((name, body, tuple(zip(out_vars(out_type), out_type.shape)), xs))
    # a relu's gradient, which the Java kernel writes without a branch (Kernel.whenPositive), over y of every sign
    # and class: zeros, a subnormal, infinities, NaN
    special = [0.0, -0.0, 1e-45, -1e-45, np.inf, -np.inf, np.nan, 1.0, -1.0, 3e38, -3e38]
    y = np.concatenate([data.standard_normal(53), special]).astype(np.float32)
    relu_grad = REGISTRY["relu_grad"].index_form((TensorType((64,), DType.F32),) * 2, TensorType((64,), DType.F32), {})
    cases.append(("relu_grad_signs", relu_grad, (("i0", 64),), [data.standard_normal(64).astype(np.float32), y]))
    return cases


def _gelu_cases(data: np.random.Generator) -> list[tuple[str, IE, tuple, list[np.ndarray]]]:
    """GELU and its gradient, which the Java kernels run through the runtime's vectorised loops (Kernel.gelu,
    Kernel.geluGrad), over both signs and past every regime of its rational e^-y: several blocks
    of 256 and a ragged last one, zero and minus zero, |x| where e^(-x^2/2) is below float's range, and NaN."""
    special = [0.0, -0.0, 1e-8, -1e-8, 13.3, -13.3, 40.0, -40.0, 1e3, -1e3, np.nan]
    x = np.concatenate([np.linspace(-12, 12, 1289), special]).astype(np.float32)
    data.shuffle(x)
    g = data.standard_normal(x.shape).astype(np.float32)
    t = TensorType((x.size,), DType.F32)
    out = (("i0", x.size),)
    v = Affine.var
    biased = gelu_index(Apply("+", (Read(0, (v("i0"), v("i1"))), Read(1, (v("i1"),)))), 0)  # an inference epilogue
    rows = np.random.default_rng(12)  # its own stream: the cases after it keep their data
    products, bias = (
        rows.standard_normal((200, 300)).astype(np.float32) * 4,
        rows.standard_normal(300).astype(np.float32),
    )
    return [("gelu_wide", REGISTRY["gelu"].index_form((t,), t, {}), out, [x]),
            ("gelu_grad_wide", REGISTRY["gelu_grad"].index_form((t, t), t, {}), out, [g, x]),
            ("gelu_of_product_plus_bias", biased, (("i0", 200), ("i1", 300)), [products, bias])]  # fmt: skip


def _split_cases(data: np.random.Generator) -> list[tuple[str, IE, tuple, list[np.ndarray]]]:
    """Kernels large enough to run on several threads where the runtime splits them by something other than their
    first axis: a layer norm's `[1, rows, width]` (split by its rows, the second axis) and sums down 256 and 64
    columns (split into runs of Kernel.COLUMN_GRAIN columns, or not at all)."""
    v = Affine.var
    centred = Apply("*", (Apply("-", (Read(0, (v("i0"), v("i1"), v("i2"))), Read(1, (v("i1"),)))), Read(2, (v("i1"),))))
    rows = [data.uniform(-2.0, 2.0, s).astype(np.float32) for s in ((1, 600, 64), (600,), (600,))]
    cases = [("rows_of_a_unit_first_axis", centred, (("i0", 1), ("i1", 600), ("i2", 64)), rows)]
    for width in (256, 64):
        column = Reduce("sum", (("r0", 1024),), Read(0, (v("r0"), v("i0"))))
        cases.append((f"sum_down_{width}_columns", column, (("i0", width),),
                      [data.uniform(-1.0, 1.0, (1024, width)).astype(np.float32)]))  # fmt: skip
    return cases


def _column_cases(data: np.random.Generator) -> list[tuple[str, IE, tuple, list[np.ndarray]]]:
    """Sums down columns (java/column_sums.py: the reduction outside, the output's last axis inside), one-hot
    lookups and scatters with their test outside the inner loop (token 5 matches no row), a flat kernel whose
    scalar-only parts are computed before its loop (java/invariants.py), with `x ^ 1` and `x ^ 2` written as x and
    x * x, and a shaped one whose parts that do not use its last index (a row's max, a row's scale) are computed
    before its inner loop."""
    v = Affine.var
    shifted = Read(0, (Affine((("r0", 1),), -1), v("i0"), v("i1")))  # a bounds test on an axis before the last
    weighted = Reduce("sum", (("r0", 4),), Apply("*", (shifted, Read(1, (v("r0"),)))))
    middle = Reduce("sum", (("r0", 4),), Read(0, (v("r0"), v("i0"), v("i1"))))
    lookup = Reduce("sum", (("r0", 5),), Apply("select", (Apply("==", (Read(0, (v("i0"), v("i1"))), Var("r0"))),
                                                          Read(1, (v("r0"), v("i2"))), Const(0.0))))  # fmt: skip
    scatter = Reduce(
        "sum",
        (("r0", 2), ("r1", 3)),
        Apply(
            "select",
            (Apply("==", (Read(0, (v("r0"), v("r1"))), Var("i0"))), Read(1, (v("r0"), v("r1"), v("i1"))), Const(0.0)),
        ),
    )
    tokens = data.integers(0, 6, (2, 3)).astype(np.float32)
    scalar = Read(1, ())
    scalars = Apply("-", (Const(1.0), Apply("^", (scalar, Read(2, ())))))
    own = Read(0, (v("i0"),))
    squares = Apply("*", (Apply("^", (own, Const(2.0))), Apply("^", (scalar, Const(2.0)))))
    flat = Apply("+", (Apply("*", (Apply("^", (own, Const(1.0))), scalars)), squares))
    row = Read(0, (v("i0"), v("i1")))  # minus its row's max, over its row's scale: both before the inner loop
    row_max = Reduce("max", (("r0", 5),), Read(0, (v("i0"), v("r0"))))
    normalised = Apply("/", (Apply("-", (row, row_max)), Apply("sqrt", (Read(1, (v("i0"),)),))))
    specs = [
        ("weighted", weighted, (("i0", 3), ("i1", 5)), [(4, 3, 5), (4,)]),
        ("middle", middle, (("i0", 3), ("i1", 5)), [(4, 3, 5)]),
        ("lookup", lookup, (("i0", 2), ("i1", 3), ("i2", 4)), [None, (5, 4)]),
        ("scatter", scatter, (("i0", 6), ("i1", 4)), [None, (2, 3, 4)]),
        ("hoisted", flat, (("i0", 7),), [(7,), (), ()]),
        ("row_invariant", normalised, (("i0", 3), ("i1", 5)), [(3, 5), (3,)]),
    ]
    return [(f"column_{name}", body, o, [tokens if s is None else data.uniform(0.1, 2.0, s).astype(np.float32)
                                         for s in shapes]) for name, body, o, shapes in specs]  # fmt: skip


def _collapse_cases(data: np.random.Generator) -> list[tuple[str, IE, tuple, list[np.ndarray]]]:
    """Kernels whose adjacent axes backends/collapse.py merges (or, for the last two, must not)."""
    v = Affine.var
    out = (("i0", 2), ("i1", 3), ("i2", 4), ("i3", 8))
    plain = Read(0, (v("i0"), v("i1"), v("i2"), v("i3")))
    sums = Reduce("sum", (("r0", 2), ("r1", 4), ("r2", 8)), Read(0, (v("r0"), v("i0"), v("r1"), v("r2"))))
    maxes = Reduce("max", (("r0", 3), ("r1", 4)), Read(0, (v("i0"), v("i1"), v("r0"), v("r1"))))
    shifted = Read(0, (v("i0"), v("i1"), v("i2"), Affine((("i3", 1),), -1)))
    transposed = Read(1, (v("i0"), v("i1"), v("i3"), v("i2")))
    specs = [
        ("bias_add", Apply("+", (plain, Read(1, (v("i1"),)))), out, [(2, 3, 4, 8), (3,)]),
        ("row_scale", Apply("*", (plain, Read(1, (v("i0"),)))), out, [(2, 3, 4, 8), (2,)]),
        ("channel_sum", sums, (("i0", 3),), [(2, 3, 4, 8)]),
        ("window_max", maxes, (("i0", 2), ("i1", 5)), [(2, 5, 3, 4)]),
        ("shifted", Apply("+", (shifted, Read(1, (v("i1"),)))), out, [(2, 3, 4, 8), (3,)]),
        ("transposed", Apply("-", (plain, transposed)), out, [(2, 3, 4, 8), (2, 3, 8, 4)]),
        ("sliced", Apply("+", (plain, Read(1, (v("i1"),)))), out[:3] + (("i3", 5),), [(2, 3, 4, 8), (3,)]),
    ]
    return [(f"collapse_{name}", body, o, [data.standard_normal(s).astype(np.float32) for s in shapes])
            for name, body, o, shapes in specs]  # fmt: skip


def _shared_cases(data: np.random.Generator) -> list[tuple]:
    """Kernels shared across sizes (java/unit_axes.py): the text written for one size (lane sums with their
    tails), run on tensors of another, against `evaluate` of the statement they serve: a rank-2 bias add and
    column sum run as their rank-4 forms on [N, C, 1, 1] views, and a channel sum whose H * W (9) its lanes do
    not divide. Each: name, the statement's body, output and inputs, then the body, output and shapes written."""
    v = Affine.var
    bias = Apply("+", (Read(0, (v("i0"), v("i1"))), Read(1, (v("i1"),))))
    column = Reduce("sum", (("r0", 6),), Read(0, (v("r0"), v("i0"))))
    cases = []
    for name, body, out, shapes in [("bias_add", bias, (("i0", 4), ("i1", 3)), [(4, 3), (3,)]),
                                    ("column_sum", column, (("i0", 3),), [(6, 3)])]:  # fmt: skip
        wide = padded(body, out, tuple(shapes), unit=2)
        assert wide is not None
        xs = [data.uniform(0.1, 2.0, s).astype(np.float32) for s in shapes]
        cases.append((f"padded_{name}", body, out, xs, *wide[:3]))
    sums = Reduce("sum", (("r0", 2), ("r1", 4), ("r2", 8)), Read(0, (v("r0"), v("i0"), v("r1"), v("r2"))))
    nine = Reduce("sum", (("r0", 2), ("r1", 3), ("r2", 3)), Read(0, (v("r0"), v("i0"), v("r1"), v("r2"))))
    xs = [data.uniform(0.1, 2.0, (2, 3, 3, 3)).astype(np.float32)]
    cases.append(("tail_channel_sum", nine, (("i0", 3),), xs, sums, (("i0", 3),), ((2, 3, 4, 8),)))
    return cases


def test_a_rank_2_kernel_has_a_rank_4_form_only_where_it_reads_the_same() -> None:
    v = Affine.var
    out = (("i0", 4), ("i1", 3))
    transposed = Apply("+", (Read(0, (v("i0"), v("i1"))), Read(1, (v("i1"), v("i0")))))
    assert padded(transposed, out, ((4, 3), (3, 4))) is not None  # the [C, N] input is not padded
    assert padded(transposed, (("i0", 3), ("i1", 3)), ((3, 3), (3, 3))) is None  # a [N, C] input read transposed
    column = Reduce("sum", (("r0", 6),), Read(0, (v("r0"), v("i0"))))
    both = Apply("+", (column, Read(0, (Affine((), 0), v("i0")))))
    assert padded(both, (("i0", 3),), ((6, 3),)) is None  # the input read outside the sum too
    wide = padded(column, (("i0", 3),), ((6, 3),))
    assert wide is not None and wide[2] == ((6, 3, 1, 1),) and wide[3] == {0: (6, 3, 1, 1)}


def test_kernels_equal_evaluate(tmp_path: Path) -> None:
    cases = [(*c, c[1], c[2], tuple(x.shape for x in c[3])) for c in _cases()]
    cases += _shared_cases(np.random.default_rng(7))
    methods, calls, inputs = [], [], {}
    for k, (name, _, out, xs, body, written, shapes) in enumerate(cases):
        tail = name.startswith(("padded_", "tail_"))
        cost = java_cost(body, written, shapes)  # the kernel's constant as the emitter writes it (kernel_section)
        # a first axis of size 1: the pieces cover the second; a sum down columns: pieces of COLUMN_GRAIN columns
        split, columns = split_of(body, written, shapes)
        make = ("elementwise" if is_flat(body, written, shapes) else "columns" if columns
                else "shapedOn" if split else "shaped")  # fmt: skip
        head = ", ".join([f'"k{k}"', *(["256"] if columns else []), *([str(split)] if split else []),
                          *([cost] if cost is not None else []), "(out, in, lo, hi) -> {"])  # fmt: skip
        text = java_kernel(body, written, shapes, tail)
        methods.append(f"  static final Kernel K{k} = Kernel.{make}({head}\n{text}\n  }});")
        if name.startswith("padded_"):  # the statement's tensors seen as [N, C, 1, 1] where the form pads them
            xs = [x.reshape(*x.shape, 1, 1) if len(s) == 4 else x for x, s in zip(xs, shapes)]
            out = (*out, ("u0", 1), ("u1", 1)) if len(written) == 4 else out
        args = ", ".join(f'in.get("c{k}_{j}")' for j in range(len(xs)))
        shape = ", ".join(str(n) for _, n in out)
        calls.append(f"    Buf out{k} = Buf.zeros({shape});\n    java.util.Arrays.fill(out{k}.a, Float.NaN);\n"
                     f"    K{k}.run(out{k}{', ' if args else ''}{args});\n"
                     f'    put(result, "c{k}", out{k});')  # fmt: skip
        inputs.update({f"c{k}_{j}": x for j, x in enumerate(xs)})
    save_npz(tmp_path / "in.npz", inputs)
    source = KERNEL_CHECK.replace("CALLS", "\n".join(calls)).replace("METHODS", "\n\n".join(methods))
    (tmp_path / "KernelCheck.java").write_text(source)
    runtime = ROOT / "deepdsl" / "runtime"
    runtime_files = ("Buf.java", "Kernel.java", "Npz.java", "Npy.java", "ZipReader.java", "Parallel.java")
    javac(tmp_path, [tmp_path / "KernelCheck.java", *(runtime / f for f in runtime_files)], tmp_path / "build")
    r = java(tmp_path / "build", "KernelCheck", "in.npz", "out.npz", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    got = np.load(tmp_path / "out.npz")
    for k, (name, body, out, xs, *_) in enumerate(cases):
        with np.errstate(all="ignore"):
            want = evaluate(body, out, tuple(xs), np.float32)
        np.testing.assert_allclose(
            got[f"c{k}"].reshape(want.shape), want, rtol=2e-4, atol=1e-5, equal_nan=True, err_msg=f"case {name}"
        )


KERNEL_CHECK = """
import deepdsl.runtime.Buf;
import deepdsl.runtime.Kernel;
import deepdsl.runtime.Npz;
import java.nio.file.Path;
import java.util.LinkedHashMap;
import java.util.Map;

public final class KernelCheck {
  public static void main(String[] args) throws Exception {
    Map<String, Buf> in = new LinkedHashMap<>();
    Npz.read(Path.of(args[0])).forEach((name, a) -> in.put(name, new Buf(a.floats, 0, a.shape)));
    LinkedHashMap<String, Npz.Array> result = new LinkedHashMap<>();
CALLS
    Npz.write(Path.of(args[1]), result);
  }

  private static void put(LinkedHashMap<String, Npz.Array> result, String name, Buf b) {
    result.put(name, Npz.Array.ofFloats(b.a, b.shape));
  }

METHODS
}
"""


def test_kernel_text_reads_like_code() -> None:
    body = Apply("max", (Apply("+", (Read(0, (Affine.var("i0"), Affine.var("i1"))), Read(1, (Affine.var("i1"),)))),
                         Const(0.0)))  # fmt: skip
    text = java_kernel(body, (("i0", 8), ("i1", 500)), ((8, 500), (500,)))
    # the sizes are the buffers' dims, named: one kernel serves every shape it reads the same way for; a stride
    # that is one dim is written as that dim, and the body runs over the rows [lo, hi) the runtime gives it; in0,
    # read at the output's own element, at the output's offset
    assert "o[po + i0 * no1 + i1] = Math.max((a0[p0 + i0 * no1 + i1] + a1[p1 + i1]), 0.0f);" in text
    assert "int po = out.off, p0 = in[0].off, p1 = in[1].off, no1 = out.shape[1];" in text
    other = java_kernel(body, (("i0", 8), ("i1", 500)), ((9, 500), (500,)))  # in0 has more rows: its own sizes
    assert "(a0[p0 + i0 * n0_1 + i1] + a1[p1 + i1])" in other and "n0_1 = in[0].shape[1]" in other
    assert "for (int i0 = lo; i0 < hi; i0++) {" in text and "sto0" not in text
    padded = Read(0, (Affine((("i0", 1),), -1),))
    text = java_kernel(padded, (("i0", 4),), ((4,),))
    assert "(i0 - 1 >= 0 ? a0[p0 + i0 - 1] : 0f)" in text


def test_a_sum_down_columns_adds_rows_into_the_output() -> None:
    v = Affine.var
    column = Reduce("sum", (("r0", 6),), Read(0, (v("r0"), v("i0"))))
    text = java_kernel(column, (("i0", 3),), ((6, 3),))  # a matrix's plain column sums: the runtime's loop
    assert "Kernel.columnSums(o, po, a0, p0, in[0].shape[0], in[0].shape[1], lo, hi);" in text
    weighted = Reduce("sum", (("r0", 6),), Apply("*", (Read(0, (v("r0"), v("i0"))), Read(1, (v("r0"),)))))
    text = java_kernel(weighted, (("i0", 3),), ((6, 3), (6,)))
    assert "o[po + i0] += (a0[p0 + r0 * n0_1 + i0] * a1[p1 + r0]);" in text  # contiguous along i0, the inner loop
    assert (
        text.index("o[po + i0] = 0f;")
        < text.index("for (int r0")
        < text.index("for (int i0 = lo; i0 < hi; i0++) {\n        o")
    )
    scatter = Reduce(
        "sum",
        (("r0", 6),),
        Apply("select", (Apply("==", (Read(0, (v("r0"),)), Var("i0"))), Read(1, (v("r0"), v("i1"))), Const(0.0))),
    )
    text = java_kernel(scatter, (("i0", 5), ("i1", 4)), ((6,), (6, 4)))
    assert "if (a0[p0 + r0] == (float) i0) {" in text  # tested once a token, not once a column
    rows = Reduce("sum", (("r0", 8),), Read(0, (v("i0"), v("r0"))))  # a row sum is contiguous already: lanes
    assert "s0a" in java_kernel(rows, (("i0", 3),), ((3, 8),))


def test_a_kernel_computes_what_its_loop_does_not_change_before_it() -> None:
    """Adam's bias corrections `1 - beta ^ t` read only scalars: computed once, not once an element (the JIT may
    not hoist them: a store to the output could change a float[] it reads)."""
    correction = Apply("-", (Const(1.0), Apply("^", (Read(1, ()), Read(2, ())))))
    body = Apply("/", (Apply("^", (Read(0, (Affine.var("i0"),)), Const(2.0))), correction))
    text = java_kernel(body, (("i0", 8),), ((8,), (), ()))
    assert text.index("Math.pow(a1[p1], a2[p2])") < text.index("for (int e")
    assert "o[po + e] = ((a0[p0 + e] * a0[p0 + e]) / h0);" in text
    v = Affine.var  # a layer norm's rsqrt(var[t] + eps) is the same along its row of channels
    scale = Apply("rsqrt", (Apply("+", (Read(1, (v("i0"),)), Const(1e-5))),))
    text = java_kernel(Apply("*", (Read(0, (v("i0"), v("i1"))), scale)), (("i0", 4), ("i1", 8)), ((4, 8), (4,)))
    assert "float h0 = (1f / (float) Math.sqrt((a1[p1 + i0] + 1e-05f)));\n      for (int i1" in text


def test_a_subexpression_used_again_is_computed_once() -> None:
    """GELU's gradient uses its `t = 1 / (1 + p |x| / sqrt 2)` six times and its exponential twice: each is one local
    (the tree would print them every time: 260 operations an element before, under 60 now)."""
    types, attrs = EXAMPLES["gelu_grad"]
    out_type = REGISTRY["gelu_grad"].shape(tuple(types), dict(attrs))
    body = REGISTRY["gelu_grad"].index_form(tuple(types), out_type, dict(attrs))
    out, shapes = tuple(zip(out_vars(out_type), out_type.shape)), tuple(t.shape for t in types)
    body = Apply("+", (body, Const(1.0)))  # not g * gelu'(x), which runtime_calls.gelu_call takes
    text = java_kernel(body, out, shapes)
    assert text.count("Math.exp") == 1 and text.count("Math.abs") == 1
    assert "float c0 = 0.70710677f * Math.abs(a1[p1 + e]);" in text
    assert "float c1 = 1.0f / (1.0f + (0.3275911f * c0));" in text and text.count("(c1 * ") == 5
    assert int(java_cost(body, out, shapes)) < 60  # counts each local's expression once
    twice = Reduce("sum", (("j", 8),), Read(0, (Affine.var("i0"), Affine.var("j"))))
    text = java_kernel(Apply("*", (twice, twice)), (("i0", 4),), ((4, 8),))
    assert text.count("for (int j") == 1
    assert "float c0 = (s0a + s0b) + (s0c + s0d);" in text and "o[po + i0] = (c0 * c0);" in text


def test_gelu_and_its_gradient_run_in_the_runtimes_vectorised_loops() -> None:
    """A flat kernel that is exactly GELU or g * GELU' calls Kernel.gelu / Kernel.geluGrad (its numbers: the
    gelu_wide cases of test_kernels_equal_evaluate); any other body, GELU of a sum say, is written out as loops."""
    t = TensorType((4, 8), DType.F32)
    out, shapes = (("i0", 4), ("i1", 8)), ((4, 8), (4, 8))
    forward = java_kernel(REGISTRY["gelu"].index_form((t,), t, {}), out, shapes[:1])
    assert forward.endswith("    Kernel.gelu(o, po, a0, p0, lo, hi);") and "Math.exp" not in forward
    backward = java_kernel(REGISTRY["gelu_grad"].index_form((t, t), t, {}), out, shapes)
    assert backward.endswith("    Kernel.geluGrad(o, po, a0, p0, a1, p1, lo, hi);")
    own = (Affine.var("i0"), Affine.var("i1"))
    biased = gelu_index(Apply("+", (Read(1, (Affine.var("i1"),)), Read(0, own))), 0)  # a product's bias and GELU
    assert java_kernel(biased, out, ((4, 8), (8,))).endswith(
        "    Kernel.geluBias(o, po, a0, p0, a1, p1, out.shape[1], lo, hi);"
    )
    of_sum = gelu_index(Apply("+", (Read(0, own), Read(1, own))), 0)
    assert "Kernel.gelu" not in java_kernel(of_sum, out, shapes) and "Math.exp" in java_kernel(of_sum, out, shapes)
    relu_grad = java_kernel(REGISTRY["relu_grad"].index_form((t, t), t, {}), out, shapes)
    assert "Kernel.whenPositive(a1[p1 + e], a0[p0 + e])" in relu_grad and "?" not in relu_grad


def test_a_kernels_cost_is_its_work_per_output_element() -> None:
    """Kernel.run splits the output over threads by work = elements x cost: a flat kernel's cost is its operations
    (a number), a reduction's the product of its ranges read from the inputs' dims, one that does not reduce has
    none (cost one)."""
    rows = Reduce("sum", (("r0", 64),), Read(0, (Affine.var("r0"), Affine.var("i0"))))
    assert java_cost(rows, (("i0", 500),), ((64, 500),)) == "in -> in[0].dim(0)"
    planes = Reduce("sum", (("r0", 8), ("r1", 4)), Read(0, (Affine.var("r0"), Affine.var("i0"), Affine.var("r1"))))
    assert java_cost(planes, (("i0", 3),), ((8, 3, 4),)) == "in -> in[0].dim(0) * in[0].dim(2)"
    window = Reduce("sum", (("r0", 3),), Read(0, (Affine((("i0", 1), ("r0", 1)), 0),)))
    assert java_cost(window, (("i0", 6),), ((8,),)) == "in -> 3"  # a window's range is a number
    broadcast = Apply("+", (Read(0, (Affine.var("i0"), Affine.var("i1"))), Read(1, (Affine.var("i1"),))))
    assert java_cost(broadcast, (("i0", 2), ("i1", 5)), ((2, 5), (5,))) is None
    flat = Apply("max", (Read(0, (Affine.var("i0"),)), Const(0.0)))
    assert java_cost(flat, (("i0", 5),), ((5,),)) == "3"


@pytest.mark.slow  # 5 s (the default suite's four minutes)
def test_a_long_layout_table_is_continued_in_classes_the_step_extends(
    cli,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,  # noqa: ANN001
) -> None:
    """Field initialisers are one constructor, limited to 64 KB of bytecode: past LAYOUT_ROWS temporaries the table
    goes on in a class the step's class extends (ResNet-50 has 1,150; ResNet-152 three times as many). With a
    table of 8 rows, LeNet's program compiles and trains as it does with one table."""
    from deepdsl.backends.java import steps

    lenet = str(ROOT / "networks" / "lenet.ddsl")
    assert cli("compile", lenet, "--set", "N=4", "-o", str(tmp_path / "one")).exit_code == 0
    monkeypatch.setattr(steps, "LAYOUT_ROWS", 8)
    assert cli("compile", lenet, "--set", "N=4", "-o", str(tmp_path / "split")).exit_code == 0
    text = (tmp_path / "split" / "LeNet.java").read_text()
    assert "private class TrainingLayout2 extends TrainingLayout1 {" in text
    last = max(int(k) for k in re.findall(r"private class TrainingLayout(\d+)", text))
    assert last >= 2 and f"private final class Training extends TrainingLayout{last} {{" in text
    losses = {}
    for name in ("one", "split"):
        folder = tmp_path / name
        javac(folder, [folder / "LeNet.java", *sorted((folder / "deepdsl" / "runtime").glob("*.java"))], folder / "b")
        r = java(folder / "b", "LeNet", "--data", "synthetic", "--iters", "2", "--json")
        assert r.returncode == 0, r.stderr
        losses[name] = r.stdout.strip().splitlines()[-1]
    assert '"losses"' in losses["one"]
    assert losses["split"].split('"seconds_per_iter"')[0] == losses["one"].split('"seconds_per_iter"')[0]
