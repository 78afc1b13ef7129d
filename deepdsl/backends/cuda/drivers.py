"""The drivers a `GpuRunner` runs on (runner.py `Driver`): `PyCudaDriver`, the real one (PyCUDA, the `gpu` extra,
imported only here: GPU 0's primary context, the module's PTX from NVRTC or nvcc for its architecture, CUDA events for
timing, `cuMemGetInfo` for the memory the runner really took, a side stream for the all-reduces); and what a driver
without them uses: `CpuClock` (wall-clock time for kernels run on the host) and `OneStream` (all-reduces in order
on the driver's one stream).
"""

from __future__ import annotations

import ctypes
import importlib.util
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from deepdsl.backends.cuda.graphs import CaptureFailed, StreamGraphs
from deepdsl.backends.cuda.launch import Launch
from deepdsl.backends.cuda.vendor import open_vendor
from deepdsl.errors import DslProgramError

GPU_EXTRA = "pip install 'deepdsl[gpu]'"


class _Events:
    def __init__(self, cuda: Any, stream: Any):
        self.cuda, self.stream = cuda, stream
        self.seconds = 0.0

    def __enter__(self) -> _Events:
        self.start, self.end = self.cuda.Event(), self.cuda.Event()
        self.start.record(self.stream)
        return self

    def __exit__(self, *exc: object) -> None:
        self.end.record(self.stream)
        self.end.synchronize()
        self.seconds = self.start.time_till(self.end) / 1e3


class _SideStream:
    """The all-reduces' stream: a bucket's reduction waits for an event recorded on the compute stream (`fork`), marks
    its end with another (`done`), and the compute stream waits for that one at the bucket's wait (`join`). Events
    and waits are captured into a graph with the rest (the side stream joins the capture through them)."""

    def __init__(self, cuda: Any, compute: Any):
        self.cuda, self.compute = cuda, compute
        self.stream = cuda.Stream()
        self.handle = int(self.stream.handle)
        self.events: dict[int, tuple[Any, Any]] = {}

    def _pair(self, bucket: int) -> tuple[Any, Any]:
        if bucket not in self.events:
            flags = self.cuda.event_flags.DISABLE_TIMING
            self.events[bucket] = (self.cuda.Event(flags), self.cuda.Event(flags))
        return self.events[bucket]

    def fork(self, bucket: int) -> None:
        ready = self._pair(bucket)[0]
        ready.record(self.compute)
        self.stream.wait_for_event(ready)

    def done(self, bucket: int) -> None:
        self._pair(bucket)[1].record(self.stream)

    def join(self, bucket: int) -> None:
        self.compute.wait_for_event(self._pair(bucket)[1])


class OneStream:
    """The all-reduces on the driver's one stream, in order with its kernels (a driver without a collective stream:
    the emulator)."""

    def __init__(self, handle: int):
        self.handle = handle

    def fork(self, bucket: int) -> None:
        pass

    def done(self, bucket: int) -> None:
        pass

    def join(self, bucket: int) -> None:
        pass


def reducer_streams(driver: Any) -> Any:
    """Where a driver's all-reduces go: its collective stream where it has one (PyCudaDriver), else its stream."""
    if hasattr(driver, "collective_streams"):
        return driver.collective_streams()
    return OneStream(int(driver.stream))


