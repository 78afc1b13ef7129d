"""The generated Java program's element-wise CUDA kernels, which serve every shape (kernel_section.py): their
pointers `const __restrict__` where the plan says no other pointer of the statement's kernel writes that memory (an
in-place statement's output and the input it overwrites are not, so such a statement gets a kernel of its own), and a
float4 loop taken at run time where the element count is a multiple of 4 and every pointer it reads or writes as
float4s is 16-byte aligned, the scalar loop otherwise. Checked without a GPU: the kernels' text, NVRTC's PTX (the
float4 loads through the read-only path), and the emulator (cuda_emulator.py) against NumPy at a size that is a
multiple of 4, one that is not, and pointers 4 bytes off alignment."""

from __future__ import annotations

import ctypes
import math
import os
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from deepdsl import api
from deepdsl.backends.cuda import nvrtc
from deepdsl.backends.java import JavaProgram, java_program

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from cuda_emulator import emulate  # noqa: E402
from helpers import (
    ROOT,  # noqa: E402
    SMALL,  # noqa: E402
)

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ to run the kernels on the CPU")


def _program(source: str, sets: dict[str, int] | None = None) -> JavaProgram:
    c = api.compile_source(source, "net.ddsl", sets=sets or {})
    assert c.program is not None, c.diagnostics
    b = api.build(c.program)
    return java_program(b.program, b.train_plan, b.infer_plan, b.eval_plan)


@pytest.fixture(scope="module")
def lenet() -> JavaProgram:
    return _program((ROOT / "networks" / "lenet.ddsl").read_text(), {"N": 8})


@pytest.fixture(scope="module")
def small() -> JavaProgram:
    """A batch norm, a residual add, concat, dropout and a tensor function (helpers.SMALL)."""
    return _program(SMALL)


def _kernels(cuda: str) -> dict[str, str]:
    """The generated kernels of a Name.cu by name, each with its text."""
    return {m[1]: m[0] for m in re.finditer(r'extern "C" __global__ void (\w+)\([^)]*\) \{.*?\n\}', cuda, re.S)}


def _constants(java: str) -> dict[str, str]:
    """The Kernel constants of the class: the CUDA kernel's name -> its factory (elementwise, vectorised, ...)."""
    return dict((name, factory) for factory, name in re.findall(r'Kernel\.(\w+)\(\s*"(\w+)"', java))


def test_lenets_relu_gradient_reads_its_other_input_restrict_and_has_a_float4_loop(lenet: JavaProgram) -> None:
    # the gradient of fc1's ReLU is written over the gradient it masks (in place): that pointer and the output are not
    # __restrict__, the ReLU's output it reads is
    calls = re.findall(r"dev\.run\((RELU_GRAD\w*), (\w+), (\w+), (\w+)\);", lenet.java)
    assert calls and all(out == g for _, out, g, _ in calls), calls
    text = _kernels(lenet.cuda)["reluGrad"]
    assert re.search(r"\(float\* out, const float\* in0, const float\* __restrict__ in1, int n\)", text), text
    assert "n % 4 == 0" in text and "& 15" in text, text  # the float4 loop's test, at run time
    assert "reinterpret_cast<const float4*>(in1)[q]" in text and "reinterpret_cast<float4*>(out)[q] = r;" in text
    assert "DD_GRID_STRIDE(e, n)" in text  # and the scalar loop for every other size or alignment
    assert _constants(lenet.java)["reluGrad"] == "vectorised"


