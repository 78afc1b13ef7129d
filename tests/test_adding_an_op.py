"""docs/adding-an-op.md, done: every code block of the guide that starts with a `file:` line is put where that line
says (registry entries into their module, Java methods into the runtime's classes, CUDA functions into the library,
test cases into the tests' tables), and the guide's two example ops, `hard_swish` (an index form) and `cumsum` (a
library op), then go through `deepdsl check` and `run`, the registry's completeness checks, an independent oracle
and finite differences, and the Java and CUDA backends. `-m slow`: the Java programs train with the NumPy runner's
losses on the runtime with the guide's Java in it, and the CUDA kernels, run on the CPU, give the NumPy kernels'
results. `hard_swish` is in the registry, written as the guide writes it (a test holds the guide's lines to be in the
files they name); the fixture takes the real entries out and runs the guide's in their place, and `cumsum`, which is
not, exists only while this module runs: the fixture adds the guide's ops and restores the registry after."""

from __future__ import annotations

import importlib
import json
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from helpers import ROOT

import deepdsl.backends.cuda  # noqa: F401 — attaches the CUDA fields, before the guide's CUDA rule is added
import deepdsl.ops  # noqa: F401
from deepdsl.frontend.builtins import BUILTINS
from deepdsl.ir import REGISTRY, GraphBuilder, Init, ParamDef, TensorType, Value
from deepdsl.ir.analysis import out_vars
from deepdsl.ops.indexed import evaluate

sys.path.insert(0, str(ROOT / "tests" / "backends"))  # java_env, cuda_emulator

GUIDE = ROOT / "docs" / "adding-an-op.md"
BLOCK = re.compile(r"^```(\w+)\n(?:#|//) file: (\S+) \(([^)]*)\)\n(.*?)^```", re.M | re.S)


@dataclass(frozen=True)
class Block:
    example: str  # hard_swish or cumsum: the section of the guide it is in
    lang: str
    path: str
    where: str  # where in the file it goes, as the guide says
    text: str


def guide_blocks() -> list[Block]:
    text = GUIDE.read_text(encoding="utf-8")
    split = text.index("\n## A library op")
    return [
        Block("hard_swish" if m.start() < split else "cumsum", m[1], m[2], m[3], m[4]) for m in BLOCK.finditer(text)
    ]


BLOCKS = guide_blocks()
GUIDE_OPS = ("hard_swish", "hard_swish_grad", "cumsum")  # the ops (and built-ins) the guide's blocks define


def blocks(path: str, example: str | None = None) -> list[Block]:
    return [b for b in BLOCKS if b.path == path and example in (None, b.example)]


def entries(path: str, where: str, example: str) -> dict:
    """The guide's lines for a table of a test module (`"op": value,` lines), evaluated in that module."""
    module = importlib.import_module(path.removeprefix("tests/").removesuffix(".py").replace("/", "."))
    return {
        k: v
        for b in blocks(path, example)
        if b.where == f"in {where}"
        for k, v in eval("{" + b.text + "}", vars(module)).items()  # noqa: S307 — the repository's own guide
    }


@pytest.fixture(scope="module")
def guide_ops():  # noqa: ANN201
    """The guide's Python, run in the namespace of the module it names (as if written at its end), in the order a
    reader writes it: the ops, the built-ins, the CUDA rules. Removed again after the module's tests."""
    real_ops = {name: REGISTRY.pop(name) for name in GUIDE_OPS if name in REGISTRY}
    real_builtins = {name: BUILTINS.pop(name) for name in GUIDE_OPS if name in BUILTINS}
    before = set(REGISTRY), set(BUILTINS)
    order = ("deepdsl/ops/", "deepdsl/frontend/", "deepdsl/backends/")
    try:
        for prefix in order:
            for b in BLOCKS:
                if b.lang == "python" and b.path.startswith(prefix):
                    module = importlib.import_module(b.path.removesuffix(".py").replace("/", "."))
                    exec(compile(b.text, f"{GUIDE.name}: {b.path}", "exec"), dict(vars(module)))  # noqa: S102
        yield
    finally:
        for name in set(REGISTRY) - before[0]:
            del REGISTRY[name]
        for name in set(BUILTINS) - before[1]:
            del BUILTINS[name]
        REGISTRY.update(real_ops)
        BUILTINS.update(real_builtins)


def network(example: str, folder: Path) -> Path:
    """The guide's example network of `example`, written into `folder`."""
    (b,) = [b for b in BLOCKS if b.example == example and b.path.endswith(".ddsl")]
    path = folder / b.path
    path.write_text(b.text)
    return path


# ---- the guide itself ----


