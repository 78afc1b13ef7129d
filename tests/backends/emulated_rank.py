"""`python emulated_rank.py FOLDER deepdsl-arguments...`: the `deepdsl` command line with the PyCUDA runner on the
emulated GPU (cuda_emulator.EmulatedDriver, its kernels built in FOLDER) instead of PyCUDA, for the data-parallel
tests' processes, which mpiexec starts (tests/backends/test_gpu_data_parallel.py) or which are started as torchrun
starts them, by torchrun itself or with its environment (tests/backends/test_torchrun.py: the stand-in NCCL then
meets and reduces over TCP). $EMULATED_GPUS: how many GPUs the emulated machine has (default 1). The stand-in NCCL
(fake_libnccl.c, found by the runner on LD_LIBRARY_PATH as the real one is) records its calls while the emulated
driver captures a graph, through the same recorder the stand-in cuBLAS and cuDNN use."""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from cuda_emulator import EmulatedDriver, _record  # noqa: E402

from deepdsl import running  # noqa: E402
from deepdsl.cli import main  # noqa: E402

FOLDER = Path(sys.argv.pop(1))
GPUS = int(os.environ.get("EMULATED_GPUS", "1"))  # how many GPUs the emulated machine has


def emulated(device: str, double: bool = False, kernels: str = "auto", tf32: bool = False, gpu: int = 0) -> tuple:
    if gpu >= GPUS:
        from deepdsl.errors import DslProgramError

        raise DslProgramError(f"--device cuda: GPU {gpu} (this rank's local rank) is not among this machine's {GPUS} "
                              "GPU (CUDA_VISIBLE_DEVICES)")  # fmt: skip
    return EmulatedDriver(FOLDER), f"cuda (emulated GPU {gpu})", None


running.open_device = emulated
for folder in os.environ.get("LD_LIBRARY_PATH", "").split(":"):
    if folder and (Path(folder) / "libnccl.so.2").exists():  # the library nccl.py will load: the same handle
        ctypes.CDLL(str(Path(folder) / "libnccl.so.2")).fake_set_capture(_record)
        break
main()