def test_the_batch_norm_networks_element_wise_kernels_restrict_every_pointer_that_is_apart(small: JavaProgram) -> None:
    texts, factories = _kernels(small.cuda), _constants(small.java)
    vectorised = [name for name, f in factories.items() if f == "vectorised"]
    assert {"addRelu", "swish", "reluGrad"} <= set(vectorised), factories
    for name in vectorised:
        assert "float4" in texts[name] and "DD_GRID_STRIDE(e, n)" in texts[name], texts[name]
    # relu(h + x) writes a buffer of its own: every pointer __restrict__
    assert re.search(r"addRelu\(float\* __restrict__ out, const float\* __restrict__ in0, "
                     r"const float\* __restrict__ in1, int n\)", texts["addRelu"]), texts["addRelu"]  # fmt: skip
    # kernels without a float4 loop stay as they were: the element-wise ones that read an integer input, the shaped
    for name, f in factories.items():
        if f != "vectorised":
            assert "float4" not in texts[name], texts[name]
            if f != "elementwise":
                assert "__restrict__" not in texts[name].split(")")[0], texts[name]


def _have_compiler() -> bool:
    try:
        nvrtc.compiler()
    except nvrtc.NoCudaCompiler:
        return False
    return True


def _entries(ptx: str) -> dict[str, str]:
    """The PTX of each entry: from its `.entry` to the next one."""
    parts = re.split(r"(?=\.visible \.entry )", ptx)
    return {re.match(r"\.visible \.entry (\w+)", p)[1]: p for p in parts if p.startswith(".visible .entry")}


# CI installs NVRTC with the test extra, so there a missing compiler fails instead of skipping
@pytest.mark.skipif(not _have_compiler() and not os.environ.get("CI"), reason=f"pip install '{nvrtc.PINNED_NVRTC}'")
def test_the_float4_loops_compile_to_vector_loads_through_the_read_only_path(small: JavaProgram,
                                                                             lenet: JavaProgram) -> None:  # fmt: skip
    entries = _entries(nvrtc.ptx(lenet.cuda, "sm_90", "LeNet.cu"))
    relu = entries["reluGrad"]
    assert "ld.global.nc.v4.f32" in relu  # in1: const __restrict__, four floats a load, the read-only path
    assert re.search(r"ld\.global\.v4\.f32", relu)  # in0: the output's memory, a plain vector load
    assert "st.global.v4.f32" in relu
    assert re.search(r"ld\.global\.f32", relu)  # the scalar loop's plain loads are there too
    entries = _entries(nvrtc.ptx(small.cuda, "sm_90", "Small.cu"))
    assert entries["addRelu"].count("ld.global.nc.v4.f32") == 2 and "st.global.v4.f32" in entries["addRelu"]


