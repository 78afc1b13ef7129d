"""The GPU runner: a Plan's CUDA program (translation.py) executed on a GPU, for `deepdsl run --device cuda`.

The runner holds one arena of the planned size, one device tensor per input, parameter, model state and
optimizer state, and the module of the training, inference and test kernels. A step uploads the batch (and the step
counter), launches the plan's kernels in program order with the pointers the plan gives them (arena offsets,
tensors), copies the updates that were not written in place into their tensors, and downloads the outputs.
Parameters stay on the GPU between steps; `arrays()` brings them back, `set_arrays()` sends them there.

cuDNN's convolution algorithms are chosen when the runner starts, before any step and so before any graph capture
(the search synchronises, which a capture refuses): each found by timing on the step's own buffers with a
temporary scratch (vendor.py, cudnn.py), or under `deterministic` cuDNN's heuristic choice; the one shared scratch
beside the arena is then sized by the chosen algorithms (`vendor_scratch_bytes`, `convolutions`).

From the second training step on (the first is the warm-up: modules loaded, the libraries' lazy set-up done), the
train step is a CUDA graph: its launches, copies and vendor library calls are captured once from the driver's stream
and replayed with one graph launch a step. The batch and the step counter are uploaded before, outside the graph,
into the tensors the graph's kernels read; the outputs are downloaded after. Inference and test steps, and a step the
driver cannot capture, run call for call; `graph` says which ("on", or "off (why)"), for the device line.

What the runner needs of a GPU is a `Driver`. `PyCudaDriver` is the real one: PyCUDA (the `gpu` extra,
imported only here), PTX from NVRTC or nvcc for the device's architecture, CUDA events for timing and
`cuMemGetInfo` for the memory the runner really took. The tests drive the same runner with kernels compiled
for the CPU, so the launch program itself is checked on machines without a GPU.
"""

from __future__ import annotations

import ctypes
import importlib.util
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from deepdsl.backends.cuda.graphs import CaptureFailed, StreamGraphs
from deepdsl.backends.cuda.launch import Arg, CudaProgram, Launch, multi_table
from deepdsl.backends.cuda.parallel import ParallelStep, Reducer, accumulate_launch, accumulate_source
from deepdsl.backends.cuda.translation import program, translation_unit
from deepdsl.backends.cuda.vendor import Bound, Vendor, open_vendor
from deepdsl.backends.numpy_runner import param_value
from deepdsl.errors import DslProgramError
from deepdsl.ir.types import DType
from deepdsl.memory.plan import Plan
from deepdsl.memory.report import VENDOR_WORKSPACE_LIMIT as REPORTED_LIMIT  # memcheck's bound of the scratch
from deepdsl.ops.collective import is_data_parallel
from deepdsl.ops.precision import from_bf16_bits

GPU_EXTRA = "pip install 'deepdsl[gpu]'"


class Driver(Protocol):
    """What the runner needs of a GPU: memory, a module of kernels, launches on one stream of its own (the vendor
    libraries' calls on it too), graphs captured from that stream, a clock."""

    description: str  # e.g. "NVIDIA H200 (sm_90, 143,771 MiB)"
    arch: str  # the GPU's architecture, e.g. "sm_90"
    vendor: Vendor  # the vendor libraries on this GPU (vendor.py); OWN: our kernels only
    graph_unsupported: str | None  # why this driver cannot capture a step as a graph; None: it can

    def free_bytes(self) -> int: ...
    def alloc(self, nbytes: int) -> int: ...  # a device address
    def free(self, ptr: int) -> None: ...  # an address alloc gave (cuDNN's Find scratch, freed at the start)
    def upload(self, ptr: int, array: np.ndarray) -> None: ...
    def download(self, ptr: int, array: np.ndarray) -> None: ...
    def copy(self, dst: int, src: int, nbytes: int) -> None: ...
    def load(self, source: str, kernels: Sequence[str]) -> None: ...
    def launch(self, launch: Launch, pointers: Sequence[int]) -> None: ...
    def timed(self) -> Any: ...  # a context manager whose `.seconds` is the device time of what ran inside
    # what `issue` launches, copies and calls, captured as a graph (none of it runs); CaptureFailed where it cannot be
    def capture(self, issue: Callable[[], None]) -> Any: ...
    def replay(self, graph: Any) -> None: ...  # one launch of a captured graph
    def close(self) -> None: ...


