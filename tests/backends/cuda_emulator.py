"""CUDA kernels run on the CPU: g++ compiles a program's translation unit with a block's threads as fibers
(their own stacks, switched with _setjmp/_longjmp) at __syncthreads and warp shuffles; a kernel that reaches
neither runs its threads one after another. `emulate(source, kernels, folder)` gives a shared library
with an entry point per kernel; `EmulatedDriver` is a GpuRunner driver on top of it, so that the Python runner's
launch program (arena offsets, tensors, copies, results) is checked without a GPU, and `fake_driver` builds a
libcuda.so.1 that runs the same library under JCuda, which does the same for the Java CUDA device.

The emulated driver captures as a GPU does: while it captures, a launch, a device copy, or a call of the stand-in
cuBLAS/cuDNN on its stream (the stand-ins ask its recorder, `fake_set_capture`) is recorded, not run; a replay runs
the recording in order. A host copy, an allocation, a free, a memory query or a synchronisation while capturing
(the driver's own, or the stand-in cuDNN's Find, which synchronises through `fake_set_synchronize`) is refused and
invalidates the capture, as the driver refuses a synchronous call during a thread-local capture."""

from __future__ import annotations

import ctypes
import re
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from built_once import in_folder, text_of

from deepdsl.backends.cuda.drivers import CpuClock
from deepdsl.backends.cuda.graphs import CaptureFailed
from deepdsl.backends.cuda.launch import Launch
from deepdsl.backends.cuda.vendor import OWN, Vendor

