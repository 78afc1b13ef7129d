"""What the Java emitter knows while it writes a class: the fields it has named, the kernels and settings it has
written, the names of the step being written. The emitter's modules (steps, calls, kernel_section, settings) are
functions of this state; `emitter.emit_java` makes one and hands it through."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from deepdsl.backends.java.names import Namer, abbreviated, identifier
from deepdsl.frontend.javanames import reserved_class_names
from deepdsl.ir import Value

NETWORK_MEMBERS = (
    "arena", "at", "view", "copy", "scalar", "input", "label", "param", "state", "optimizerState", "train", "test",
    "tokens",
    "save", "load", "main", "iteration", "trainStep", "inferStep", "SETTINGS", "WORKSPACE_LIMIT", "Buf", "Kernel",
    "Network", "Parallel", "Settings", "settings", "workspaceLimit", "run", "useData", "reportTo", "dev",
    "inputs", "labels", "use", "device", "constant", "evalStep", "batchByName", "isLabel", "field", "batchSize",
    "tested", "rate", "rateBuffer", "learningRate", "learningRateInput", "Schedule", "predict", "setting", "set",
    "get", "batch",
    "lossTerms", "lossTermNames", "termValues", "labelIgnoring",
)  # fmt: skip


@dataclass
class Emitter:
    # a field named after a class the program names (an input `System`, a layer `Math`) would hide that class
    namer: Namer = field(default_factory=lambda: Namer((*NETWORK_MEMBERS, *reserved_class_names())))
    # the kernels' names (Name.cu's functions, the strings of their constants): not identifiers of the class, so
    # that which kernels a step has printed cannot move the names of the next step's fields (`add` -> `add_2`)
    kernel_names: Namer = field(default_factory=lambda: Namer(NETWORK_MEMBERS))
    globals: dict[str, str] = field(default_factory=dict)  # inputs, parameters, state -> field name
    temps: Namer = field(default_factory=Namer)  # the results of the step being written
    in_state: dict[str, str] = field(default_factory=dict)  # results written over the tensor they update
    written_over: dict[str, str] = field(default_factory=dict)  # in-place results -> the temporary they overwrite
    counters: frozenset[str] = frozenset()  # the step's iteration-counter input (a long, not a Buf)
    kernels: dict[tuple, str] = field(default_factory=dict)  # (body, out, shapes, ctypes) -> constant name
    kernel_text: list[str] = field(default_factory=list)  # the constants with their Java bodies
    cuda_text: list[str] = field(default_factory=list)  # the CUDA kernels, under the same names
    settings: dict[tuple[str, float], str] = field(default_factory=dict)  # (setting, default) -> field name
    temp_names: dict[str, str] = field(default_factory=dict)  # a step's value -> the name it would like
    gradient: set[str] = field(default_factory=set)  # the backward pass's results in the step being written
    roles: dict[str, str] = field(default_factory=dict)  # a field -> what it is to an update (w, opt, state)
    helpers: dict[tuple, str] = field(default_factory=dict)  # (kernel, argument pattern, settings) -> its method
    helper_text: list[str] = field(default_factory=list)
    seen: dict[tuple, set[tuple[float, ...]]] = field(default_factory=dict)  # kernel template -> numbers met
    lifted: dict[tuple, tuple[int, ...]] = field(default_factory=dict)  # template -> its numbers taken as arguments
    extra: list[str] = field(default_factory=list)  # the number arguments of the kernel kernel() gave last
    views: dict[int, tuple[int, ...]] = field(default_factory=dict)  # its tensors passed as views (-1: the output)
    forms: dict[tuple, set[int]] = field(default_factory=dict)  # rank-4 kernel text -> ranks met (unit_axes.py)
    shared: frozenset[tuple] = frozenset()  # the texts met at both ranks: rank-2 statements use them padded
    number_fields: dict[str, str] = field(default_factory=dict)  # their fields -> the constant they hold
    prefix: str = ""  # what every parameter's name starts with (ResNet-50's `model.`), left out of names
    short: dict[str, str] = field(default_factory=dict)  # repeated blocks' short names (`bottleneck` -> `b`)
    # where each value of the plan being written lives (kernel_section.places), for which pointers of its
    # element-wise kernels may be __restrict__
    places: dict[str, tuple[str, str, int, int]] = field(default_factory=dict)
    # each multi-tensor launch's call -> the bytes of the table the CUDA device writes for it (Settings.tables)
    tables: dict[str, int] = field(default_factory=dict)
    # each planned workspace a library call takes (conv2d_backward_filter's partial sums): statement -> its field
    workspaces: dict[str, str] = field(default_factory=dict)
    # what both passes of emit_java compute alike, done once: each distinct kernel printed, each plan's groups
    memo: dict[tuple, Any] = field(default_factory=dict)

    def declare(self, v: Value, prefix: str = "") -> str:
        """The field of a tensor of the program, named after it without the `prefix` every parameter's name
        shares (ResNet-50's `model.`); an optimizer state without its `opt/`: `cv1_W_momentum`."""
        name = abbreviated(v.name.removeprefix("opt/").removeprefix(prefix), self.short)
        self.globals[v.name] = self.namer(v.name, identifier(name))
        return self.globals[v.name]

    def tensor(self, v: Value) -> str:
        if v.name in self.in_state:
            return self.globals[self.in_state[v.name]]
        while v.name in self.written_over:  # a result written over its input in place is that input's field
            v = Value(self.written_over[v.name], v.type)
        return self.globals.get(v.name) or self.temps(v.name, self.temp_names.get(v.name))
