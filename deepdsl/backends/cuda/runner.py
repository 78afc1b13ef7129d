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

What the runner needs of a GPU is a `Driver`. `PyCudaDriver` (drivers.py) is the real one: PyCUDA (the `gpu`
extra), PTX from NVRTC or nvcc for the device's architecture, CUDA events for timing and `cuMemGetInfo` for the
memory the runner really took. The tests drive the same runner with kernels compiled for the CPU, so the launch
program itself is checked on machines without a GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from deepdsl.backends.cuda.graphs import CaptureFailed
from deepdsl.backends.cuda.launch import Arg, CudaProgram, Launch, multi_table
from deepdsl.backends.cuda.parallel import ParallelStep, Reducer, accumulate_launch, accumulate_source
from deepdsl.backends.cuda.translation import program, translation_unit
from deepdsl.backends.cuda.vendor import Bound, Vendor
from deepdsl.backends.numpy_runner import param_value
from deepdsl.errors import DslProgramError
from deepdsl.ir.types import DType
from deepdsl.memory.plan import Plan
from deepdsl.memory.report import VENDOR_WORKSPACE_LIMIT as REPORTED_LIMIT  # memcheck's bound of the scratch
from deepdsl.ops.collective import is_data_parallel
from deepdsl.ops.precision import from_bf16_bits


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


__all__ = ["Driver", "GpuRunner"]
