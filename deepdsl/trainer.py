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
from typing import Any

import numpy as np

from deepdsl.backends.cuda.runner import Driver, GpuRunner
from deepdsl.backends.numpy_runner import NonFinite, run, run_plan
from deepdsl.build import Build
from deepdsl.checkpoint import load_npz, save_npz
from deepdsl.data.augment import augment
from deepdsl.data.named import Samples, batch_size
from deepdsl.distributed import Executor, GpuComm, Session, inject_fault
from deepdsl.errors import DslProgramError
from deepdsl.initializers import init_array
from deepdsl.ir import Graph, ParamDef
from deepdsl.ir.analysis import classified_label, regression_target
from deepdsl.memory.footprint import available_memory, check_fits, footprint, memory_limits
from deepdsl.memory.report import total_peak
from deepdsl.ops.collective import is_data_parallel
from deepdsl.passes.sync_batch_norm import refuse_micro_batches

# The largest step counter a parameter file may hold: far beyond any run, and small enough that iteration x batch
# (the sample position the data source computes, in int64 in the Java runtime) cannot overflow.
MAX_ITERATION = 2**32 - 1


@dataclass
class TrainResult:
    losses: list[float] = field(default_factory=list)
    # each step's value of each named term of a loss of several (`loss = rec + 0.5 * kl`: rec, kl), by name
    loss_terms: dict[str, list[float]] = field(default_factory=dict)
    learning_rates: list[float] | None = None  # each step's, where the train block gives a schedule
    test_loss: float | None = None
    test_accuracy: float | None = None
    test_metrics: dict[str, float] = field(default_factory=dict)  # Trainer.measure's at the end: top-5, MAE, ...
    peak_bytes: int = 0  # what one step holds: parameters, state, optimizer state, inputs, constants and the arena
    arena_bytes: int = 0  # the arena (gradients, activations, workspace): the step's temporaries
    seconds_per_iter: float = 0.0
    step_seconds: list[float] = field(default_factory=list)  # each step's wall clock, its batch's feeding included
    gpu_memory_bytes: int | None = None  # on a GPU: the memory the runner took, as cuMemGetInfo measured it
    gpu_planned_bytes: int | None = None  # and what it allocated: the arena, every tensor and cuDNN's shared scratch
    # the most scratch one vendor library call took (cuDNN's algorithm within the workspace limit)
    gpu_vendor_workspace_bytes: int | None = None
    # the scratch allocated beside the arena for algorithms that want more than their statement's planned workspace
    gpu_vendor_scratch_bytes: int | None = None
    gpu_graph: str | None = None  # "on": the train step ran as a CUDA graph from its second run on; "off (why)"
    # cuDNN's convolutions: each one's call, sizes, algorithm, scratch bytes (and whether in the shared scratch), and
    # Find's time; and whether the algorithms are the heuristic's deterministic ones (--deterministic)
    gpu_convolutions: list[dict[str, Any]] | None = None
    gpu_deterministic: bool | None = None


