"""`deepdsl run`: pick a device, load data, train a Build (api.build), test, save; report progress through a
callback."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from deepdsl.backends.cuda.runner import GPU_EXTRA, Driver, PyCudaDriver, pycuda_available
from deepdsl.build import Build
from deepdsl.checkpoint import check_writable
from deepdsl.data import load_data, parse_data_flag
from deepdsl.errors import DslProgramError
from deepdsl.trainer import Trainer, TrainResult

BAR = 24


CPU = "cpu (NumPy reference runner)"


def open_device(device: str, double: bool = False) -> tuple[Driver | None, str, str | None]:
    """The GPU driver for `device` (None: the NumPy runner), what runs the program (the device line) and, under
    `auto` on the CPU, why CUDA is not used (a line of its own).

    `auto` takes the GPU when PyCUDA is installed and finds one, and says why not otherwise; `cpu` says nothing
    of CUDA; `cuda` is a user error (with the reason) when it cannot have one."""
    if device == "cpu":
        return None, CPU, None
    if device == "auto" and (double or not pycuda_available()):
        why = "--float64 runs on the NumPy runner" if double else f"PyCUDA is not installed ({GPU_EXTRA})"
        return None, CPU, _not_used(why)
    if double:
        raise DslProgramError("--float64 runs on the NumPy runner only; use --device cpu")
    try:
        driver = PyCudaDriver()
    except DslProgramError as err:
        if device == "cuda":
            raise
        return None, CPU, _not_used(err.message)
    return driver, f"cuda ({driver.description}, PyCUDA runner)", None


def _data_label(kind: str, args: dict[Any, Any], seed: int) -> str:
    """The data source as the progress header names it: synthetic data with the seed it is made from (its own,
    `--data synthetic:SEED`, or the program's), so that `synthetic:5` says what the 5 is."""
    if kind != "synthetic":
        return kind
    own = args.get("seed", args.get(0))
    return f"synthetic (seed {seed if own is None else own})"


def _not_used(why: str) -> str:
    """The line of a run under `auto` that could have used the GPU and did not: why."""
    return f"CUDA not used: {why.removeprefix('--device cuda: ')}"


def run_training(
    build: Build, iters: int | None = None, data_flag: str | None = None, load: str | None = None,
    save: str | None = None, device: str = "auto", double: bool = False, report: Callable[[str], None] | None = None,
    driver: Driver | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Train `build` and report through `report`; `driver` runs it on that GPU instead of picking by `device`."""
    if save:
        check_writable(save)  # now, not after the training
    if driver:
        gpu, description, note = driver, f"cuda ({driver.description})", None
    else:
        gpu, description, note = open_device(device, double)
    fallback = device == "auto" and driver is None  # a GPU that cannot take the program leaves it to the CPU
    try:
        result = _train(build, gpu, description, iters, data_flag, load, save, double, report, fallback, note)
    finally:
        if gpu is not None:
            gpu.close()
    out: dict[str, Any] = {"device": "cuda" if result.gpu_memory_bytes is not None else "cpu",
                           "losses": result.losses}  # fmt: skip
    if result.test_accuracy is not None:
        out["test_accuracy"] = result.test_accuracy
    out["peak_bytes"] = result.peak_bytes
    out["arena_bytes"] = result.arena_bytes
    out["seconds_per_iter"] = result.seconds_per_iter
    if result.gpu_memory_bytes is not None:
        out["gpu_memory_bytes"] = result.gpu_memory_bytes
        out["gpu_planned_bytes"] = result.gpu_planned_bytes
    return out


def _train(
    build: Build, gpu: Driver | None, description: str, iters: int | None, data_flag: str | None, load: str | None,
    save: str | None, double: bool, report: Callable[[str], None] | None, fallback: bool = False,
    note: str | None = None,
) -> TrainResult:  # fmt: skip
    program = build.program
    cfg = program.train
    kind, args = parse_data_flag(data_flag) if data_flag else (cfg.data[0], dict(cfg.data[1]))
    x = next(d for d in program.graph.inputs if d.kind == "input")
    y = next((d for d in program.graph.inputs if d.kind == "label"), None)
    if y is None:  # e.g. `deepdsl import --no-loss`: its loss compares with an input, which no data source holds
        raise DslProgramError(f"network {program.graph.name} has no `label`: deepdsl run trains on class ids")
    assert y.classes is not None
    data = load_data(kind, args, x.value.type.shape[1:], y.classes, build.seed)
    trainer = Trainer(build, data, np.float64 if double else np.float32)
    if gpu is not None:
        try:
            trainer.use_gpu(gpu)
        except DslProgramError as err:
            if not fallback:
                raise
            description, note = CPU, _not_used(err.message)
    if load:
        trainer.load(load)
    n = iters if iters is not None else cfg.iterations
    batch = x.value.type.shape[0]
    if report:
        if note:
            report(note)
        source = _data_label(kind, args, build.seed)
        report(f"device: {description}  network {program.graph.name}  batch {batch}  data {source}")

    def on_step(k: int, loss: float, seconds: float) -> None:
        if report:
            done = (k + 1) * BAR // max(n, 1)
            rate = batch / seconds if seconds > 0 else math.inf
            report(f"[{'#' * done}{'.' * (BAR - done)}] iter {k + 1:>{len(str(n))}}/{n}  loss {loss:.4f}  "
                   f"{rate:,.0f} images/s")  # fmt: skip

    def on_test(k: int, accuracy: float) -> None:
        if report:
            report(f"test accuracy after {k + 1} iterations: {100 * accuracy:.2f}% ({cfg.test_iterations} batches)")

    result = trainer.train(n, on_step, on_test)
    if save:
        trainer.save(save)
    if report:
        if result.test_accuracy is not None:
            report(f"test accuracy: {100 * result.test_accuracy:.2f}%")
        if save:
            report(f"saved: {save}")
    return result
