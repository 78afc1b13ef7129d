"""The element-wise kernels of a CUDA program (backends/cuda/kernels.py): `const __restrict__` pointers where no
other pointer of the kernel writes that memory, float4 loads and stores (four elements a thread each step) where the
size is a multiple of 4 and every pointer is 16-byte aligned, the scalar loop otherwise; both agree with NumPy on
the CPU (the emulator) and compile with NVRTC."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from deepdsl.backends.cuda import launch, nvrtc, translation
from deepdsl.ir import REGISTRY, GraphBuilder, Init, ParamDef, TensorType, Value
from deepdsl.memory import Plan, plan

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from cuda_emulator import emulate, run_launch  # noqa: E402

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ to run the kernels on the CPU")


def _plan(n: int) -> Plan:
    """Element-wise statements over n elements: a product with a scalar, a ReLU mask, an in-place chain, a select."""
    b = GraphBuilder("V")
    f = lambda name, *shape: b.add_param(ParamDef(Value(name, TensorType(shape)), Init("constant", (0.0,))))  # noqa: E731
    x, y, s = f("x", 2, n), f("y", 2, n), f("s")
    a = b.emit("mul", x, y)
    outs = [a, b.emit("relu_grad", y, x), b.emit("scale_by", x, s), b.emit("tanh", b.emit("add", a, x))]
    for k, v in enumerate(outs):
        b.output(f"o{k}", v)
    return plan(b.build())


def _values(p: Plan, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    env = {d.value.name: rng.standard_normal(d.value.type.shape).astype(np.float32) for d in p.graph.params}
    for s in p.graph.stmts:
        env[s.out.name] = REGISTRY[s.op].numpy(tuple(env[v.name] for v in s.inputs), s.a)
    return env


def _kernel_texts(source: str) -> dict[str, str]:
    return {m[1]: m[0] for m in re.finditer(r'extern "C" __global__ void (\w+)\([^)]*\) \{.*?\n\}', source, re.S)}


@pytest.mark.parametrize("n", [6, 10])  # 2 x 6 = 12 elements: float4s; 2 x 10 = 20 elements: float4s too
def test_element_wise_kernels_take_float4s_and_restrict_where_they_can(n: int) -> None:
    prog = translation.program(_plan(n))
    texts = _kernel_texts(prog.source)
    flat = [x for x in prog.launches if x.loop == "grid-stride"]
    assert flat
    for x in flat:
        text = texts[x.kernel]
        assert "float4" in text and "DD_GRID_STRIDE(q, " in text, text
        assert x.grid[0] == -(-x.covers // 4 // launch.BLOCK)
        # the output is __restrict__ unless an input shares its memory (an in-place statement); every input that is
        # not the output's memory is const __restrict__
        shared = any(a.storage == x.args[0].storage and a.offset == x.args[0].offset and a.name == x.args[0].name
                     for a in x.args[1:])  # fmt: skip
        assert ("float* __restrict__ out" in text) == (not shared), text
        assert len(re.findall(r"const float\* __restrict__ in\d", text)) == len(x.args) - 1 - shared


@pytest.mark.parametrize("n", [5, 7])  # 10 and 14 elements: not a multiple of 4
def test_sizes_not_a_multiple_of_4_keep_the_scalar_loop(n: int) -> None:
    prog = translation.program(_plan(n))
    for x in prog.launches:
        assert "float4" not in _kernel_texts(prog.source)[x.kernel]
        assert x.grid[0] == -(-x.covers // launch.BLOCK)


def test_a_buffer_not_16_byte_aligned_keeps_the_scalar_loop() -> None:
    """Every planned offset is a multiple of 256 (memory/plan.py ALIGN); moved by 4 bytes, no kernel reads float4s."""
    p = _plan(6)
    assert all(b.offset % launch.VECTOR_ALIGN == 0 for b in p.buffers)
    moved = dataclasses.replace(p, buffers=tuple(dataclasses.replace(b, offset=b.offset + 4) for b in p.buffers))
    # the program's own kernels (`body`): the library before them (library.cu) has float4 code of its own
    assert "float4" in translation.program(p).body and "float4" not in translation.program(moved).body
    assert all(a.offset % launch.VECTOR_ALIGN == 4 for x in translation.program(moved).launches for a in x.args
               if a.storage == "arena")  # fmt: skip


@needs_gxx
@pytest.mark.parametrize("n", [6, 5, 1])  # 12, 10 and 2 elements
def test_vectorised_and_scalar_kernels_agree_with_numpy(n: int, tmp_path: Path) -> None:
    p = _plan(n)
    prog = translation.program(p)
    lib = emulate(prog.source, prog.kernels, tmp_path)
    env = _values(p)
    for x in prog.launches:
        out = np.full_like(env[x.stmt], np.nan)
        arrays = [out] + [np.array(env[a.value], np.float32) for a in x.args[1:]]
        run_launch(lib, x, [a.ctypes.data for a in arrays], small=False)
        np.testing.assert_allclose(out, env[x.stmt], rtol=1e-6, atol=1e-7, err_msg=x.kernel)


def _have_compiler() -> bool:
    try:
        nvrtc.compiler()
    except nvrtc.NoCudaCompiler:
        return False
    return True


# CI installs NVRTC with the test extra, so there a missing compiler fails instead of skipping
@pytest.mark.skipif(not _have_compiler() and not os.environ.get("CI"), reason=f"pip install '{nvrtc.PINNED_NVRTC}'")
def test_vectorised_kernels_compile_with_nvrtc() -> None:
    for n in (6, 5):
        text = nvrtc.ptx(translation.program(_plan(n)).source, "sm_90", "v.cu")
        assert ".entry" in text
        assert ("ld.global.nc.v4.f32" in text) == (n == 6)  # const __restrict__: the read-only path, 4 floats a load