EMULATION = r"""
#undef _FORTIFY_SOURCE  // its longjmp check refuses a jump to another fiber's stack
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <csetjmp>
#include <vector>
struct dd_dim3 { int x, y, z; };
static dd_dim3 threadIdx, blockIdx, blockDim, gridDim;
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__
#define __shared__ static
static inline float __int_as_float(unsigned int i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline float __uint_as_float(unsigned int i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline unsigned int __float_as_uint(float f) { unsigned int i; std::memcpy(&i, &f, 4); return i; }
struct alignas(16) float4 { float x, y, z, w; };  // CUDA's vector type, as the vectorised element-wise kernels use it
// atomics and fences as one CPU thread runs a launch's blocks (one after another): each atomic is its
// read-modify-write, with CUDA's meaning (atomicInc wraps to 0 past `limit`); a fence orders no more than the program
static inline unsigned int atomicInc(unsigned int* p, unsigned int limit) {
    unsigned int old = *p; *p = old >= limit ? 0u : old + 1u; return old;
}
static inline unsigned int atomicAdd(unsigned int* p, unsigned int v) {
    unsigned int old = *p; *p = old + v; return old;
}
static inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
template <class T> static inline T __ldcg(const T* p) { return *p; }  // a load that skips L1: a load here

// the order a launch runs its blocks in (`dd_set_block_order`): 0 in order (x fastest), 1 reversed, any other value
// a shuffle seeded by it; a kernel may assume no order of its blocks, and a test runs it in several
static int dd_order = 0;
extern "C" void dd_set_block_order(int order) { dd_order = order; }
static std::vector<int> dd_blocks(int n) {
    std::vector<int> out(n);
    for (int k = 0; k < n; k++) out[k] = dd_order == 1 ? n - 1 - k : k;
    if (dd_order > 1) {
        unsigned long long s = (unsigned long long) dd_order * 6364136223846793005ULL + 1442695040888963407ULL;
        for (int k = n - 1; k > 0; k--) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            int j = (int) ((s >> 33) % (unsigned long long) (k + 1));
            int t = out[k]; out[k] = out[j]; out[j] = t;
        }
    }
    return out;
}
static void dd_block_at(int b, int gx, int gy) {
    blockIdx.x = b % gx; blockIdx.y = b / gx % gy; blockIdx.z = b / gx / gy;
}

// A block's threads are fibers, each on its own stack, switched with _setjmp/_longjmp: unlike swapcontext these
// save no signal mask, so a switch is no system call (a GEMM's tiles switch millions of times per step).
struct dd_fiber { jmp_buf at; bool done, started; std::vector<char> stack; };
static std::vector<dd_fiber> dd_fibers;
static std::vector<float> dd_lanes;
static jmp_buf dd_main;
static int dd_current, dd_threads;
static void (*dd_body)();
static void** a;

static void dd_enter(int t) {
    dd_current = t;
    threadIdx.x = t % blockDim.x; threadIdx.y = t / blockDim.x; threadIdx.z = 0;
}
static void dd_fiber_main();
// continue fiber t where it stopped, or start it at the top of its stack (x86-64: rsp 16-byte aligned at the call)
[[noreturn]] static void dd_resume(int t) {
    dd_enter(t);
    dd_fiber& f = dd_fibers[t];
    if (f.started) _longjmp(f.at, 1);
    f.started = true;
    char* top = f.stack.data() + f.stack.size();
    top = (char*) ((unsigned long) top & ~15UL);
    asm volatile("mov %0, %%rsp\n\tcall *%1\n\tud2" : : "r"(top), "r"(dd_fiber_main) : "memory");
    __builtin_unreachable();
}
// run the next live fiber after the current one in [lo, lo + n) (round robin); back to main when none is left
static void dd_switch(int lo, int n) {
    int me = dd_current;
    for (int k = 1; k <= n; k++) {
        int t = lo + (me - lo + k) % n;
        if (!dd_fibers[t].done) {
            if (t == me) return;
            if (!_setjmp(dd_fibers[me].at)) dd_resume(t);
            dd_enter(me);
            return;
        }
    }
    _longjmp(dd_main, 1);
}
static void __syncthreads() { dd_switch(0, dd_threads); }
static float __shfl_down_sync(unsigned, float v, int o) {
    int lane = dd_current % 32, base = dd_current - lane;
    dd_lanes[dd_current] = v;
    dd_switch(base, 32 < dd_threads - base ? 32 : dd_threads - base);
    return lane + o < 32 ? dd_lanes[base + lane + o] : v;
}
static void dd_fiber_main() {
    dd_body();
    dd_fibers[dd_current].done = true;
    dd_switch(0, dd_threads);
    __builtin_unreachable();  // the last fiber to finish jumps back to main
}
// a kernel that never synchronises runs its threads one after another, without fibers (most kernels: far faster)
static void dd_launch_plain(int gx, int gy, int gz, int bx, int by, void (*body)(), void** args) {
    gridDim.x = gx; gridDim.y = gy; gridDim.z = gz; blockDim.x = bx; blockDim.y = by; blockDim.z = 1;
    dd_threads = bx * by; a = args;
    for (int b : dd_blocks(gx * gy * gz)) {
        dd_block_at(b, gx, gy);
        for (int t = 0; t < dd_threads; t++) { dd_enter(t); body(); }
    }
}
static void dd_launch(int gx, int gy, int gz, int bx, int by, void (*body)(), void** args) {
    gridDim.x = gx; gridDim.y = gy; gridDim.z = gz; blockDim.x = bx; blockDim.y = by; blockDim.z = 1;
    dd_threads = bx * by; dd_body = body; a = args;
    dd_fibers.resize(dd_threads); dd_lanes.resize(dd_threads);
    for (dd_fiber& f : dd_fibers) f.stack.resize(1 << 16);
    for (int b : dd_blocks(gx * gy * gz)) {
        dd_block_at(b, gx, gy);
        for (dd_fiber& f : dd_fibers) f.done = f.started = false;
        if (!_setjmp(dd_main)) dd_resume(0);
    }
}
"""


_FUNCTION = re.compile(r"(?:__global__|__device__)[^;{(]*?\b(\w+)\s*\([^)]*\)\s*\{")


def synchronising(source: str) -> set[str]:
    """The functions of `source` that reach __syncthreads or a warp shuffle, directly or through a call."""
    bodies = {}
    for m in _FUNCTION.finditer(source):
        depth, k = 1, m.end()
        while depth:
            depth += {"{": 1, "}": -1}.get(source[k], 0)
            k += 1
        bodies[m.group(1)] = source[m.end() : k]
    syncs = {f for f, body in bodies.items() if "__syncthreads" in body or "__shfl" in body}
    while True:
        more = {f for f, body in bodies.items() if f not in syncs and any(re.search(rf"\b{g}\(", body) for g in syncs)}
        if not more:
            return syncs
        syncs |= more


