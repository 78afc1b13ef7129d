"""The device of `deepdsl run`, `eval` and `predict`: the GPU driver opened (or the NumPy runner, and why not CUDA),
the device line that names it and the precision that ran there."""

from __future__ import annotations

from deepdsl.backends.cuda.drivers import PyCudaDriver, pycuda_available
from deepdsl.backends.cuda.runner import BF16_ARCH, Driver
from deepdsl.backends.cuda.vendor import MissingLibrary
from deepdsl.build import Build
from deepdsl.errors import DslProgramError
from deepdsl.trainer import Trainer

CPU = "cpu (NumPy reference runner)"


def trainer_arch(trainer: Trainer) -> str | None:
    """The architecture of the GPU `trainer` runs on; None on the NumPy runner."""
    return trainer.gpu.driver.arch if trainer.gpu is not None else None


def precision_ran(build: Build, arch: str | None) -> tuple[str, str | None]:
    """The precision a run of `build` computes in, on the GPU of architecture `arch` (None: the NumPy runner), and a
    note where that is not the one asked for: the NumPy runner has no TF32 math, nor has a GPU before Ampere (sm_80),
    so tf32 runs there as fp32, and says so (bf16 the NumPy runner runs, rounding where the plan stores bf16)."""
    if build.precision == "tf32" and arch is None:
        return "fp32", "tf32 asked: the NumPy runner has no TF32 math and runs it as fp32"
    if build.precision == "tf32" and int(arch.removeprefix("sm_")) < BF16_ARCH:
        return "fp32", (f"tf32 asked: this GPU ({arch}) has no TF32 tensor cores (compute capability 8.0 or newer), "
                        "so cuBLAS and cuDNN run it as fp32")  # fmt: skip
    return build.precision, None


def precision_line(build: Build, arch: str | None) -> str:
    """The device line's last part: `  precision fp32`, with the note where the precision asked did not run."""
    ran, note = precision_ran(build, arch)
    return f"  precision {ran}" + (f" ({note})" if note else "")


def precision_json(build: Build, arch: str | None) -> dict[str, str]:
    """The `--json` fields of the precision: `precision` (what ran) and, where it is not what was asked,
    `precision_note` (docs/formats.md)."""
    ran, note = precision_ran(build, arch)
    return {"precision": ran, **({"precision_note": note} if note else {})}


def open_device(
    device: str, double: bool = False, kernels: str = "auto", tf32: bool = False, gpu: int = 0
) -> tuple[Driver | None, str, str | None]:
    """The GPU driver for `device` (None: the NumPy runner), what runs the program (the device line) and, under
    `auto` on the CPU, why CUDA is not used (a line of its own).

    `auto` takes the GPU when PyCUDA is installed and finds one, and says why not when PyCUDA is there but cannot
    run the program (no GPU, a plan too large); without PyCUDA (the `gpu` extra) it says nothing, and neither do
    `cpu` and `auto` with --float64 (which runs on the CPU); `cuda` is a user error (with the reason) when it
    cannot have one. On the GPU, `kernels` picks the vendor libraries (backends/cuda/vendor.py): `vendor` without
    them is an error wherever the GPU is opened (under `cuda`, and under `auto` once PyCUDA is there); the NumPy
    runner has no vendor libraries and ignores it. `tf32`: the vendor GEMMs and convolutions in TF32 tensor-op math
    (--precision tf32). `gpu`: which GPU (a data-parallel rank's local rank)."""
    if device == "cpu" or (device == "auto" and double):  # the CPU asked for (--float64 runs there): no CUDA line
        return None, CPU, None
    if device == "auto" and not pycuda_available():  # no GPU extra: a CPU install, no news on every command
        return None, CPU, None
    if double:
        raise DslProgramError("--float64 runs on the NumPy runner only; use --device cpu")
    try:
        driver = PyCudaDriver(kernels, tf32=tf32, **({"index": gpu} if gpu else {}))  # (GPU 0: the default)
    except DslProgramError as err:
        if device == "cuda" or isinstance(err, MissingLibrary):
            raise
        return None, CPU, cuda_not_used(err.message)
    return driver, f"cuda ({driver.description}, PyCUDA runner; {driver.vendor.description})", None


def given_line(driver: Driver) -> str:
    """The device line of a driver the caller gave (tests)."""
    return f"cuda ({driver.description}; {driver.vendor.description})"


def with_graph(line: str, graph: str) -> str:
    """The device line of the GPU runner with its CUDA graph choice: `cuda (...; graph: on)`."""
    return f"{line[:-1]}; graph: {graph})"


def cuda_not_used(why: str) -> str:
    """The line of a run under `auto` that could have used the GPU and did not: why."""
    return f"CUDA not used: {why.removeprefix('--device cuda: ')}"