# the first architecture with bf16 tensor cores (Ampere): cuBLAS's GemmEx and cuDNN take bf16 operands from here on
BF16_ARCH = 80


def check_bf16_arch(driver: Driver, plan: Plan) -> None:
    """A DslProgramError where a bf16 plan (--precision bf16) would hand bf16 operands to cuBLAS or cuDNN on a GPU
    without bf16 tensor cores (they refuse them there); our own kernels convert bf16 in software on any GPU."""
    if int(driver.arch.removeprefix("sm_")) >= BF16_ARCH or not (driver.vendor.cublas or driver.vendor.cudnn):
        return
    if any(s.out.type.dtype is DType.BF16 for s in plan.graph.stmts):
        raise DslProgramError(
            f"--precision bf16: {driver.description} has no bf16 tensor cores (compute capability 8.0 or newer, "
            f"Ampere and later), so cuBLAS and cuDNN refuse bf16 operands there; use --precision fp32, or "
            "--kernels own (our kernels, bf16 converted in software: slower)"
        )


@dataclass(frozen=True)
class _Step:
    program: CudaProgram
    plan: Plan
    inputs: dict[str, np.dtype]  # input value -> its dtype on the GPU


# the most scratch one cuDNN convolution may take where the plan sets no workspace limit (as the Java CUDA device's
# default WORKSPACE_LIMIT): cuDNN's fast algorithms want more than the CPU's im2col the plan gives a convolution
VENDOR_WORKSPACE_LIMIT = REPORTED_LIMIT