class Trainer:
    def __init__(self, build: Build, data: Samples, dtype: type = np.float32, session: Session | None = None):
        program = build.program
        self.build = build
        self.program = program
        self.data = data
        self.seed = build.seed
        self.dtype = dtype
        self.train_graph: Graph = build.train
        self.infer_graph: Graph | None = build.infer
        self.eval_graph: Graph | None = build.eval
        self.classified = classified_label(program.graph)
        self.regression = regression_target(program.graph)  # the input predict is compared with (test_mae)
        self.plan = build.train_plan if dtype == np.float32 else None  # float64 runs without an arena
        # the whole footprint against the memory available, before the arrays below are allocated
        check_fits(footprint(build.train_plan, np.dtype(dtype).itemsize), available_memory(), memory_limits())
        self.batch = batch_size(program.graph)
        self.shuffle = self.seed if program.train.shuffle else None
        self.arrays: dict[str, np.ndarray] = {p.value.name: self._init(p) for p in self.train_graph.params}
        self.step_count = 0
        # the named terms of the loss (graph outputs `loss:NAME`) and their values at the last step
        self.term_names = tuple(n.removeprefix("loss:") for n, _ in self.train_graph.outputs if n.startswith("loss:"))
        self.last_terms: dict[str, float] = {}
        self.gpu: GpuRunner | None = None
        self.reducer: Any = None  # a data-parallel rank's NCCL reducer on the GPU (nccl.py NcclReducer)
        self._gpu_ahead = False  # the GPU holds newer parameters than self.arrays
        # data-parallel training or gradient accumulation (deepdsl/distributed/): this rank's session and the
        # executor of the data-parallel program (Options.buckets); None: the plain step
        self.session = session
        self.executor: Executor | None = None
        if is_data_parallel(build.train):
            if dtype != np.float32:
                raise DslProgramError("data-parallel training and --micro-batches run in float32 (no --float64)")
            self.session = session or Session(*_single())
            self.executor = Executor(build.train_plan.graph)
            # synchronised batch norm over micro-batches: refused, at the train block's key where it asked for it
            train = program.train
            refuse_micro_batches(build.train, self.session.micro_batches,
                                 train.sync_batch_norm_at if train.sync_batch_norm else None)  # fmt: skip

    def use_gpu(self, driver: Driver, graphs: bool = True) -> None:
        """Run every later step and test on the GPU behind `driver` (the parameters move there and stay); `graphs`:
        the train step as a CUDA graph from its second run on (runner.py)."""
        if self.plan is None:
            raise DslProgramError("--float64 runs on the NumPy runner only; use --device cpu")
        s = self.session if self.executor is not None else None
        if s is not None and not isinstance(s.comm, GpuComm) and (s.world.size > 1 or s.micro_batches > 1):
            raise DslProgramError("this data-parallel session reduces over MPI on the NumPy runner (--device cpu)")
        # a data-parallel rank's reductions: NCCL on this GPU (deepdsl/distributed/gpu.py); micro-batches summed here
        reducer = s.comm.connect(driver) if s is not None and isinstance(s.comm, GpuComm) else None
        self.gpu = GpuRunner(driver, self.plan, self.build.infer_plan, self.arrays, self.build.eval_plan, graphs,
                             self.build.options.deterministic, reducer,
                             s.micro_batches if s is not None else 1)  # fmt: skip
        self.reducer = reducer

    def _sync(self) -> None:
        if self.gpu is not None and self._gpu_ahead:
            self.arrays.update(self.gpu.arrays())
            self._gpu_ahead = False

    def _init(self, p: ParamDef) -> np.ndarray:
        i = p.init
        return init_array(p.value.name, p.value.type.shape, i.kind, i.args, i.fan_in, i.fan_out, self.seed, self.dtype)

    def _feeds(self, graph: Graph, batch: dict[str, np.ndarray], step: int, offset: int = 0) -> dict[str, np.ndarray]:
        """Every input of `graph` from the batch's arrays by name, the step counter and the learning rate; in a
        data-parallel program the scale 1/(ranks x micro-batches) and the shard's first global position `offset`."""
        feeds = {}
        for d in graph.inputs:
            if d.kind == "scale":
                assert self.session is not None
                feeds[d.value.name] = np.asarray(1.0 / self.session.shards_per_step, dtype=np.float32)
            elif d.kind == "offset":
                feeds[d.value.name] = np.asarray(offset, dtype=np.int64)
            elif d.kind == "step":
                feeds[d.value.name] = np.asarray(step, dtype=np.int64)
            elif d.kind == "lr":
                feeds[d.value.name] = np.asarray(self.learning_rate(step), dtype=self.dtype)
            else:
                feeds[d.value.name] = batch[d.value.name]
        return feeds

    def _augmented(self, batch: dict[str, np.ndarray], iteration: int | None = None) -> dict[str, np.ndarray]:
        """`batch` with the train block's augmentation (data/augment.py): a training batch (`iteration` given) gets
        every step, a test or prediction batch the normalisation only."""
        cfg = self.program.train
        name = cfg.augment_input
        if not cfg.augment or name is None or name not in batch:
            return batch
        train = iteration is not None
        first = iteration * self.batch if iteration is not None else 0
        x = augment(batch[name], cfg.augment, first, self.seed, train)
        return {**batch, name: x.astype(batch[name].dtype, copy=False)}

    def learning_rate(self, iteration: int) -> float:
        """The learning rate of step `iteration` (0, 1, ...: the step counter) as the step takes it: the train block's
        schedule, rounded to float32 (the optimizer's constant where there is no schedule)."""
        schedule = self.program.train.lr
        rate = schedule.at(iteration) if schedule is not None else dict(self.program.train.optimizer[1])["lr"]
        return float(np.float32(rate))

    def step(self, number: int | None = None) -> tuple[float, int, int]:
        """Run one training step on the next batch; returns (loss, the bytes the step held, those of its arena): on
        the NumPy runner as measured, on the GPU as planned. A NaN or Inf is reported as in iteration `number`
        (default: the steps taken so far plus one, counting from 1 as the progress lines do)."""
        i = self.step_count
        label = i + 1 if number is None else number
        if self.executor is not None:
            return self._parallel_step(i, label)
        feeds = self._feeds(self.train_graph, self._augmented(self.data.batch(i, self.batch, self.shuffle), i), i)
        if self.gpu is not None:
            outputs, _ = self.gpu.run("train", feeds)
            return self._gpu_step_done(outputs, label)
        if self.plan is not None:
            result = run_plan(self.plan, feeds, self.arrays)
        else:
            result = run(self.train_graph, feeds, self.arrays, self.dtype)
        loss = float(result.outputs["loss"])
        self.last_terms = {t: float(result.outputs[f"loss:{t}"]) for t in self.term_names}
        if not math.isfinite(loss) or not all(np.isfinite(a).all() for a in result.updates.values()):
            # a finite loss with a non-finite update: blame the update now, not the next step's forward pass
            self._locate_non_finite(feeds, label)
        self.arrays.update(result.updates)
        self.step_count += 1
        return loss, result.peak_bytes, result.arena_bytes

    def _gpu_step_done(self, outputs: dict, label: int) -> tuple[float, int, int]:
        """A train step the GPU ran (plain or data-parallel): its loss and terms, the step counted."""
        assert self.plan is not None
        loss = float(outputs["loss"])
        self.last_terms = {t: float(outputs[f"loss:{t}"]) for t in self.term_names}
        if not math.isfinite(loss):  # the GPU has already updated the parameters: no replay from here
            raise NonFinite(f"iteration {label}: the loss is not finite (on the GPU; the same run with "
                            "--device cpu names the first statement that produced it)")  # fmt: skip
        self._gpu_ahead = True
        self.step_count += 1
        return loss, total_peak(self.plan), self.plan.arena_bytes

    def _parallel_step(self, i: int, label: int) -> tuple[float, int, int]:
        """Step `i` of the data-parallel program: this rank's shards of the global batch (one per micro-batch, at
        their global positions), the reductions through the session's engine, the updates."""
        s, ex = self.session, self.executor
        assert s is not None and ex is not None and self.plan is not None
        g = self.train_graph
        shards = [
            self._feeds(g, self._augmented(self.data.batch(b, self.batch, self.shuffle), b), i, offset)
            for b, offset in zip(s.blocks(i), s.offsets(self.batch))
        ]
        inject_fault(s.fault, s.rank, label)
        if self.gpu is not None:
            if self.reducer is not None:
                self.reducer.begin_step()  # the watchdog times the step
            outputs, _ = self.gpu.run_parallel(shards)
            if self.reducer is not None:
                self.reducer.end_step()
            return self._gpu_step_done(outputs, label)
        result = ex.step(shards, self.arrays, s.comm, i)
        loss = float(result.outputs["loss"])
        self.last_terms = {t: float(result.outputs[f"loss:{t}"]) for t in self.term_names}
        if not math.isfinite(loss) or not all(np.isfinite(a).all() for a in result.updates.values()):
            self._locate_non_finite(shards[0], label)
        self.arrays.update(result.updates)
        self.step_count += 1
        return loss, total_peak(self.plan), self.plan.arena_bytes

    def _locate_non_finite(self, feeds: dict[str, np.ndarray], i: int) -> None:
        try:
            run(self.train_graph, feeds, self.arrays, self.dtype, check_finite=True)
        except NonFinite as err:
            raise NonFinite(f"iteration {i}: {err.message}", err.span) from None
        raise NonFinite(f"iteration {i}: the loss or an update is not finite")

    def test(self, batches: int | None = None) -> tuple[float, float | None] | None:
        """The mean test loss (in inference semantics) and, where the loss classifies a label (`classified_label`),
        the accuracy of `predict` on the test set (the whole set, or the first `batches` batches); None without a
        test set."""
        m = self.measure(batches)
        return None if m is None else (m["test_loss"], m.get("test_accuracy"))

    def measure(self, batches: int | None = None) -> dict[str, float] | None:
        """The test phase's metrics on the test set (the whole set, or the first `batches` batches), None without a
        test set: ``test_loss`` (the mean loss, in inference semantics); where the loss classifies a label,
        ``test_accuracy`` (top-1) and, with more than 5 classes, ``test_top5_accuracy``: a sample counts when fewer
        than k classes rank before its label, ranking by score and then by class id (so top-1 is argmax's), a NaN or
        Inf score counting as wrong; where the loss regresses `predict` on an input (`regression_target`),
        ``test_mae``, the mean absolute difference over every element."""
        d = self.data
        graph = self.eval_graph
        if graph is None or d.test is None:
            return None
        n = self.batch
        count = d.test_size // n if batches is None else min(batches, max(1, d.test_size // n))
        correct = top5 = total = elements = 0
        loss_sum = abs_sum = 0.0
        classes = 0
        for b in range(max(1, count)):
            feeds = self._feeds(graph, self._augmented(d.test_batch(b, n)), 0)
            if self.gpu is not None:
                outputs = self.gpu.run("eval", feeds)[0]
            else:
                outputs = run(graph, feeds, self.arrays, self.dtype).outputs
            loss_sum += float(outputs["loss"])
            if self.classified is not None:
                scores, ys = outputs["predict"], feeds[self.classified]
                classes = scores.shape[1]
                finite = np.isfinite(scores).all(axis=1)  # a NaN or Inf score is a wrong answer, whatever argmax says
                mine = np.take_along_axis(scores, ys.reshape(-1, 1), axis=1)
                ids = np.arange(classes).reshape(1, -1)
                rank = np.sum((scores > mine) | ((scores == mine) & (ids < ys.reshape(-1, 1))), axis=1)
                correct += int(np.sum(finite & (rank < 1)))
                top5 += int(np.sum(finite & (rank < 5)))
                total += n
            if self.regression is not None:
                diff = np.abs(outputs["predict"].astype(np.float64) - feeds[self.regression].astype(np.float64))
                abs_sum += float(diff.sum())
                elements += diff.size
        out = {"test_loss": loss_sum / max(1, count)}
        if self.classified is not None:
            out["test_accuracy"] = correct / total
            if classes > 5:
                out["test_top5_accuracy"] = top5 / total
        if self.regression is not None:
            out["test_mae"] = abs_sum / elements
        return out

    def predict(self, data: Samples) -> np.ndarray:
        """`predict` for every training-split sample of `data`, in order, in inference semantics: batches of N, the
        last one filled by wrapping around and cut back."""
        graph = self.infer_graph
        if graph is None:
            raise DslProgramError("the network defines no `predict`, so there is nothing to predict")
        n, m = self.batch, data.size
        parts = []
        for b in range((m + n - 1) // n):
            rows = {name: np.take(a, range(b * n, b * n + n), axis=0, mode="wrap") for name, a in data.train.items()}
            rows = self._augmented(rows)
            feeds = self._feeds(graph, rows, 0)
            if self.gpu is not None:
                parts.append(self.gpu.run("infer", feeds)[0]["predict"])
            else:
                parts.append(run(graph, feeds, self.arrays, self.dtype).outputs["predict"])
        return np.concatenate(parts)[:m]

    def train(
        self,
        iterations: int,
        on_step: Callable[[int, float, float], None] | None = None,
        on_test: Callable[[int, float, float | None], None] | None = None,
        save_to: str | None = None,
        replace_readonly: bool = False,
    ) -> TrainResult:
        """Run `iterations` steps; every `test_every` steps test on `test_iterations` batches (reported
        through `on_test` as the iteration, the test loss and the accuracy or None); test on the whole test set at the
        end. With `save_to`, the parameter file is written there every `save_every` steps of the train block.
        """
        cfg = self.program.train
        result = TrainResult(learning_rates=[] if cfg.lr is not None else None)
        result.loss_terms = {t: [] for t in self.term_names}  # named even when no step runs (as in Java)
        start = time.perf_counter()
        for k in range(iterations):
            t0 = time.perf_counter()
            if result.learning_rates is not None:
                result.learning_rates.append(self.learning_rate(self.step_count))
            loss, peak, arena = self.step(k + 1)
            result.step_seconds.append(time.perf_counter() - t0)
            result.losses.append(loss)
            for t in self.term_names:
                result.loss_terms.setdefault(t, []).append(self.last_terms[t])
            if save_to is not None and cfg.save_every and (k + 1) % cfg.save_every == 0:
                self.save(save_to, replace_readonly)
            result.peak_bytes = max(result.peak_bytes, peak)
            result.arena_bytes = max(result.arena_bytes, arena)
            if on_step:
                on_step(k, loss, time.perf_counter() - t0)
            if on_test and cfg.test_every and (k + 1) % cfg.test_every == 0 and k + 1 < iterations:
                tested = self.test(cfg.test_iterations)
                if tested is not None:
                    on_test(k, *tested)
        result.seconds_per_iter = (time.perf_counter() - start) / iterations if iterations else 0.0
        measured = self.measure() if iterations else None  # nothing trained (--iters 0): nothing to test
        if measured is not None:
            result.test_loss, result.test_accuracy = measured["test_loss"], measured.get("test_accuracy")
            result.test_metrics = measured
        if self.gpu is not None:
            result.gpu_memory_bytes = self.gpu.measured_bytes
            result.gpu_planned_bytes = self.gpu.planned_bytes
            result.gpu_vendor_workspace_bytes = self.gpu.vendor_workspace_bytes
            result.gpu_vendor_scratch_bytes = self.gpu.vendor_scratch_bytes
            result.gpu_graph = self.gpu.graph
            result.gpu_convolutions = self.gpu.convolutions
            result.gpu_deterministic = self.gpu.deterministic
        return result

    # ---- parameter files (DESIGN §9) ----

    def state(self) -> dict[str, np.ndarray]:
        self._sync()
        out = {p.value.name: self.arrays[p.value.name] for p in self.train_graph.params if p.kind in ("param", "state")}
        out.update({p.value.name: self.arrays[p.value.name] for p in self.train_graph.params if p.kind == "opt"})
        out["opt/iteration"] = np.asarray(self.step_count, dtype=np.int64)
        return out

    def save(self, path: str, replace_readonly: bool = False) -> None:
        """Write the state to `path`; a NaN or an infinity in it is refused, nothing written (as in Java). In a
        data-parallel run rank 0 alone writes (every rank holds the same state)."""
        if self.session is not None and self.session.rank != 0:
            return
        state = self.state()
        for name, a in state.items():
            if a.dtype.kind == "f" and not np.isfinite(a).all():
                raise NonFinite(f"not saving {path}: '{name}' holds a NaN or an infinity (the training diverged; a "
                                "smaller --lr may help)")  # fmt: skip
        save_npz(path, state, replace_readonly=replace_readonly)

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


def _single() -> tuple:
    """The session of one process (gradient accumulation over micro-batches: one, unless a session is given)."""
    from deepdsl.distributed import Accumulate, World

    return World(), 1, Accumulate()


__all__ = ["TrainResult", "Trainer"]