@pytest.fixture(scope="module")
def lenet_on_the_cpu(lenet: JavaProgram, tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    """LeNet.cu's reluGrad compiled for the CPU (cuda_emulator.py)."""
    return emulate(lenet.cuda, ["reluGrad"], tmp_path_factory.mktemp("lenet_cu"))


@needs_gxx
@pytest.mark.parametrize(
    ("n", "shift"),
    [(64, 0), (10, 0), (64, 1), (3, 0)],  # float4s; n not a multiple of 4; every pointer 4 bytes off; fewer than 4
)
def test_the_generic_kernel_agrees_with_numpy_on_either_loop(lenet_on_the_cpu: ctypes.CDLL, n: int,
                                                            shift: int) -> None:  # fmt: skip
    """reluGrad(out, in0, in1, n) = in1 > 0 ? in0 : 0 on the CPU, out written over in0 as LeNet's call does, and out
    of place; the elements after the n'th (and before the first, where shifted) keep their sentinel."""
    lib = lenet_on_the_cpu
    rng = np.random.default_rng(n + shift)
    for in_place in (True, False):
        g = np.full(n + 8, 7.0, np.float32)
        g[shift : shift + n] = rng.standard_normal(n)
        y = np.zeros(n + 8, np.float32)
        y[shift : shift + n] = rng.standard_normal(n)
        want = np.where(y[shift : shift + n] > 0, g[shift : shift + n], 0).astype(np.float32)
        out = g if in_place else np.full(n + 8, 7.0, np.float32)
        ptrs = [a.ctypes.data + 4 * shift for a in (out, g, y)]
        assert all(p % 16 == 4 * shift for p in ptrs)  # NumPy's allocations are 16-byte aligned at least
        args = (ctypes.c_void_p * 4)(*ptrs, n)
        lib.run_reluGrad(2, 1, 1, 4, 1, args)  # 8 threads: the loops stride over the rest
        np.testing.assert_array_equal(out[shift : shift + n], want)
        assert (out[shift + n :] == 7.0).all() and (out[:shift] == 7.0).all()


@pytest.fixture(scope="module")
def gpt() -> JavaProgram:
    """A transformer: its residual adds are one computation in place (a matmul's epilogue) and not (the stream)."""
    return _program((ROOT / "networks" / "gpt_tiny.ddsl").read_text())


def _storage(java: str) -> list[tuple[str, dict[str, tuple[str, int, int]]]]:
    """Each inner class of the program (a step's plan) as its text and where each Buf it names lives, read from the
    class alone: (field, 0, 1) for a field of the program (a parameter, state, input, setting, constant), ("arena",
    first byte, end) for a temporary at an offset of the arena, a view or slice where its base is."""
    fields = {name: ("field:" + name, 0, 1) for name in re.findall(r"private final Buf (\w+) = \w+\(", java)}
    classes = re.split(r"\n  private final class \w+ \{\n", java)[1:]
    assert classes
    out = []
    for text in classes:
        where = dict(fields)
        for name, how, rest in re.findall(r"final Buf (\w+) = (at|view|slice)\(([^)]*)\);", text):
            parts = [p.strip() for p in rest.split(",")]
            if how == "at":
                offset = int(parts[0].rstrip("L"))
                numel = math.prod(int(f) for d in parts[1:] for f in d.split("*"))  # a pass's doubles: `585 * 2`
                where[name] = ("arena", offset, offset + 4 * numel)
            else:
                where[name] = where[parts[0]]
        out.append((text, where))
    return out


def _signature(cuda: str, kernel: str) -> list[bool]:
    """Which pointers of a kernel of Name.cu are __restrict__, the output first."""
    params = re.search(rf'extern "C" __global__ void {kernel}\(([^)]*)\)', cuda)[1].split(",")
    return [("__restrict__" in p) for p in params if "*" in p]


@pytest.mark.parametrize("name", ["lenet", "small", "gpt"])
def test_every_call_restricts_the_pointers_its_tensors_allow(request: pytest.FixtureRequest, name: str) -> None:
    """For every call of an element-wise kernel in a step, read off the class (its layout of the arena and its fields):
    the output is __restrict__ exactly where no input's memory overlaps it, an input exactly where it does not overlap
    the output. So no kernel's __restrict__ promise is broken by a call, and none is left out (the rule of
    cuda/translation.py `memory`, the PyCUDA runner's)."""
    p: JavaProgram = request.getfixturevalue(name)
    kernel_of = {const: k for const, k in re.findall(r'static final Kernel (\w+) =\s*Kernel\.vectorised\(\s*"(\w+)"',
                                                      p.java)}  # fmt: skip
    kernel_of |= dict(re.findall(r'static final Kernel (\w+) = \w+\.variant\("(\w+)"\);', p.java))
    checked = 0
    for text, where in _storage(p.java):
        for const, args in re.findall(r"dev\.run\((\w+), ([^;]*)\);", text):
            if const not in kernel_of:
                continue
            names = [re.sub(r"^view\((\w+),.*", r"\1", a.strip()) for a in re.split(r", (?![^(]*\))", args)]
            places = [where[n] for n in names]
            out, ins = places[0], places[1:]
            shares = [a[0] == out[0] and a[1] < out[2] and out[1] < a[2] for a in ins]
            assert _signature(p.cuda, kernel_of[const]) == [not any(shares), *(not s for s in shares)], (const, args)
            checked += 1
    assert checked
    if name == "gpt":  # one computation in place and not: two kernels, one Java body
        assert re.search(r"static final Kernel \w+ = ADD\.variant\(", p.java), kernel_of