class PyCudaDriver:
    """GPU 0 through PyCUDA, in its primary context (shared with PyTorch or CuPy in the same process), with the
    vendor libraries `kernels` asks for (vendor.open_vendor: "auto", "vendor" or "own").

    Kernels, device copies and the libraries' calls go to one stream of the driver's own, a blocking one (a capture
    cannot record the legacy default stream): the host copies, on the default stream, wait for its work and it for
    theirs, so program order holds. Graphs are captured from it through libcuda (graphs.py)."""

    def __init__(self, kernels: str = "own", tf32: bool = False, index: int = 0) -> None:
        cuda = _import_pycuda()
        try:
            cuda.init()
            count = cuda.Device.count()
            if count == 0:
                raise DslProgramError("--device cuda: PyCUDA found no CUDA GPU on this machine; use --device cpu")
        except cuda.Error as err:
            raise DslProgramError(f"--device cuda: the CUDA driver did not start ({err}); use --device cpu") from None
        if index >= count:  # a data-parallel rank takes its local rank's GPU
            raise DslProgramError(f"--device cuda: GPU {index} (this rank's local rank) is not among this machine's "
                                  f"{count} GPU{'s' if count > 1 else ''} (CUDA_VISIBLE_DEVICES)")  # fmt: skip
        self.cuda = cuda
        self.index = index
        self.device = cuda.Device(index)
        try:
            self.context = self.device.retain_primary_context()
            self.context.push()
        except cuda.Error as err:
            raise DslProgramError(f"--device cuda: no CUDA context on {self.device.name()} ({err})") from None
        major, minor = self.device.compute_capability()
        self.arch = f"sm_{major}{minor}"
        self.description = f"{self.device.name()} ({self.arch}, {self.device.total_memory() >> 20:,} MiB)"
        self.allocations: list[Any] = []
        self.sides: list[_SideStream] = []  # the collective streams given out (freed at close, in this context)
        self.functions: dict[str, Any] = {}
        self.prepared: set[str] = set()
        self.module: Any = None
        self.stream = cuda.Stream()
        try:
            # on this context, on the launches' stream; tf32: the libraries' GEMMs and convolutions in TF32 math
            self.vendor = open_vendor(kernels, stream=self.stream.handle, tf32=tf32)
        except DslProgramError:
            self.context.pop()
            raise
        self.graphs: StreamGraphs | None = None
        self.graph_unsupported: str | None = None
        try:  # the library PyCUDA loaded: libcuda.so.1, on the context PyCUDA made current
            self.graphs = StreamGraphs(ctypes.CDLL("libcuda.so.1"), self.stream.handle)
        except (OSError, AttributeError) as err:  # no stream capture in this driver (before CUDA 11.4)
            self.graph_unsupported = f"the CUDA driver cannot capture ({err})"

    def free_bytes(self) -> int:
        return int(self.cuda.mem_get_info()[0])

    def alloc(self, nbytes: int) -> int:
        a = self.cuda.mem_alloc(nbytes)
        self.allocations.append(a)
        return int(a)

    def free(self, ptr: int) -> None:
        for k, a in enumerate(self.allocations):
            if int(a) == ptr:
                a.free()
                del self.allocations[k]
                return

    def upload(self, ptr: int, array: np.ndarray) -> None:
        self.cuda.memcpy_htod(ptr, array)

    def download(self, ptr: int, array: np.ndarray) -> None:
        self.cuda.memcpy_dtoh(array, ptr)

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        self.cuda.memcpy_dtod_async(dst, src, nbytes, self.stream)

    def load(self, source: str, kernels: Sequence[str]) -> None:
        """Compile for the GPU's architecture or, where the compiler does not know it, for the newest older one
        it does (the driver compiles PTX forward)."""
        from deepdsl.backends.cuda.nvrtc import CudaCompileError, ptx

        failures = []
        number = int(self.arch[3:])
        for arch in dict.fromkeys([self.arch, *(f"sm_{a}" for a in (90, 80) if a < number)]):
            try:
                # not strict: a newer NVRTC's warnings about our kernels are for the tests to catch, not the user
                text = ptx(source, arch, "program.cu", strict=False)
                self.module = self.cuda.module_from_buffer(text.encode() + b"\0")  # keeps the functions alive
                break
            except (CudaCompileError, self.cuda.Error) as err:
                failures.append(f"{arch}: {str(err).splitlines()[0] if str(err) else err}")
        else:
            raise DslProgramError(
                f"--device cuda: the kernels do not load on {self.description} ({'; '.join(failures)})"
            )
        for name in dict.fromkeys(kernels):
            self.functions[name] = self.module.get_function(name)

    def launch(self, launch: Launch, pointers: Sequence[int]) -> None:
        f = self.functions[launch.kernel]
        if launch.kernel not in self.prepared:  # the argument layout, once per kernel: every argument a pointer
            f.prepare("P" * len(pointers))
            self.prepared.add(launch.kernel)
        f.prepared_async_call(launch.grid, launch.block, self.stream, *pointers, shared_size=launch.smem)

    def timed(self) -> _Events:
        return _Events(self.cuda, self.stream)

    def collective_streams(self) -> _SideStream:
        """A stream of its own for the all-reduces of a data-parallel step (nccl.py), joined to the driver's by events:
        they overlap the kernels issued after them until a wait."""
        self.sides.append(_SideStream(self.cuda, self.stream))
        return self.sides[-1]

    def capture(self, issue: Callable[[], None]) -> Any:
        if self.graphs is None:
            raise CaptureFailed(self.graph_unsupported)
        return self.graphs.capture(issue)

    def replay(self, graph: Any) -> None:
        assert self.graphs is not None
        self.graphs.replay(graph)

    def close(self) -> None:
        """Free everything and leave the primary context (as pycuda.autoprimaryctx does); a second close does
        nothing."""
        if self.context is None:
            return
        self.stream.synchronize()
        for side in self.sides:
            side.stream.synchronize()
            side.events.clear()
        self.sides.clear()
        if self.graphs is not None:
            self.graphs.close()
        self.vendor.close()
        for a in self.allocations:
            a.free()
        self.allocations.clear()
        self.functions.clear()
        self.module = None
        self.stream = None
        self.context.pop()
        self.context = None


class CpuClock:
    """A wall-clock stand-in for CUDA events (drivers that run the kernels on the host)."""

    seconds = 0.0

    def __enter__(self) -> CpuClock:
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.t0


def pycuda_available() -> bool:
    return importlib.util.find_spec("pycuda") is not None


def _import_pycuda() -> Any:
    if not pycuda_available():
        raise DslProgramError(f"--device cuda needs PyCUDA, which is not installed ({GPU_EXTRA}); use --device cpu")
    try:
        import pycuda.driver as cuda
    except ImportError as err:  # installed, but libcuda.so.1 (the NVIDIA driver) is missing
        raise DslProgramError(f"--device cuda: PyCUDA cannot load the CUDA driver ({err}); use --device cpu") from None
    return cuda


__all__ = ["CpuClock", "OneStream", "PyCudaDriver", "pycuda_available", "reducer_streams"]