def kernel_names(source: str) -> list[str]:
    """Every `extern "C"` kernel of a translation unit."""
    return re.findall(r'extern "C" __global__ void (\w+)\(', source)


# entries.cu's kernels whose grid covers tiles (the others' loops allow fewer blocks and threads)
TILED = ("dd_k_gemm", "dd_k_conv2d", "dd_k_conv2d_backward_data", "dd_k_conv2d_backward_filter")


def emulate(source: str, kernels: Sequence[str], folder: Path, strided: Sequence[str] = ()) -> ctypes.CDLL:
    """A shared library with, for each of `kernels` in `source`, run_<kernel>(grid x, y, z, block x, y, args) (args:
    the pointer values) and cu_<kernel>(grid x, y, z, block x, y, z, params) (params: pointers to them, as
    cuLaunchKernel takes them; fake_libcuda.c calls it), and cu_<kernel>_sizes, its parameters' byte sizes (for
    the stand-in to copy a captured launch's values). The cu_ entry of a kernel in `strided` (a grid- or
    block-stride loop) runs at most 3 blocks of 64 threads, which its loop allows."""
    signatures = dict(re.findall(r'extern "C" __global__ void (\w+)\(([^)]*)\)', source))
    runners, syncs = [], synchronising(source)
    for name in sorted(set(kernels)):
        launch = "dd_launch" if name in syncs else "dd_launch_plain"
        params = [" ".join(p.split()) for p in signatures[name].split(",")]
        types = [p.rsplit(" ", 1)[0].replace("__restrict__", "").strip() for p in params]
        # a pointer is the slot's value; a scalar (a size the Java device passes) lies in the slot's bytes
        casts = ", ".join(f"({t}) a[{k}]" if "*" in t else f"*({t}*) &a[{k}]" for k, t in enumerate(types))
        loads = "".join(
            f"  args[{k}] = *(void**) params[{k}];\n" if "*" in t else
            f"  args[{k}] = nullptr; std::memcpy(&args[{k}], params[{k}], sizeof({t}));\n"
            for k, t in enumerate(types)
        )  # fmt: skip
        # a multi-tensor kernel (one table argument) gives each segment its blocks: its grid is never cut
        multi = types == ["const long long*"]
        clamp = "if (gx > 3) gx = 3; if (bx > 64) bx = 64;\n  " if name in strided and not multi else ""
        runners.append(
            f"static void body_{name}() {{ {name}({casts}); }}\n"
            f'extern "C" void run_{name}(int gx, int gy, int gz, int bx, int by, void** args) {{\n'
            f"  {launch}(gx, gy, gz, bx, by, body_{name}, args);\n}}\n"
            f'extern "C" void cu_{name}(int gx, int gy, int gz, int bx, int by, int bz, void** params) {{\n'
            f"  void* args[{len(params)}];\n{loads}"
            f"  {clamp}{launch}(gx, gy, gz, bx, by, body_{name}, args);\n}}\n"
            # the parameters' byte sizes, for fake_libcuda.c to copy a captured launch's values
            f'extern "C" const int cu_{name}_sizes[] = {{{"".join(f"sizeof({t}), " for t in types)}0}};'
        )
    src, lib = folder / "emulated.cpp", folder / "emulated.so"
    text = EMULATION + source + "\n" + "\n".join(runners) + "\n"
    if not (lib.exists() and src.exists() and src.read_text() == text):  # built already: drivers may share a folder

        def make(into: Path) -> None:
            (into / src.name).write_text(text)
            subprocess.run(["g++", "-O1", "-U_FORTIFY_SOURCE", "-shared", "-fPIC", "-w", "-o", str(into / lib.name),
                            str(into / src.name)], check=True)  # fmt: skip

        # the same unit in several tests (a network's kernels, each test's driver): g++ once a run (built_once.py)
        in_folder(f"emulate\0{text}", folder, make)
    return ctypes.CDLL(str(lib))


