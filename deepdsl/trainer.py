"""Training with the NumPy reference runner: parameters, steps, tests, saving and loading.

A trainer runs the programs of one `Build` (api.build): the optimised training and inference programs and their
plans. It owns the arrays of every parameter, model state (`NAME.running_mean`, ...) and optimizer
state (`opt/<parameter>/momentum`, `opt/step`, ...); one `step(i)` runs the training program on batch i
and writes the updates back. Parameter files follow DESIGN §9.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from deepdsl.backends.cuda.runner import Driver, GpuRunner
from deepdsl.backends.numpy_runner import NonFinite, run, run_plan
from deepdsl.build import Build
from deepdsl.checkpoint import load_npz, save_npz
from deepdsl.data import Dataset
from deepdsl.errors import DslProgramError
from deepdsl.initializers import init_array
from deepdsl.ir import Graph, ParamDef
from deepdsl.memory.footprint import available_memory, check_fits, footprint
from deepdsl.memory.report import total_peak

# The largest step counter a parameter file may hold: far beyond any run, and small enough that iteration x batch
# (the sample position the data source computes, in int64 in the Java runtime) cannot overflow.
MAX_ITERATION = 2**32 - 1


@dataclass
class TrainResult:
    losses: list[float] = field(default_factory=list)
    test_accuracy: float | None = None
    peak_bytes: int = 0  # what one step holds: parameters, state, optimizer state, inputs, constants and the arena
    arena_bytes: int = 0  # the arena (gradients, activations, workspace): the step's temporaries
    seconds_per_iter: float = 0.0
    gpu_memory_bytes: int | None = None  # on a GPU: the memory the runner took, as cuMemGetInfo measured it
    gpu_planned_bytes: int | None = None  # and what it allocated: the arena and every tensor


class Trainer:
    def __init__(self, build: Build, data: Dataset, dtype: type = np.float32):
        program = build.program
        self.build = build
        self.program = program
        self.data = data
        self.seed = build.seed
        self.dtype = dtype
        self.train_graph: Graph = build.train
        self.infer_graph: Graph | None = build.infer
        self.plan = build.train_plan if dtype == np.float32 else None  # float64 runs without an arena
        # the whole footprint against the memory available, before the arrays below are allocated
        check_fits(footprint(build.train_plan, np.dtype(dtype).itemsize), available_memory())
        self.batch = next(d for d in program.graph.inputs if d.kind == "input").value.type.shape[0]
        self.shuffle = self.seed if program.train.shuffle else None
        self.arrays: dict[str, np.ndarray] = {p.value.name: self._init(p) for p in self.train_graph.params}
        self.step_count = 0
        self.gpu: GpuRunner | None = None
        self._gpu_ahead = False  # the GPU holds newer parameters than self.arrays

    def use_gpu(self, driver: Driver) -> None:
        """Run every later step and test on the GPU behind `driver` (the parameters move there and stay)."""
        if self.plan is None:
            raise DslProgramError("--float64 runs on the NumPy runner only; use --device cpu")
        self.gpu = GpuRunner(driver, self.plan, self.build.infer_plan, self.arrays)

    def _sync(self) -> None:
        if self.gpu is not None and self._gpu_ahead:
            self.arrays.update(self.gpu.arrays())
            self._gpu_ahead = False

    def _init(self, p: ParamDef) -> np.ndarray:
        i = p.init
        return init_array(p.value.name, p.value.type.shape, i.kind, i.args, i.fan_in, i.fan_out, self.seed, self.dtype)

    def _feeds(self, graph: Graph, x: np.ndarray, y: np.ndarray, step: int) -> dict[str, np.ndarray]:
        feeds: dict[str, np.ndarray] = {}
        for d in graph.inputs:
            feeds[d.value.name] = {"input": x, "label": y, "step": np.asarray(step, dtype=np.int64)}[d.kind]
        return feeds

    def step(self, number: int | None = None) -> tuple[float, int, int]:
        """Run one training step on the next batch; returns (loss, the bytes the step held, those of its arena): on
        the NumPy runner as measured, on the GPU as planned. A NaN or Inf is reported as in iteration `number`
        (default: the steps taken so far plus one, counting from 1 as the progress lines do)."""
        i = self.step_count
        label = i + 1 if number is None else number
        x, y = self.data.batch(i, self.batch, self.shuffle)
        feeds = self._feeds(self.train_graph, x, y, i)
        if self.gpu is not None:
            outputs, _ = self.gpu.run("train", feeds)
            loss = float(outputs["loss"])
            if not math.isfinite(loss):  # the GPU has already updated the parameters: no replay from here
                raise NonFinite(f"iteration {label}: the loss is not finite (on the GPU; the same run with "
                                "--device cpu names the first statement that produced it)")  # fmt: skip
            self._gpu_ahead = True
            self.step_count += 1
            assert self.plan is not None
            return loss, total_peak(self.plan), self.plan.arena_bytes
        if self.plan is not None:
            result = run_plan(self.plan, feeds, self.arrays)
        else:
            result = run(self.train_graph, feeds, self.arrays, self.dtype)
        loss = float(result.outputs["loss"])
        if not math.isfinite(loss) or not all(np.isfinite(a).all() for a in result.updates.values()):
            # a finite loss with a non-finite update: blame the update now, not the next step's forward pass
            self._locate_non_finite(feeds, label)
        self.arrays.update(result.updates)
        self.step_count += 1
        return loss, result.peak_bytes, result.arena_bytes

    def _locate_non_finite(self, feeds: dict[str, np.ndarray], i: int) -> None:
        try:
            run(self.train_graph, feeds, self.arrays, self.dtype, check_finite=True)
        except NonFinite as err:
            raise NonFinite(f"iteration {i}: {err.message}", err.span) from None
        raise NonFinite(f"iteration {i}: the loss or an update is not finite")

    def test(self, batches: int | None = None) -> float | None:
        """Accuracy of `predict` on the test set (the whole set, or the first `batches` batches)."""
        d = self.data
        if self.infer_graph is None or d.x_test is None or d.y_test is None:
            return None
        graph = self.infer_graph
        n = graph.inputs[0].value.type.shape[0] if graph.inputs else self.batch
        count = len(d.x_test) // n if batches is None else min(batches, max(1, len(d.x_test) // n))
        correct = total = 0
        for b in range(max(1, count)):
            xs = np.take(d.x_test, range(b * n, b * n + n), axis=0, mode="wrap")
            ys = np.take(d.y_test, range(b * n, b * n + n), mode="wrap")
            feeds = {dd.value.name: xs if dd.kind == "input" else ys for dd in graph.inputs}
            if self.gpu is not None:
                scores = self.gpu.run("infer", feeds)[0]["predict"]
            else:
                scores = run(graph, feeds, self.arrays, self.dtype).outputs["predict"]
            finite = np.isfinite(scores).all(axis=1)  # a NaN or Inf score is a wrong answer, whatever argmax says
            correct += int(np.sum(finite & (np.argmax(scores, axis=1) == ys)))
            total += n
        return correct / total

    def train(
        self,
        iterations: int,
        on_step: Callable[[int, float, float], None] | None = None,
        on_test: Callable[[int, float], None] | None = None,
    ) -> TrainResult:
        """Run `iterations` steps; every `test_every` steps test on `test_iterations` batches (reported
        through `on_test`); test on the whole test set at the end."""
        cfg = self.program.train
        result = TrainResult()
        start = time.perf_counter()
        for k in range(iterations):
            t0 = time.perf_counter()
            loss, peak, arena = self.step(k + 1)
            result.losses.append(loss)
            result.peak_bytes = max(result.peak_bytes, peak)
            result.arena_bytes = max(result.arena_bytes, arena)
            if on_step:
                on_step(k, loss, time.perf_counter() - t0)
            if on_test and cfg.test_every and (k + 1) % cfg.test_every == 0 and k + 1 < iterations:
                accuracy = self.test(cfg.test_iterations)
                if accuracy is not None:
                    on_test(k, accuracy)
        result.seconds_per_iter = (time.perf_counter() - start) / iterations if iterations else 0.0
        result.test_accuracy = self.test() if iterations else None  # nothing trained (--iters 0): nothing to test
        if self.gpu is not None:
            result.gpu_memory_bytes = self.gpu.measured_bytes
            result.gpu_planned_bytes = self.gpu.planned_bytes
        return result

    # ---- parameter files (DESIGN §9) ----

    def state(self) -> dict[str, np.ndarray]:
        self._sync()
        out = {p.value.name: self.arrays[p.value.name] for p in self.train_graph.params if p.kind in ("param", "state")}
        out.update({p.value.name: self.arrays[p.value.name] for p in self.train_graph.params if p.kind == "opt"})
        out["opt/iteration"] = np.asarray(self.step_count, dtype=np.int64)
        return out

    def save(self, path: str) -> None:
        save_npz(path, self.state())

    def load(self, path: str) -> None:
        expected = {name: (a.shape, a.dtype) for name, a in self.state().items()}
        loaded = load_npz(path, expected)
        if not loaded:
            raise DslProgramError(f"parameter file '{path}' holds nothing to load")
        for name, a in loaded.items():
            if name == "opt/iteration":
                if not 0 <= int(a) <= MAX_ITERATION:
                    raise DslProgramError(
                        f"parameter file '{path}': 'opt/iteration' is {int(a)}, but a step counter lies in "
                        f"[0, {MAX_ITERATION}]"
                    )
                self.step_count = int(a)
            else:
                self.arrays[name] = a.astype(self.arrays[name].dtype)
        if self.gpu is not None:
            self.gpu.set_arrays(self.arrays)
            self._gpu_ahead = False


__all__ = ["TrainResult", "Trainer"]