class GpuRunner:
    """The training (and inference) program of a network on one GPU: one arena, persistent tensors, kernels."""

    def __init__(
        self, driver: Driver, train: Plan, infer: Plan | None, arrays: dict[str, np.ndarray], test: Plan | None = None,
        graphs: bool = True, deterministic: bool = False, reducer: Reducer | None = None, micro_batches: int = 1,
    ):  # fmt: skip
        self.driver = driver
        check_bf16_arch(driver, train)
        # cuDNN's convolution algorithms: its heuristic's deterministic choice (--deterministic), else found by
        # timing each on the step's buffers (cudnnFind...Ex) here, at the start, before any graph is captured
        self.deterministic = deterministic
        # "on": the train step is a CUDA graph from its second run on; "off (why)": every step runs call for call
        why_not = "--no-graph" if not graphs else driver.graph_unsupported
        if why_not is None and micro_batches > 1:  # (the uploads of the micro-batches' shards come between)
            why_not = f"--micro-batches {micro_batches}"
        self.graph = "on" if why_not is None else f"off ({why_not})"
        self.train_runs = 0
        self.captured: Any = None  # the train step's graph, once captured
        self.steps = {"train": _step(program(train), train)}
        if infer is not None:
            self.steps["infer"] = _step(program(infer, "infer__"), infer)
        if test is not None:
            self.steps["eval"] = _step(program(test, "eval__"), test)
        self.arena_bytes = max(s.plan.arena_bytes for s in self.steps.values())
        shapes = {p.value.name: (p.value.type.shape, np.float32) for p in train.graph.params}
        for name, s in self.steps.items():
            for d in s.plan.graph.inputs:
                shapes[f"{name}:{d.value.name}"] = (d.value.type.shape, s.inputs[d.value.name])
        self.tensor_bytes = sum(_nbytes(shape, t) for shape, t in shapes.values())
        # the tables of the multi-tensor launches (the optimiser's updates): the segments' sizes and pointers, filled
        # once here, in one allocation
        tables = [x for s in self.steps.values() for x in s.program.launches if x.table]
        self.table_bytes = sum(8 * (1 + len(x.table) * x.width) for x in tables)
        self.free_before = driver.free_bytes()
        need = self.arena_bytes + self.tensor_bytes + self.table_bytes
        if need > self.free_before:
            raise DslProgramError(
                f"the plan needs {need:,} bytes on the GPU ({self.arena_bytes:,} arena + {self.tensor_bytes:,} "
                f"tensors) but {driver.description} has {self.free_before:,} free; try --remat cheap or full, "
                "or a smaller batch (deepdsl memcheck --gpu-mem shows the largest that fits)"
            )
        # a data-parallel program (passes/data_parallel.py): the kernels accumulating micro-batches besides its own
        summing, summers = accumulate_source(train) if is_data_parallel(train.graph) else ("", [])
        bodies = [s.program.body for s in self.steps.values()] + ([summing] if summing else [])
        driver.load(translation_unit(train.graph.name, *bodies),
                    [k for s in self.steps.values() for k in s.program.kernels] + summers)  # fmt: skip
        self.arena = driver.alloc(max(self.arena_bytes, 4))
        self.tensors = {name: driver.alloc(max(_nbytes(shape, t), 4)) for name, (shape, t) in shapes.items()}
        self.tables = driver.alloc(self.table_bytes) if self.table_bytes else 0
        self.table_used = 0
        # each launch with its pointers, and the vendor routine that runs instead of the kernel (None: the kernel).
        # Find writes over a convolution's output, which is in the arena, where nothing lives yet (and before the
        # parameters are uploaded, should an output be a tensor); its scratch is freed before the shared one is made
        self._trial = (0, 0)  # Find's temporary scratch: (address, bytes)
        driver.vendor.find = None if deterministic else self._find_scratch
        try:
            self.calls = {name: _unfinished([self._call(name, x) for x in s.program.launches])
                          for name, s in self.steps.items()}  # fmt: skip
        finally:
            driver.vendor.find = None
            if self._trial[1]:
                driver.free(self._trial[0])
            self._trial = (0, 0)
        # the reductions among the train step's calls, and the micro-batches' accumulators (distributed/gpu.py)
        self.parallel: ParallelStep | None = None
        self.accumulator_bytes = 0
        if is_data_parallel(train.graph):
            self.parallel = ParallelStep(train, self.calls["train"], micro_batches, reducer)
            if micro_batches > 1:  # each bucket's sum over the micro-batches, beside the arena
                self.parallel.accumulators = {b: driver.alloc(4 * x.count) for b, x in self.parallel.buckets.items()}
                self.accumulator_bytes = sum(4 * x.count for x in self.parallel.buckets.values())
        elif reducer is not None or micro_batches > 1:
            raise DslProgramError("data-parallel training needs the program compiled with the data-parallel pass")
        self.set_arrays(arrays)
        self.free_low = driver.free_bytes()
        bound = [b for c in self.calls.values() for _, _, b in c if b is not None]
        self.vendor_launches = len(bound)
        # the most scratch one vendor call takes: a part of its statement's planned workspace, in the arena, or where
        # cuDNN's algorithm wants more than the plan gave (within the workspace limit), the one shared scratch
        self.vendor_workspace_bytes = max((b.workspace for b in bound), default=0)
        self.vendor_scratch_bytes = driver.vendor.scratch_bytes
        if self.vendor_scratch_bytes:
            driver.vendor.scratch = driver.alloc(self.vendor_scratch_bytes)
            self.free_low = driver.free_bytes()

    def _find_scratch(self, nbytes: int) -> int:
        """The address of a temporary scratch of at least `nbytes` for cuDNN's Find (grown, never shrunk)."""
        if nbytes > self._trial[1]:
            if self._trial[1]:
                self.driver.free(self._trial[0])
                self._trial = (0, 0)
            try:
                self._trial = (self.driver.alloc(nbytes), nbytes)
            except Exception as err:  # the driver's out-of-memory error, whichever library raises it
                raise DslProgramError(
                    f"--device cuda: no room for the {nbytes:,} bytes of scratch cuDNN's algorithm search wants "
                    f"({err}); try a smaller --workspace-limit, or --deterministic (no search)"
                ) from None
        return self._trial[0]

    @property
    def convolutions(self) -> list[dict[str, Any]]:
        """Each convolution the steps run through cuDNN, once per call and sizes: its algorithm, the scratch that
        takes (`scratch`: in the shared scratch beside the arena, not the statement's planned workspace) and the time
        Find measured for it (None: the heuristic's choice, under --deterministic)."""
        out = [{"call": conv.call, "shape": conv.shape, "algorithm": conv.algorithm, "workspace_bytes": conv.workspace,
                "scratch": shared, "time_ms": conv.time_ms}
               for conv, shared in self.driver.vendor.convolutions.values()]  # fmt: skip
        return sorted(out, key=lambda c: (c["call"], c["shape"]))

    def _call(self, step: str, x: Launch) -> tuple[Launch, list[int], Bound | None]:
        pointers = [self._pointer(step, a) for a in x.args]
        if x.table:  # a multi-tensor launch: its one argument is its table, written now
            table = multi_table(x, pointers)
            at = self.tables + self.table_used
            self.driver.upload(at, table)
            self.table_used += table.nbytes
            return x, [at], None
        plan = self.steps[step].plan
        ws = plan.workspace.get(x.stmt)
        workspace = (self.arena + ws.offset, ws.nbytes) if ws is not None else (0, 0)
        limit = VENDOR_WORKSPACE_LIMIT if plan.workspace_limit is None else plan.workspace_limit
        # which arguments hold bf16 values (--precision bf16): the vendor routine's types, or our kernel where none
        bf16 = [a.ctype == "dd_bf16" for a in x.args]
        return x, pointers, self.driver.vendor.bind(x.vendor, pointers, workspace, limit, bf16)

    def _pointer(self, step: str, a: Arg) -> int:
        if a.storage == "arena":
            return self.arena + a.offset
        inputs = self.steps[step].inputs
        return self.tensors[f"{step}:{a.name}" if a.name in inputs else a.name]

    @property
    def planned_bytes(self) -> int:
        """What the runner allocates: the arena, every tensor (inputs, parameters, state, constants), the tables of the
        multi-tensor launches and cuDNN's shared scratch, where an algorithm wants more than its statement's planned
        workspace; with micro-batches, each gradient bucket's accumulator."""
        return (
            self.arena_bytes + self.tensor_bytes + self.table_bytes + self.vendor_scratch_bytes + self.accumulator_bytes
        )

    @property
    def measured_bytes(self) -> int:
        """The GPU memory the runner took, as cuMemGetInfo saw it (allocation granularity included)."""
        return self.free_before - self.free_low

    def set_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        """Upload every parameter, model state and optimizer state tensor."""
        for p in self.steps["train"].plan.graph.params:
            a = np.ascontiguousarray(param_value(p, arrays), np.float32)
            self.driver.upload(self.tensors[p.value.name], a)

    def arrays(self) -> dict[str, np.ndarray]:
        """Every parameter, model state and optimizer state tensor, downloaded."""
        out = {}
        for p in self.steps["train"].plan.graph.params:
            a = np.empty(p.value.type.shape, np.float32)
            self.driver.download(self.tensors[p.value.name], a)
            out[p.value.name] = a
        return out

    def run(self, step: str, feeds: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float]:
        """One run of `step` ("train", "infer" or "eval") on `feeds` (input value -> array): its outputs and device
        seconds."""
        s = self.steps[step]
        self._upload(step, feeds)  # outside any graph: it reads the batch where this puts it
        graph = self._graph(step)
        with self.driver.timed() as clock:
            if graph is not None:
                self.driver.replay(graph)
            else:
                self._issue(step)
        self.train_runs += step == "train"
        outputs = {}
        for name, where in s.program.results:
            v = s.plan.graph.output(name)
            a = np.empty(v.type.shape, _STORED.get(v.type.dtype, np.int64))
            self.driver.download(self._pointer(step, where), a)
            outputs[name] = from_bf16_bits(a) if v.type.dtype is DType.BF16 else a  # a bf16 output widened
        self.free_low = min(self.free_low, self.driver.free_bytes())
        return outputs, clock.seconds

    def _issue(self, step: str, part: str = "all", micro: int = 0) -> None:
        """Every launch, vendor call and copy of `step`, in program order, on the driver's stream; a data-parallel
        train step with its reductions, or its `part` "pre" (for micro-batch `micro`) or "post" (parallel.py)."""
        calls = self.calls[step]
        if step == "train" and self.parallel is not None:
            self.parallel.issue(lambda c: self._run_call(*calls[c]), self.driver.copy, self._accumulate, part, micro)
        else:
            for call in calls:
                self._run_call(*call)
        if part != "pre":
            for src, tensor, nbytes in self.steps[step].program.copies:
                self.driver.copy(self.tensors[tensor], self._pointer(step, src), nbytes)

    def _run_call(self, launch: Launch, pointers: list[int], bound: Bound | None) -> None:
        if bound is None:
            self.driver.launch(launch, pointers)
        else:
            bound.run()

    def _accumulate(self, count: int, acc: int, x: int) -> None:
        self.driver.launch(accumulate_launch(count), [acc, x])

    def run_parallel(self, shards: Sequence[dict[str, np.ndarray]]) -> tuple[dict[str, np.ndarray], float]:
        """One data-parallel train step (the program of passes/data_parallel.py) on this rank's shards, one per
        micro-batch: with one, the step of `run` (a graph from its second run on), its reductions among its launches;
        with more, the statements before the reductions once per shard (each shard uploaded before), accumulating
        the buckets, then the rest once (parallel.py). Returns the outputs and the device seconds."""
        assert self.parallel is not None and len(shards) == self.parallel.micro_batches
        if len(shards) == 1:
            return self.run("train", shards[0])
        s = self.steps["train"]
        seconds = 0.0
        for k, feeds in enumerate(shards):
            self._upload("train", feeds)
            with self.driver.timed() as clock:
                self._issue("train", "pre", k)
            seconds += clock.seconds
        with self.driver.timed() as clock:
            self._issue("train", "post")
        self.train_runs += 1
        outputs = {}
        for name, where in s.program.results:
            v = s.plan.graph.output(name)
            a = np.empty(v.type.shape, np.float32 if v.type.dtype is DType.F32 else np.int64)
            self.driver.download(self._pointer("train", where), a)
            outputs[name] = a
        self.free_low = min(self.free_low, self.driver.free_bytes())
        return outputs, seconds + clock.seconds

    def _graph(self, step: str) -> Any:
        """The train step's graph, captured at its second run; None where `step` runs call for call (the warm-up,
        inference and test steps, graphs off, or a step the driver could not capture: off from then on)."""
        if step != "train" or self.graph != "on" or self.train_runs == 0:
            return None
        if self.captured is None:
            try:
                self.captured = self.driver.capture(lambda: self._issue("train"))
            except CaptureFailed as err:
                self.graph = f"off ({err})"
                return None
        return self.captured

    def profile(self, step: str, feeds: dict[str, np.ndarray]) -> list[tuple[Launch, str, float]]:
        """One run of `step` with each launch timed on its own (device events around it, so the launches do not
        overlap): (launch, what ran: its kernel or the vendor routine, device seconds), in program order. The
        device-to-device copies after the launches are left out."""
        self._upload(step, feeds)
        timings = []
        for launch, pointers, bound in self.calls[step]:
            with self.driver.timed() as clock:
                if bound is None:
                    self.driver.launch(launch, pointers)
                else:
                    bound.run()
            timings.append((launch, launch.kernel if bound is None else bound.what, clock.seconds))
        return timings

    def _upload(self, step: str, feeds: dict[str, np.ndarray]) -> None:
        for name, dtype in self.steps[step].inputs.items():
            self.driver.upload(self.tensors[f"{step}:{name}"], np.ascontiguousarray(feeds[name], dtype))

    def close(self) -> None:
        self.driver.close()


def _unfinished(calls: list[tuple[Launch, list[int], Bound | None]]) -> list[tuple[Launch, list[int], Bound | None]]:
    """`calls` less the finishing launches of our kernels (the filter gradient's sum of its partial sums) whose
    statement a vendor routine serves."""
    served = {x.stmt for x, _, b in calls if b is not None}
    return [c for c in calls if not (c[0].finishes and c[0].stmt in served)]


# how a value is stored on the GPU: float32, bf16 (--precision bf16: its bits, library.cu dd_bf16) or int64
_STORED = {DType.F32: np.float32, DType.BF16: np.uint16}


def _nbytes(shape: tuple[int, ...], dtype: Any) -> int:
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def _step(prog: CudaProgram, p: Plan) -> _Step:
    inputs = {d.value.name: np.dtype(np.float32 if d.value.type.dtype is DType.F32 else np.int64)
              for d in p.graph.inputs}  # fmt: skip
    return _Step(prog, p, inputs)


# ---- PyCUDA ----


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


__all__ = ["CpuClock", "Driver", "GpuRunner", "OneStream", "PyCudaDriver", "pycuda_available", "reducer_streams"]