def fake_driver(folder: Path) -> Path:
    """fake_libcuda.c built as `folder/libcuda.so.1`; returns the folder (for LD_LIBRARY_PATH)."""
    c = Path(__file__).with_name("fake_libcuda.c")

    def make(into: Path) -> None:
        subprocess.run(["gcc", "-O1", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(into / "libcuda.so.1"),
                        str(c), "-ldl"], check=True)  # fmt: skip

    return in_folder(f"fake_driver\0{text_of(c)}", folder, make)  # gcc once a run (built_once.py)


def fake_vendor(folder: Path, libraries: Sequence[str] = ("libcublas.so.12", "libcudnn.so.9")) -> Path:
    """The stand-ins fake_libcublas.c and fake_libcudnn.c built as `folder/libcublas.so.12` and
    `folder/libcudnn.so.9` (those of them in `libraries`); returns the folder (for vendor.open_vendor)."""
    sources = [Path(__file__).with_name(f"fake_{soname.split('.so')[0]}.c") for soname in libraries]

    def make(into: Path) -> None:
        for soname, c in zip(libraries, sources):
            subprocess.run(["gcc", "-O2", "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(into / soname),
                            str(c), "-lm"], check=True)  # fmt: skip

    # gcc once a run for these libraries (built_once.py): fake_libcudnn.c alone takes a second
    return in_folder(f"fake_vendor\0{list(libraries)}\0{text_of(*sources)}", folder, make)


def same_bits(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    """The same arrays under the same names, bit for bit."""
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes() for k in a)


def run_launch(lib: ctypes.CDLL, x: Launch, pointers: Sequence[int], small: bool) -> None:
    """Launch `x` with `pointers`. A block-stride launch (and with `small` a grid-stride one too) runs with at most
    3 blocks of 64 threads, which its loops allow, where the CPU would otherwise switch between millions of fibers."""
    grid, block = x.grid, x.block
    if x.loop == "block-stride" or small and x.loop == "grid-stride":
        grid, block = (min(grid[0], 3), 1, 1), (min(block[0], 64), 1, 1)
    elif x.loop == "split":  # a split sum's blocks stride over its outputs; every slice (blockIdx.y) runs
        grid, block = (min(grid[0], 3), grid[1], 1), (min(block[0], 64), 1, 1)
    argv = (ctypes.c_void_p * len(pointers))(*pointers)
    getattr(lib, f"run_{x.kernel}")(*grid, *block[:2], argv)


# the stand-in libraries' recorder (fake_set_capture): (stream, the call to make, its arguments, their size) -> 1
# when the stream captures (the call is recorded), else 0 (the library makes it now). One for the process: the
# libraries keep the pointer after any one driver is gone
_RECORDER = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
_HOST_CALL = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_CAPTURING: dict[int, list] = {}  # stream -> the recording of the driver capturing it
_INVALIDATED: set[int] = set()  # streams whose capture a synchronous call broke


@ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
def _synchronize(stream: int | None) -> int:
    """cuStreamSynchronize as the stand-in libraries call it (fake_set_synchronize: cuDNN's Find): refused, and the
    capture invalidated, while `stream` captures."""
    if (stream or 0) in _CAPTURING:
        _INVALIDATED.add(stream or 0)
        return 900  # CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
    return 0


@_RECORDER
def _record(stream: int | None, run: int, arg: int, n: int) -> int:
    nodes = _CAPTURING.get(stream or 0)
    if nodes is None:
        return 0
    nodes.append(("vendor", _HOST_CALL(run), ctypes.create_string_buffer(ctypes.string_at(arg, n), n)))
    return 1