def test_the_guide_gives_both_examples_and_names_every_file_it_changes() -> None:
    text = GUIDE.read_text(encoding="utf-8")
    for example, needed in (
        ("hard_swish", {"deepdsl/ops/elementwise.py", "deepdsl/frontend/builtin_activations.py",
                        "tests/ops/test_grads.py"}),
        ("cumsum", {"deepdsl/ops/reduce.py", "deepdsl/backends/cuda/ops.py", "deepdsl/backends/cuda/library.cu",
                    "deepdsl/backends/cuda/entries.cu", "deepdsl/runtime/Device.java", "deepdsl/runtime/CpuDevice.java",
                    "deepdsl/runtime/CpuShapes.java", "deepdsl/runtime/CudaDevice.java"}),
    ):  # fmt: skip
        paths = {b.path for b in BLOCKS if b.example == example}
        assert needed <= paths, f"{example}: no block for {needed - paths}"
        section = text[text.index(f"`{example}`\n") :] if example == "cumsum" else text[: text.index("## A library")]
        table = set(re.findall(r"^\| `([^`]+)`", section, re.M))
        for path in paths - {p for p in paths if p.endswith(".ddsl")}:
            assert (ROOT / path).is_file(), f"the guide writes into {path}, which is not a file of the repository"
            assert path in table, f"{example}: {path} is changed but not in the section's table of files"


def test_hard_swish_is_in_the_repository_as_the_guide_writes_it() -> None:
    """The guide's `hard_swish` is the real one: each of its blocks (but the example network) is in the file it
    names, line for line; the fixture swaps the real entries for the guide's, so both are the same code."""
    swish = [b for b in BLOCKS if b.example == "hard_swish" and not b.path.endswith(".ddsl")]
    assert {b.path for b in swish} >= {"deepdsl/ops/elementwise.py", "deepdsl/frontend/builtin_activations.py"}
    for b in swish:
        assert b.text in (ROOT / b.path).read_text(encoding="utf-8"), f"the guide's block for {b.path} is not in it"
    assert "cumsum" not in REGISTRY and "cumsum" not in BUILTINS


# ---- the registry: the entries are complete, the Java calls match the runtime with the guide's Java in it ----


def runtime_with_the_guide(sources: dict[str, str]) -> dict[str, str]:
    """The runtime's sources with each of the guide's Java methods inserted before its class's closing brace."""
    out = dict(sources)
    for b in BLOCKS:
        if b.lang == "java" and b.path.startswith("deepdsl/runtime/"):
            name = Path(b.path).name
            head, brace, tail = out[name].rpartition("}")
            out[name] = head + b.text + brace + tail
    return out


@pytest.mark.parametrize(
    "example, op_names", [("hard_swish", ("hard_swish", "hard_swish_grad")), ("cumsum", ("cumsum",))]
)
def test_the_registry_checks_pass_on_the_examples(
    guide_ops,
    example: str,
    op_names: tuple,
    monkeypatch: pytest.MonkeyPatch,  # noqa: ANN001
) -> None:
    from ops import test_registry_complete as rc

    from deepdsl.backends.java import runtime_sources

    path = "tests/ops/test_registry_complete.py"
    monkeypatch.setattr(rc, "EXAMPLES", {**rc.EXAMPLES, **entries(path, "EXAMPLES", example)})
    monkeypatch.setattr(rc, "KEEPS_NOTHING", {**rc.KEEPS_NOTHING, **entries(path, "KEEPS_NOTHING", example)})
    mine = {name: REGISTRY[name] for name in op_names}
    assert {name: rc.op_problems(op) for name, op in mine.items()} == {name: [] for name in mine}
    sources = runtime_with_the_guide(runtime_sources())
    assert rc.java_mismatches(mine, sources) == []
    assert rc.device_mismatches(mine, sources["Device.java"]) == []
    if example == "cumsum":  # the checks can fail: without the guide's Java, or without its KEEPS_NOTHING line
        assert rc.java_mismatches(mine, runtime_sources()) == ["cumsum: no method CpuShapes.cumsum in the runtime"]
        monkeypatch.setattr(rc, "KEEPS_NOTHING", {k: v for k, v in rc.KEEPS_NOTHING.items() if k != "cumsum"})
        assert rc.op_problems(mine["cumsum"]) == ["no saves"]


# ---- the NumPy side: an independent oracle, the index form, finite differences ----

KINKS = np.array([-7.5, -3.0001, -3.0, -2.9999, -1.5, -0.0, 0.0, 0.25, 2.9999, 3.0, 3.0001, 6.0], dtype=np.float32)


def _hard_swish(x: float) -> float:
    return 0.0 if x <= -3 else x if x >= 3 else x * (x + 3) / 6


def _hard_swish_slope(x: float) -> float:  # torch 2.15's hardswish_backward: the outer pieces at -3 and at 3
    return 0.0 if x <= -3 else 1.0 if x >= 3 else x / 3 + 0.5


