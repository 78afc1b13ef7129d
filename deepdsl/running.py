"""`deepdsl run`: pick a device, load data, train, test, save; report progress through a callback."""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from deepdsl.api import Options
from deepdsl.data import load_data, parse_data_flag
from deepdsl.errors import DslProgramError
from deepdsl.frontend.program import Program
from deepdsl.trainer import Trainer

BAR = 24


def pick_device(device: str) -> str:
    """`cpu`, or `cuda` when asked for (or `auto`) and PyCUDA with a GPU is there."""
    if device == "cpu":
        return "cpu"
    has_pycuda = importlib.util.find_spec("pycuda") is not None
    if device == "cuda":
        why = "PyCUDA is not installed (pip install 'deepdsl[gpu]')" if not has_pycuda else (
            "the PyCUDA runner is not part of this version yet"
        )  # fmt: skip
        raise DslProgramError(f"--device cuda is not available: {why}; use --device cpu")
    return "cpu"


def run_training(
    program: Program, iters: int | None = None, data_flag: str | None = None, load: str | None = None,
    save: str | None = None, device: str = "auto", seed: int | None = None, double: bool = False,
    report: Callable[[str], None] | None = None, options: Options | None = None,
) -> dict[str, Any]:  # fmt: skip
    cfg = program.train
    used = pick_device(device)
    kind, args = parse_data_flag(data_flag) if data_flag else (cfg.data[0], dict(cfg.data[1]))
    x = next(d for d in program.graph.inputs if d.kind == "input")
    y = next(d for d in program.graph.inputs if d.kind == "label")
    assert y.classes is not None
    data = load_data(kind, args, x.value.type.shape[1:], y.classes, cfg.seed if seed is None else seed)
    trainer = Trainer(program, data, seed, np.float64 if double else np.float32, options)
    if load:
        trainer.load(load)
    n = iters if iters is not None else cfg.iterations
    batch = x.value.type.shape[0]
    if report:
        report(f"device: {used} (NumPy reference runner)  network {program.graph.name}  batch {batch}  data {kind}")

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
    out: dict[str, Any] = {"device": used, "losses": result.losses}
    if result.test_accuracy is not None:
        out["test_accuracy"] = result.test_accuracy
    out["peak_bytes"] = result.peak_bytes
    out["seconds_per_iter"] = result.seconds_per_iter
    return out