class EmulatedDriver:
    """The GpuRunner's driver with host memory for device memory and the kernels run by `emulate`; `captures` and
    `replays` count its graphs' captures and launches, `recording` is the last capture's calls."""

    description = "the CPU emulating a GPU (g++, fibers)"
    arch = "sm_90"  # the architecture it stands in for
    graph_unsupported: str | None = None

    def __init__(self, folder: Path, capacity: int = 1 << 34, vendor: Vendor = OWN):
        self.folder = folder
        self.vendor = vendor  # the vendor libraries' stand-ins (fake_cublas), which take host pointers too
        folder.mkdir(parents=True, exist_ok=True)
        self.capacity = capacity
        self.blocks: list[np.ndarray] = []
        self.lib: ctypes.CDLL | None = None
        self.launches = 0
        self.stream_block = np.zeros(1, np.uint8)  # the stream's handle: an address no other driver has
        self.stream = self.stream_block.ctypes.data
        for library in (vendor.cublas, vendor.cudnn):
            if library is not None:
                library.lib.fake_set_capture(_record)
        if vendor.cudnn is not None and hasattr(vendor.cudnn.lib, "fake_set_synchronize"):
            vendor.cudnn.lib.fake_set_synchronize(_synchronize)
        vendor.set_stream(self.stream)
        self.recording: list | None = None  # while capturing: what would have run
        self.captures = self.replays = 0

    def _synchronous(self, call: str) -> None:
        if self.stream in _CAPTURING:
            _INVALIDATED.add(self.stream)  # as the driver: the capture fails at its end too, whoever caught this
            raise RuntimeError(f"{call} while capturing (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)")

    def free_bytes(self) -> int:
        self._synchronous("cuMemGetInfo")
        return self.capacity - sum(b.nbytes for b in self.blocks)

    def alloc(self, nbytes: int) -> int:
        self._synchronous("cuMemAlloc")
        block = np.full(nbytes, 0xFF, np.uint8)  # NaN-filled floats: a read before any write shows
        self.blocks.append(block)
        return block.ctypes.data

    def free(self, ptr: int) -> None:
        self._synchronous("cuMemFree")
        self.blocks = [b for b in self.blocks if b.ctypes.data != ptr]

    def synchronize(self) -> None:
        """cuStreamSynchronize of the driver's stream."""
        self._synchronous("cuStreamSynchronize")

    def upload(self, ptr: int, array: np.ndarray) -> None:
        self._synchronous("cuMemcpyHtoD")
        ctypes.memmove(ptr, array.ctypes.data, array.nbytes)

    def download(self, ptr: int, array: np.ndarray) -> None:
        self._synchronous("cuMemcpyDtoH")
        ctypes.memmove(array.ctypes.data, ptr, array.nbytes)

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        if _CAPTURING.get(self.stream) is not None:
            _CAPTURING[self.stream].append(("copy", dst, src, nbytes))
            return
        ctypes.memmove(dst, src, nbytes)

    def load(self, source: str, kernels: Sequence[str]) -> None:
        self.lib = emulate(source, kernels, self.folder)

    def launch(self, launch: Launch, pointers: Sequence[int]) -> None:
        assert self.lib is not None
        if _CAPTURING.get(self.stream) is not None:
            _CAPTURING[self.stream].append(("launch", launch, tuple(pointers)))
            return
        run_launch(self.lib, launch, pointers, small=True)
        self.launches += 1

    def timed(self) -> CpuClock:
        return CpuClock()

    def capture(self, issue: Callable[[], None]) -> list:
        self.recording = _CAPTURING[self.stream] = []
        _INVALIDATED.discard(self.stream)
        try:
            issue()
        except Exception as err:
            raise CaptureFailed(f"the step did not capture: {err}") from err
        finally:
            del _CAPTURING[self.stream]
        if self.stream in _INVALIDATED:  # a refused synchronous call whose error the step dropped
            raise CaptureFailed("the step did not capture: CUDA_ERROR_STREAM_CAPTURE_INVALIDATED")
        self.captures += 1
        return self.recording

    def replay(self, graph: list) -> None:
        for node in graph:
            if node[0] == "launch":
                self.launch(node[1], node[2])
            elif node[0] == "copy":
                self.copy(*node[1:])
            else:
                node[1](ctypes.addressof(node[2]))
        self.replays += 1

    def close(self) -> None:
        self.vendor.close()
        self.blocks.clear()
