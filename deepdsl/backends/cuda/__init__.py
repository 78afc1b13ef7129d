"""The CUDA backend: every kernel of a Plan as CUDA C (translation.py), compiled to PTX with NVRTC or nvcc (nvrtc.py).

`cuda_source(plan)` is the translation unit of one program; `ptx_for(train, infer, archs)` the PTX of a network's
training program (and its inference program, where the network has `predict`) in one module per architecture.
The plans are a Build's `train_plan` and `infer_plan` (api.build); the backend never calls the driver.
"""

from __future__ import annotations

from deepdsl.backends.cuda import ops  # noqa: F401 — attaches the CUDA kernels to the registry entries
from deepdsl.backends.cuda.launch import Arg, CudaProgram, Launch
from deepdsl.backends.cuda.nvrtc import (
    DEFAULT_ARCHS,
    CudaCompileError,
    NoCudaCompiler,
    compiler,
    ptx,
    supported_archs,
)
from deepdsl.backends.cuda.translation import program, translation_unit
from deepdsl.memory import Plan

__all__ = [
    "DEFAULT_ARCHS", "Arg", "CudaCompileError", "CudaProgram", "Launch", "NoCudaCompiler", "compiler",
    "combined_source", "cuda_source", "program", "programs", "ptx", "ptx_for", "supported_archs", "translation_unit",
]  # fmt: skip


def cuda_source(plan: Plan) -> str:
    """The CUDA C translation unit of a plan: the kernel library, then one kernel per statement."""
    return program(plan).source


def programs(train: Plan, infer: Plan | None, test: Plan | None = None) -> dict[str, CudaProgram]:
    """{"train": ..., "infer": ..., "eval": ...} of a network's plans (infer only where it has one, eval where
    `test`, the test program's plan, is given); the inference and test programs' kernels are named `infer__...` and
    `eval__...` so that all fit in one module."""
    out = {"train": program(train)}
    if infer is not None:
        out["infer"] = program(infer, "infer__")
    if test is not None:
        out["eval"] = program(test, "eval__")
    return out


def combined_source(train: Plan, infer: Plan | None) -> str:
    """One translation unit with the kernels of both programs (the library once)."""
    return translation_unit(train.graph.name, *(p.body for p in programs(train, infer).values()))


def ptx_for(train: Plan, infer: Plan | None, archs: tuple[str, ...] = DEFAULT_ARCHS) -> dict[str, str]:
    """{arch: PTX} of the kernels of both programs (one module per arch); CudaCompileError or NoCudaCompiler when
    it cannot be made."""
    source = combined_source(train, infer)
    return {arch: ptx(source, arch, f"{train.graph.name}.cu") for arch in archs}
