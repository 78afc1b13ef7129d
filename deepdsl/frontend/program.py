"""The front end's result: the forward graph plus what the user wrote around it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from deepdsl.errors import DslWarning, Span
from deepdsl.ir.graph import Graph
from deepdsl.ir.types import TensorType


@dataclass(frozen=True)
class LayerRow:
    """One layer application, for `deepdsl check --layers`."""

    name: str
    kind: str
    output: TensorType
    parameters: int
    span: Span


@dataclass(frozen=True)
class Schedule:
    """The learning rate of iteration k = 0, 1, ... (the step counter, `opt/iteration`: a resumed run continues its
    schedule), per iteration. `constant(value)`; `step`: base(k) · gamma^(k div every); `cosine`: min + (base(k) -
    min) · (1 + cos(π·k/total)) / 2 for k < total, then min; `warmup`: base(0) · (k+1)/steps for k < steps, then
    base(k - steps) (PyTorch's LinearLR then the base schedule from its own start, as SequentialLR runs them).
    Every step in float64, the same in the Java runtime's Schedule.java; the step takes it rounded to float32."""

    kind: str  # constant, step, cosine, warmup
    base: Schedule | None = None  # the schedule this one modifies (None: constant)
    value: float = 0.0  # constant
    every: int = 1  # step
    gamma: float = 0.1  # step
    total: int = 1  # cosine
    min: float = 0.0  # cosine
    steps: int = 1  # warmup

    def at(self, k: int) -> float:
        if self.kind == "constant":
            return self.value
        assert self.base is not None
        if self.kind == "step":
            return self.base.at(k) * power(self.gamma, k // self.every)
        if self.kind == "cosine":
            if k >= self.total:
                return self.min
            return self.min + (self.base.at(k) - self.min) * (1.0 + math.cos(math.pi * k / self.total)) / 2.0
        assert self.kind == "warmup", self.kind
        if k < self.steps:
            return self.base.at(0) * (k + 1) / self.steps
        return self.base.at(k - self.steps)


def power(x: float, n: int) -> float:
    """x^n by squaring, in float64: the same multiplications, in the same order, as the Java runtime's."""
    result = 1.0
    while n > 0:
        if n & 1:
            result *= x
        x *= x
        n >>= 1
    return result


@dataclass(frozen=True)
class TrainConfig:
    data: tuple[str, tuple[tuple[str, Any], ...]]  # ("mnist", (("dir", "data/mnist"),))
    optimizer: tuple[str, tuple[tuple[str, Any], ...]]
    iterations: int = 100
    test_every: int = 0
    test_iterations: int = 10
    seed: int = 1
    shuffle: bool = False
    save: str | None = None  # the parameter file written at the end (and every `save_every` iterations)
    save_every: int = 0  # 0: only at the end
    lr: Schedule | None = None  # a learning-rate schedule, replacing the optimizer's constant lr
    # data augmentation (the train block's `augment`, frontend/train.py): its steps in order, ("crop", (("size", (h,
    # w)), ("pad", (ph, pw)))), ("flip", (("p", 0.5),)), ("normalize", (("mean", (...)), ("std", (...)))), and the
    # image input [N, C, H, W] they apply to
    augment: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = ()
    augment_input: str | None = None
    # [optim] parameters (or prefixes of their names up to a `.`: layers) that do not train, and learning-rate
    # multipliers (name, multiplier) of the parameters a name matches (the last match wins)
    freeze: tuple[str, ...] = ()
    lr_mult: tuple[tuple[str, float], ...] = ()
    precision: str = "fp32"  # fp32 | tf32 | bf16 (ir/types.py PRECISIONS); --precision overrides it
    # data-parallel training: every batch norm's statistics over the global batch (passes/data_parallel.py);
    # --sync-batch-norm / --no-sync-batch-norm override it; where the key is written (for its diagnostics)
    sync_batch_norm: bool = False
    sync_batch_norm_at: Span | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Program:
    graph: Graph
    layers: tuple[LayerRow, ...]
    train: TrainConfig
    warnings: tuple[DslWarning, ...] = ()


# ---- [optim] what the train block's freeze and lr_mult name -----------------------------------------------------


def param_matches(param: str, name: str) -> bool:
    """Whether `name` of the train block's freeze / lr_mult names parameter `param`: the parameter itself, or a
    prefix of its name that ends where a `.` follows (a layer `cv1`, a scope `model.block1`)."""
    return param == name or param.startswith(name + ".")


def param_matches_any(param: str, names: tuple[str, ...]) -> bool:
    return any(param_matches(param, n) for n in names)