def test_hard_swish_against_a_formula_at_its_kinks_and_both_signs(guide_ops) -> None:  # noqa: ANN001
    x = KINKS.reshape(3, 4)
    g = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
    want = np.vectorize(_hard_swish)(x.astype(np.float64))
    want_grad = g * np.vectorize(_hard_swish_slope)(x.astype(np.float64))
    t = TensorType((3, 4))
    for name, xs, expect in (("hard_swish", (x,), want), ("hard_swish_grad", (g, x), want_grad)):
        op = REGISTRY[name]
        np.testing.assert_allclose(op.numpy(xs, {}), expect, rtol=1e-6, atol=1e-7, err_msg=name)
        form = op.index_form((t,) * len(xs), t, {})
        got = evaluate(form, tuple(zip(out_vars(t), t.shape)), tuple(v.astype(np.float64) for v in xs), np.float64)
        np.testing.assert_allclose(got, expect, rtol=1e-6, atol=1e-7, err_msg=f"{name}'s index form")


def test_cumsum_against_a_loop_both_ways(guide_ops) -> None:  # noqa: ANN001
    x = np.random.default_rng(3).standard_normal((2, 3, 5)).astype(np.float32)
    for reverse in (False, True):
        want = np.zeros_like(x, dtype=np.float64)
        for i in np.ndindex(*x.shape[:-1]):
            order = range(4, -1, -1) if reverse else range(5)
            s = 0.0
            for k in order:
                s += float(x[i][k])
                want[i][k] = s
        got = REGISTRY["cumsum"].numpy((x,), {"reverse": reverse})
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("example", ["hard_swish", "cumsum"])
def test_the_gradients_match_finite_differences(guide_ops, example: str) -> None:  # noqa: ANN001
    from helpers import check_op_gradient

    cases = entries("tests/ops/test_grads.py", "CASES", example)
    assert cases
    for op, (inputs, attrs) in cases.items():
        check_op_gradient(op, inputs, attrs)
        if "reverse" in attrs:
            check_op_gradient(op, inputs, {**attrs, "reverse": not attrs["reverse"]})


# ---- the language, the runner and the backends ----


@pytest.mark.parametrize("example", ["hard_swish", "cumsum"])
def test_the_example_network_checks_and_trains(guide_ops, cli, example: str, tmp_path: Path) -> None:  # noqa: ANN001
    path = network(example, tmp_path)
    r = cli("check", str(path), "--layers")
    assert r.exit_code == 0, r.output
    assert example in r.output
    r = cli("run", str(path), "--data", "synthetic", "--iters", "10", "--json")
    assert r.exit_code == 0, r.output
    losses = json.loads(r.stdout)["losses"]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0], losses


def test_the_java_and_cuda_backends_write_them(guide_ops, cli, tmp_path: Path) -> None:  # noqa: ANN001
    from deepdsl import api
    from deepdsl.backends.cuda import translation

    for example in ("hard_swish", "cumsum"):
        r = cli("compile", str(network(example, tmp_path)), "-o", str(tmp_path / example))
        assert r.exit_code == 0, r.output
    swish = (tmp_path / "hard_swish" / "HardSwish.java").read_text()
    assert "Math.min(" in swish and "Math.max(" in swish and "dev.hardSwish" not in swish  # a generated kernel
    cumsum = (tmp_path / "cumsum" / "Cumsum.java").read_text()
    calls = re.findall(r"dev\.cumsum\((\w+), (\w+), (true|false)\);", cumsum)
    assert {c[2] for c in calls} == {"false", "true"}  # forward, and the gradient from the other end
    swish_cu = translation.program(
        api.compile_source(network("hard_swish", tmp_path).read_text(), "hs.ddsl", stop_at="plan").plan
    )
    assert "fminf(" in swish_cu.body and "fmaxf(" in swish_cu.body
    cumsum_cu = translation.program(
        api.compile_source(network("cumsum", tmp_path).read_text(), "cs.ddsl", stop_at="plan").plan
    )
    assert len(re.findall(r"dd_cumsum\(out, in0, \d+, 16, [01]\);", cumsum_cu.body)) == 2


def op_plan():  # noqa: ANN201
    """The guide's lines for test_cuda_emit.py's `_op_plan`, as one plan (x and g as that function makes them)."""
    from deepdsl.memory import plan

    b = GraphBuilder("Ops")
    x, g = (b.add_param(ParamDef(Value(n, TensorType((4, 10))), Init("constant", (0.0,)))) for n in ("x", "g"))
    names = {"b": b, "x": x, "g": g}
    outs = [v for blk in blocks("tests/backends/test_cuda_emit.py") for v in eval("[" + blk.text + "]", names)]  # noqa: S307
    for k, v in enumerate(outs):
        b.output(f"o{k}", v)
    return plan(b.build())


