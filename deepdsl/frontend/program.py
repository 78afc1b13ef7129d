"""The front end's result: the forward graph plus what the user wrote around it."""

from __future__ import annotations

from dataclasses import dataclass
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
class TrainConfig:
    data: tuple[str, tuple[tuple[str, Any], ...]]  # ("mnist", (("dir", "data/mnist"),))
    optimizer: tuple[str, tuple[tuple[str, Any], ...]]
    iterations: int = 100
    test_every: int = 0
    test_iterations: int = 10
    seed: int = 1
    shuffle: bool = False
    save: str | None = None


@dataclass(frozen=True)
class Program:
    graph: Graph
    layers: tuple[LayerRow, ...]
    train: TrainConfig
    warnings: tuple[DslWarning, ...] = ()
