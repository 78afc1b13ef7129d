"""The CUDA backend: every kernel of a Plan as CUDA C (kernels.py), compiled to PTX with NVRTC or nvcc (nvrtc.py).

`cuda_source(plan)` is the translation unit of one program; `ptx_for(compilation, options, archs)` the PTX of
a compilation's training program (and its inference program, where the network has `predict`) in one
module per architecture.
"""

from __future__ import annotations

from typing import Any

from deepdsl.backends.cuda import ops  # noqa: F401 — attaches the CUDA kernels to the registry entries
from deepdsl.backends.cuda.kernels import Arg, CudaProgram, Launch, program, translation_unit
from deepdsl.backends.cuda.nvrtc import DEFAULT_ARCHS, CudaCompileError, NoCudaCompiler, compiler, ptx

__all__ = [
    "DEFAULT_ARCHS", "Arg", "CudaCompileError", "CudaProgram", "Launch", "NoCudaCompiler", "compiler",
    "combined_source", "cuda_source", "program", "programs", "ptx", "ptx_for", "translation_unit",
]  # fmt: skip


def cuda_source(plan: Any) -> str:
    """The CUDA C translation unit of a plan: the kernel library, then one kernel per statement."""
    return program(plan).source


def programs(compilation: Any, options: Any) -> dict[str, CudaProgram]:
    """{"train": ..., "infer": ...} of a compilation that reached the `plan` stage (infer only with `predict`);
    the inference program's kernels are named `infer__...` so that both fit in one module."""
    from deepdsl.api import infer_plan

    assert compilation.program is not None and compilation.plan is not None
    out = {"train": program(compilation.plan)}
    infer = infer_plan(compilation, options)
    if infer is not None:
        out["infer"] = program(infer, "infer__")
    return out


def combined_source(compilation: Any, options: Any) -> str:
    """One translation unit with the kernels of both programs (the library once)."""
    progs = programs(compilation, options)
    return translation_unit(compilation.program.graph.name, *(p.body for p in progs.values()))


def ptx_for(compilation: Any, options: Any, archs: tuple[str, ...] = DEFAULT_ARCHS) -> dict[str, str]:
    """{arch: PTX} of the compilation's kernels (one module per arch); CudaCompileError or NoCudaCompiler
    when it cannot be made."""
    source = combined_source(compilation, options)
    return {arch: ptx(source, arch, f"{compilation.program.graph.name}.cu") for arch in archs}