def test_the_cuda_launches_fit_their_kernels(guide_ops) -> None:  # noqa: ANN001
    from test_cuda_emit import check_launches

    from deepdsl.backends.cuda import translation

    p = op_plan()
    assert {s.op for s in p.graph.stmts} == {"hard_swish", "hard_swish_grad", "cumsum"}
    check_launches(p, translation.program(p))


# ---- slow: the CUDA kernels run on the CPU, the Java programs trained ----


def _with_guide(text: str, path: str) -> str:
    return text + "\n" + "\n".join(b.text for b in blocks(path))


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ to run the kernels on the CPU")
def test_the_cuda_kernels_agree_with_numpy(guide_ops, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    from cuda_emulator import emulate, run_launch

    from deepdsl.backends.cuda import nvrtc, translation

    library = translation.library_source()
    monkeypatch.setattr(translation, "library_source", lambda: _with_guide(library, "deepdsl/backends/cuda/library.cu"))
    p = op_plan()
    prog = translation.program(p)
    lib = emulate(prog.source, prog.kernels, tmp_path)
    rng = np.random.default_rng(5)
    env = {name: np.ascontiguousarray(rng.uniform(-6, 6, (4, 10)).astype(np.float32)) for name in ("x", "g")}
    env["x"].reshape(-1)[:8] = (-3, 3, 0, -3.5, 2.5, -6, 6, -0.5)  # the kinks, and both signs
    for s in p.graph.stmts:
        env[s.out.name] = REGISTRY[s.op].numpy(tuple(env[v.name] for v in s.inputs), s.a)
    for x in prog.launches:
        out = np.zeros((4, 10), dtype=np.float32)
        pointers = [out.ctypes.data, *(env[a.value].ctypes.data for a in x.args[1:])]
        run_launch(lib, x, pointers, small=False)
        np.testing.assert_allclose(out, env[x.stmt], rtol=1e-5, atol=1e-6, err_msg=x.kernel)
    try:
        nvrtc.compiler()
    except nvrtc.NoCudaCompiler:
        return
    assert ".entry" in nvrtc.ptx(prog.source, "sm_90")


@pytest.mark.slow
@pytest.mark.java
@pytest.mark.skipif(shutil.which("javac") is None, reason="javac and java (JDK 17) are not on PATH")
def test_the_java_programs_train_as_the_numpy_runner(
    guide_ops,
    cli,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,  # noqa: ANN001
) -> None:
    from java_env import java_json, javac

    import deepdsl.backends.java as java_backend
    from deepdsl.backends.cuda import nvrtc, translation

    library, entries_cu = translation.library_source(), translation.entries_source()
    monkeypatch.setattr(translation, "library_source", lambda: _with_guide(library, "deepdsl/backends/cuda/library.cu"))
    monkeypatch.setattr(
        java_backend, "entries_source", lambda: _with_guide(entries_cu, "deepdsl/backends/cuda/entries.cu")
    )

    for example, cls in (("hard_swish", "HardSwish"), ("cumsum", "Cumsum")):
        path = network(example, tmp_path)
        src = tmp_path / f"{example}-src"
        r = cli("compile", str(path), "-o", str(src))
        assert r.exit_code == 0, r.output
        runtime = src / "deepdsl" / "runtime"
        patched = runtime_with_the_guide({f.name: f.read_text() for f in runtime.glob("*.java")})
        for name, text in patched.items():
            (runtime / name).write_text(text)
        cu = (src / f"{cls}.cu").read_text()
        if example == "cumsum":
            assert "dd_k_cumsum" in cu
        try:
            nvrtc.compiler()
        except nvrtc.NoCudaCompiler:
            pass
        else:  # the Java CUDA device's kernels, the guide's entry point among them, compile
            assert ".entry" in nvrtc.ptx(cu, "sm_90")
        sources = [src / f"{cls}.java", *runtime.glob("*.java")]  # CudaDevice.java too, with the guide's method
        if example == "cumsum":  # the guide's case of the Java CPU kernels' check, in its switch
            check = (ROOT / "tests" / "backends" / "java" / "OpCheck.java").read_text()
            (case,) = (b.text for b in blocks("tests/backends/java/OpCheck.java"))
            assert check.count("    switch (op) {\n") == 1
            (src / "OpCheck.java").write_text(check.replace("    switch (op) {\n", "    switch (op) {\n" + case))
            sources.append(src / "OpCheck.java")
        javac(tmp_path, sources, tmp_path / f"{example}-build")
        want = json.loads(cli("run", str(path), "--data", "synthetic", "--iters", "10", "--json").stdout)
        got = java_json(tmp_path / f"{example}-build", cls, "--data", "synthetic", "--iters", "10", "--device", "cpu")
        np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-4)
