"""The Java backend: the planned training and inference programs as one readable Java class.

`emit_java(program, train_plan, infer_plan)` gives the text of `public final class NAME extends Network`:
parameters, model state and optimizer state as named fields, `trainStep` and `inferStep` as the
straight-line plan (each call under a comment holding the IR statement and its source line), and one
generated loop kernel per distinct index expression. Ops without an index form are calls into the
runtime (`CpuOps`, or `Workspace` where the kernel picks a variant by its scratch need) that their registry
entry's `java` field declares: output, inputs, then attributes in alphabetical order; ops with one are
generated kernels, and a fused epilogue is a kernel run over the host's output right after its call. The
runtime (deepdsl/runtime/*.java) holds everything that does not depend on the network: training loop, data,
parameter files, devices.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from deepdsl.backends.cuda.kernels import CudaProgram
from deepdsl.backends.cuda.kernels import program as cuda_program
from deepdsl.backends.escape import java_comment, java_string
from deepdsl.backends.java.kernels import flat_form, float_literal, is_flat, java_group_kernel, java_kernel
from deepdsl.backends.java.names import Namer, camel, class_name
from deepdsl.backends.java.tables import cuda_tables
from deepdsl.backends.java.text import long_literal, method
from deepdsl.frontend.program import Program, Schedule
from deepdsl.ir import REGISTRY, Graph, Stmt, Value
from deepdsl.ir.analysis import classified_label, index_form, output_indices
from deepdsl.ir.groups import group_form
from deepdsl.ir.indexexpr import format_ie, renumber
from deepdsl.ir.printer import format_stmt
from deepdsl.ir.registry import JavaCall
from deepdsl.memory import Plan
from deepdsl.memory.groups import planned_groups
from deepdsl.memory.report import total_peak
from deepdsl.version import __version__

MAX_STATEMENTS_PER_METHOD = 200  # keeps every step method far below Java's 64 KB of bytecode
DEFAULT_WORKSPACE_LIMIT = 1 << 30
NETWORK_MEMBERS = (
    "arena", "at", "view", "copy", "scalar", "input", "label", "param", "state", "optimizerState", "train", "test",
    "save", "load", "main", "iteration", "trainStep", "inferStep", "SETTINGS", "WORKSPACE_LIMIT", "Buf", "CpuOps",
    "Network", "Parallel", "Settings", "Workspace", "settings", "workspaceLimit", "run", "useData", "reportTo",
    "Kernels", "dim", "tensor", "inputs", "labels", "counter", "use", "device", "constant", "evalStep",
    "batchByName", "isLabel", "field", "batchSize", "tested", "rate", "rateBuffer", "learningRate",
    "learningRateInput", "Schedule", "predict",
)  # fmt: skip


def runtime_sources() -> dict[str, str]:
    """The runtime's Java sources shipped in the package: file name -> text."""
    folder = resources.files("deepdsl") / "runtime"
    return {f.name: f.read_text() for f in sorted(folder.iterdir(), key=lambda f: f.name) if f.name.endswith(".java")}


def java_call(op: str) -> JavaCall:
    """The runtime method of a library op (one without an index form), from its registry entry."""
    call = REGISTRY[op].java
    if call is None:
        raise ValueError(f"op {op} has neither an index form nor a Java call in its registry entry")
    return call


def _java_value(value: Any, java_type: str) -> str:
    if java_type == "boolean":
        return "true" if value else "false"
    if java_type == "int[]":
        return "new int[] {" + ", ".join(str(int(v)) for v in value) + "}"
    if java_type == "float":
        return float_literal(value)
    if java_type == "long":
        return f"{int(value)}L"
    if java_type == "String":
        return java_string(str(value))
    return str(int(value))


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name).lower()


def library_arguments(s: Stmt) -> list[str]:
    """The attribute arguments of the runtime call of `s`, by the parameters its registry entry declares."""
    attrs = {k: v for k, v in s.attrs if k not in ("epilogue", "inplace")}
    call = java_call(s.op)
    args = []
    for java_type, param in call.attributes:
        key = param if param in attrs else _snake(param)
        if key == "step":  # the step counter, an input of the statement, is passed as a long
            args.append("iteration")
        elif key == "limit":
            args.append("workspaceLimit")
        elif key in attrs:
            args.append(_java_value(attrs[key], java_type))
        elif java_type == "boolean":
            args.append("false")  # an absent flag (matmul's transpose_a) is off
        else:
            raise ValueError(f"{call.cls}.{s.op} takes '{param}', which statement %{s.out.name} does not have")
    return args


@dataclass
class _Emitter:
    namer: Namer = field(default_factory=lambda: Namer(NETWORK_MEMBERS))
    globals: dict[str, str] = field(default_factory=dict)  # inputs, parameters, state -> field name
    temps: Namer = field(default_factory=Namer)  # the results of the step being written
    in_state: dict[str, str] = field(default_factory=dict)  # results written over the tensor they update
    counters: frozenset[str] = frozenset()  # the step's iteration-counter input (a long, not a Buf)
    kernels: dict[tuple, str] = field(default_factory=dict)  # (body, out, shapes) -> method name
    kernel_text: list[str] = field(default_factory=list)

    def declare(self, v: Value) -> str:
        self.globals[v.name] = self.namer(v.name)
        return self.globals[v.name]

    def tensor(self, v: Value) -> str:
        if v.name in self.in_state:
            return self.globals[self.in_state[v.name]]
        return self.globals.get(v.name) or self.temps(v.name)

    def kernel(self, op: str, value: str, body: Any, out: tuple, shapes: tuple, doc: str) -> str:
        """The name of the kernel computing `body` over `out`; a flat (element-wise) one serves every shape."""
        flat = is_flat(body, out, shapes)
        key = (flat_form(body), len(shapes)) if flat else (body, out, shapes)
        if key not in self.kernels:
            preferred = camel(op) if flat else camel(op) + re.sub(r"[^A-Za-z0-9_]", "_", value)
            name = self.namer(f"kernel:{op}:{value}", preferred)
            self.kernels[key] = name
            self.kernel_text.append(java_kernel(name, body, out, shapes, doc))
        return self.kernels[key]

    def group(self, stmts: tuple[Stmt, ...], temps: list[str]) -> str:
        """The call of the one loop computing the statements of a group into `temps`."""
        form = group_form(stmts)
        shared, bodies, readers = form.inputs, form.bodies, form.held
        key = ("group", tuple(flat_form(b) for b in bodies), tuple(tuple(sorted(h.items())) for h in readers),
               len(shared))  # fmt: skip
        if key not in self.kernels:
            ops = [st.a["ops"][0] if st.op == "fused" and st.a.get("ops") else st.op for st in stmts]
            name = self.namer(f"kernel:group:{stmts[0].out.name}", camel("_".join(ops)))
            self.kernels[key] = name
            n = len(shared)
            names = (*(f"in{k}" for k in range(n)), *(f"out{m}" for m in range(len(bodies))))
            texts = []
            for j, (b, h) in enumerate(zip(bodies, readers)):  # a held result reads as the output it was written to
                readable = renumber(b, {k: k for k in range(n)} | {k: n + m for k, m in h.items()})
                texts.append(f"out{j}[e] = {format_ie(flat_form(readable), names)}")
            doc = "; ".join(texts)
            self.kernel_text.append(java_group_kernel(name, tuple(bodies), tuple(readers), len(shared), doc))
        return f"{self.kernels[key]}({', '.join([*temps, *(self.tensor(v) for v in shared)])});"

    def statement(self, s: Stmt, temp: str) -> list[str]:
        """The Java lines of one statement (its result Buf is `temp`, already bound)."""
        op = REGISTRY[s.op]
        args = [self.tensor(v) for v in s.inputs if v.name not in self.counters]  # the step counter: a long
        if op.view:
            return []
        form = index_form(s)
        if form is not None:
            body, out = form.body, form.out
            shapes = tuple(v.type.shape for v in s.inputs)
            what = s.op
            if s.op == "fused" and s.a.get("ops"):
                what = "_".join(s.a["ops"])
            elif s.op == "indexed" and s.layer:  # a tensor function (or its gradient): named after it
                what = re.sub(r"\d+$", "", s.layer.rsplit(".", 1)[-1])
            name = self.kernel(what, s.out.name, body, out, shapes, _meaning(body, out, len(shapes)))
            return [f"{name}({', '.join([temp, *args])});"]
        arity = op.arity if op.arity is not None else len(s.inputs)
        own = args[:arity] if "epilogue" in s.a else args
        library = java_call(s.op)
        tensors = [f"new Buf[] {{{', '.join(own)}}}"] if library.inputs_as_array else own
        call = f"{library.cls}.{s.op}({', '.join([temp, *tensors, *library_arguments(s)])});"
        lines = [call]
        if "epilogue" in s.a:
            extras = s.inputs[arity:]
            out = output_indices(s.out.type)
            shapes = (s.out.type.shape, *(v.type.shape for v in extras))
            epilogue = s.a["epilogue"]
            name = self.kernel(
                f"{s.op}_epilogue", s.out.name, epilogue, out, shapes, _meaning(epilogue, out, len(shapes))
            )
            lines.append(f"{name}({', '.join([temp, temp, *args[arity:]])});")
        return lines

    def step(self, kind: str, p: Plan, result: str) -> tuple[list[str], list[str]]:
        """The methods of one program (`trainStep` or `inferStep`) and the fields they share between parts."""
        g = p.graph
        self.temps = Namer(tuple(self.namer.taken))
        self.in_state = dict(getattr(p, "in_state", {}))
        self.counters = frozenset(d.value.name for d in g.inputs if d.kind == "step")
        # a group of element-wise statements (ir/groups.py) is one item: one loop computes all its results
        items: list[tuple[str, Any]] = [
            ("stmt", group[0]) if len(group) == 1 else ("group", group) for group in planned_groups(p)
        ]
        items += [("update", (name, v)) for name, v in g.updates]
        parts = _split(items)
        made_in: dict[str, int] = {}
        used_in: dict[str, set[int]] = {}
        for k, part in enumerate(parts):
            for what, item in part:
                if what == "update":
                    used_in.setdefault(item[1].name, set()).add(k)
                    continue
                for st in item if what == "group" else (item,):
                    made_in[st.out.name] = k
                    for v in st.inputs:
                        used_in.setdefault(v.name, set()).add(k)
        result_value = g.output(result)
        used_in.setdefault(result_value.name, set()).add(-1)  # read by the method that calls the parts
        shared = [n for n, k in made_in.items() if used_in.get(n, {k}) != {k} and n not in self.in_state]
        fields = []
        if len(parts) > 1:
            for n in shared:  # a field of the class: its name must be unique in the whole class
                self.temps(n, self.namer(f"{kind}:{n}", self.temps.preferred(n)))
                fields.append(f"  private Buf {self.temps(n)};")
        methods = []
        for k, part in enumerate(parts):
            body: list[str] = []
            for what, item in part:
                if what == "update":
                    name, v = item
                    param = self.globals[name]
                    if self.tensor(v) != param:
                        body.append(f"copy({self.tensor(v)}, {param});")
                    continue
                if what == "group":
                    temps = []
                    for st in item:
                        temps.append(self.tensor(st.out))
                        body.append(f"// {java_comment(format_stmt(st))}")
                        if st.out.name not in self.in_state:
                            declare = "" if st.out.name in shared and len(parts) > 1 else "Buf "
                            shape = ", ".join(map(str, st.out.type.shape))
                            offset = long_literal(p.buffer_of(st.out.name).offset)
                            body.append(f"{declare}{temps[-1]} = at({offset}{', ' + shape if shape else ''});")
                    body.append(self.group(item, temps))
                    continue
                s = item
                t = self.tensor(s.out)
                if s.out.name in self.in_state:  # the plan writes this update straight into its tensor
                    body.append(f"// {java_comment(format_stmt(s))}")
                    body += self.statement(s, t)
                    continue
                declare = "" if s.out.name in shared and len(parts) > 1 else "Buf "
                shape = ", ".join(map(str, s.out.type.shape))
                body.append(f"// {java_comment(format_stmt(s))}")
                if REGISTRY[s.op].view:
                    body.append(f"{declare}{t} = view({self.tensor(s.inputs[0])}{', ' + shape if shape else ''});")
                    continue
                offset = long_literal(p.buffer_of(s.out.name).offset)
                body.append(f"{declare}{t} = at({offset}{', ' + shape if shape else ''});")
                body += self.statement(s, t)
            methods.append((k, body))
        out = []
        returns = "float" if result == "loss" else "Buf"
        tail = f"scalar({self.tensor(result_value)})" if result == "loss" else self.tensor(result_value)
        doc = {
            "train": "One training step on the batch in the inputs: forward, backward, update; returns the loss.",
            "infer": "The network's prediction for the batch in the inputs.",
            "eval": "The loss on the batch in the inputs in inference semantics (the test phase); no update.",
        }[kind]
        name = f"{kind}Step"
        if len(parts) == 1:
            out.append(method(f"/** {doc} */", f"protected {returns} {name}()", methods[0][1] + [f"return {tail};"]))
        else:
            calls = [f"{name}{k + 1}();" for k in range(len(parts))]
            out.append(method(f"/** {doc} */", f"protected {returns} {name}()", calls + [f"return {tail};"]))
            for k, body in methods:
                layers = _layers(parts[k])
                doc = f"/** Part {k + 1} of {name}: {java_comment(layers)}. */"
                out.append(method(doc, f"private void {name}{k + 1}()", body))
        return out, fields


def _meaning(body: Any, out: tuple, inputs: int) -> str:
    index = ", ".join(v for v, _ in out)
    return f"out[{index}] = {format_ie(body, tuple(f'in{k}' for k in range(inputs)))}"


def _layers(part: list[tuple[str, Any]]) -> str:
    names: list[str] = []
    for what, item in part:
        first = item[0] if what == "group" else item
        top = _block(first.layer) if what != "update" and first.layer else ""
        if top and top not in names:
            names.append(top)
    if not names:
        return "the updates"
    return ", ".join(names) if len(names) <= 3 else f"{names[0]} ... {names[-1]}"


def _split(items: list[tuple[str, Any]]) -> list[list[tuple[str, Any]]]:
    """Consecutive pieces of at most MAX_STATEMENTS_PER_METHOD items, cut where the block (`model.stage2`) changes."""
    if len(items) <= MAX_STATEMENTS_PER_METHOD:
        return [items]
    parts: list[list[tuple[str, Any]]] = [[]]
    for k, item in enumerate(items):
        part = parts[-1]
        if len(part) >= MAX_STATEMENTS_PER_METHOD or (
            len(part) >= MAX_STATEMENTS_PER_METHOD // 2 and _top(item) != _top(items[k - 1])
        ):
            parts.append([])
        parts[-1].append(item)
    return parts


def _top(item: tuple[str, Any]) -> str:
    what, x = item
    if what == "update":
        return "update"
    return _block((x[0] if what == "group" else x).layer)


def _block(layer: str) -> str:
    """The block a layer belongs to: its path's first two parts (`model.stage2`)."""
    return ".".join(layer.split(".")[:2])


def _init_text(p: Any) -> str:
    i = p.init
    args = [f"{a:g}" for a in i.args]
    if i.kind in ("he", "xavier"):
        args += [f"fan_in={i.fan_in}", f"fan_out={i.fan_out}"]
    return f"{i.kind}({', '.join(args)})"


def _data_flag(data: tuple[str, tuple[tuple[Any, Any], ...]]) -> str:
    kind, args = data
    values = [v for _, v in args]
    return f"{kind}:{values[0]}" if values else kind


def _schedule(s: Schedule) -> str:
    """The runtime's Schedule of a train block's schedule (frontend/program.py), as a Java expression."""
    if s.kind == "constant":
        return f"Schedule.constant({_double(s.value)})"
    assert s.base is not None
    base = _schedule(s.base)
    if s.kind == "step":
        return f"Schedule.step({base}, {s.every}L, {_double(s.gamma)})"
    if s.kind == "cosine":
        return f"Schedule.cosine({base}, {s.total}L, {_double(s.min)})"
    return f"Schedule.warmup({base}, {s.steps}L)"


def _double(x: float) -> str:
    return repr(float(x))  # a Java double literal that reads back to the same double


def emit_java(
    program: Program, train: Plan, infer: Plan | None, test: Plan, workspace_limit: int = DEFAULT_WORKSPACE_LIMIT,
    cuda: tuple[CudaProgram, CudaProgram | None, CudaProgram] | None = None,
) -> str:  # fmt: skip
    """The Java class of `program` from the plans of its training, (when it has `predict`) inference and test
    programs, with `cuda` (their CUDA programs, kernels.program(train), kernels.program(infer, "infer__") and
    kernels.program(test, "eval__")) as the tables the CUDA device runs."""
    e = _Emitter()
    g: Graph = train.graph
    cls = class_name(g.name)
    cfg = program.train
    declarations = ["  // the batch: inputs and labels (labels as exact float values)"]
    for d in g.inputs:
        if d.kind == "step":
            continue
        shape = ", ".join(map(str, d.value.type.shape))
        named = java_string(d.value.name)
        call = {"label": f"label({named}, {d.classes}, {shape})", "input": f"input({named}, {shape})",
                "lr": "learningRateInput()"}[d.kind]  # fmt: skip
        declarations.append(f"  private final Buf {e.declare(d.value)} = {call};")
    titles = {"param": "parameters", "state": "model state", "opt": "optimizer state",
              "const": "constants (loop-invariant values hoisted out of the step)"}  # fmt: skip
    previous = None
    for p in g.params:  # in the graph's order, which is the parameter file's
        if p.kind != previous:
            declarations.append(f"  // {titles[p.kind]}")
            previous = p.kind
        shape = ", ".join(map(str, p.value.type.shape))
        shape = ", " + shape if shape else ""
        if p.kind == "opt":
            call = f"optimizerState({java_string(p.value.name)}{shape})"
        elif p.kind == "const":
            call = f"constant({java_string(p.value.name)}, {float_literal(p.init.args[0])}{shape})"
        else:
            kind = "param" if p.kind == "param" else "state"
            call = f"{kind}({java_string(p.value.name)}, {java_string(_init_text(p))}{shape})"
        declarations.append(f"  private final Buf {e.declare(p.value)} = {call};")
    train_methods, train_fields = e.step("train", train, "loss")
    infer_methods, infer_fields = e.step("infer", infer, "predict") if infer is not None else ([], [])
    eval_methods, eval_fields = e.step("eval", test, "loss")
    infer_methods += eval_methods
    infer_fields += eval_fields
    if infer is None:
        infer_methods = [
            method("/** The network defines no `predict`. */", "protected Buf inferStep()", ["return null;"])
        ]
    arena = max(train.arena_bytes, infer.arena_bytes if infer is not None else 0, test.arena_bytes)
    source = java_comment(program.graph.stmts[0].span.file.rsplit("/", 1)[-1] if program.graph.stmts and
                          program.graph.stmts[0].span else "")  # fmt: skip
    name = java_comment(g.name)
    settings = [
        "  private static final Settings SETTINGS =",
        f"      new Settings({java_string(g.name)})",
        f"          .seed({cfg.seed}L)",
        f"          .data({java_string(_data_flag(cfg.data))}{', true' if cfg.shuffle else ''})",
        f"          .iterations({cfg.iterations})",
        f"          .testing({cfg.test_every}, {cfg.test_iterations})",
        f"          .arena({train.arena_bytes}L, {arena}L)",
        f"          .peak({total_peak(train)}L)",
        "          .workspaceLimit(WORKSPACE_LIMIT)",
        f"          .kernels({cls}::trainKernels, {f'{cls}::inferKernels' if infer is not None else 'null'})",
        f"          .evalKernels({cls}::evalKernels)",
    ]
    if cfg.lr is not None:
        settings.append(f"          .learningRate({_schedule(cfg.lr)})")
    if cfg.save is not None:
        settings.append(f"          .save({java_string(cfg.save)}, {cfg.save_every})")
    if infer is not None:
        reads = ", ".join(java_string(d.value.name) for d in infer.graph.inputs if d.kind == "input")
        integers = "true" if infer.graph.output("predict").type.dtype.value == "i64" else "false"
        settings.append(f"          .predicts({integers}{', ' + reads if reads else ''})")
    label = classified_label(program.graph)
    if label is not None:
        settings.append(f"          .accuracy({java_string(label)})")
    settings[-1] += ";"
    header = [
        f"// Generated by deepdsl {__version__} from {source or 'a .ddsl file'}. Edit the network, not this file.",
        "",
        "import deepdsl.runtime.Buf;",
        "import deepdsl.runtime.CpuOps;",
        "import deepdsl.runtime.Kernels;",
        "import deepdsl.runtime.Network;",
        "import deepdsl.runtime.Parallel;",
        "import deepdsl.runtime.Schedule;",
        "import deepdsl.runtime.Workspace;",
        "",
        "/**",
        f" * {name}: training and inference of {source or 'the network'}, every temporary at a fixed offset of one",
        f" * arena of {arena:,} bytes. Run it with {{@code java {cls} --help}}.",
        " */",
        f"public final class {cls} extends Network {{",
        "  /** Scratch bytes a convolution may take beyond the arena (--workspace-limit overrides it). */",
        f"  public static final long WORKSPACE_LIMIT = {workspace_limit}L;",
        "",
        *settings,
        "",
        *declarations,
    ]
    if train_fields or infer_fields:
        header += ["", "  // results shared between the parts of a step", *train_fields, *infer_fields]
    body = [
        "",
        f"  public {cls}() {{",
        "    super(SETTINGS);",
        "  }",
        "",
        "  public static void main(String[] args) {",
        f"    System.exit(run(args, SETTINGS, {cls}::new));",
        "  }",
    ]
    methods = ["", *("\n\n".join(train_methods + infer_methods)).split("\n")]
    if cuda is None:
        cuda = (cuda_program(train), cuda_program(infer, "infer__") if infer is not None else None,
                cuda_program(test, "eval__"))  # fmt: skip
    tables = cuda_tables("train", train, cuda[0], f"{cls}.cu", e.namer)
    if infer is not None and cuda[1] is not None:
        tables += cuda_tables("infer", infer, cuda[1], f"{cls}.cu", e.namer)
    tables += cuda_tables("eval", test, cuda[2], f"{cls}.cu", e.namer)
    methods += ["", "  // ---- the CUDA device's steps: launches of the kernels in " + f"{cls}.cu ----", ""]
    methods += "\n\n".join(tables).split("\n")
    kernels = ["", "  // ---- kernels: the index expressions of the plan as loops ----", ""]
    kernels += "\n\n".join(e.kernel_text).split("\n")
    uses_parallel = any("Parallel.range" in k for k in e.kernel_text)
    table_text = "\n".join(tables)
    steps = "\n".join(train_methods + infer_methods)
    lines = header + body + methods + kernels + ["}", ""]
    text = "\n".join(lines)
    if not uses_parallel:
        text = text.replace("import deepdsl.runtime.Parallel;\n", "")
    if cfg.lr is None:
        text = text.replace("import deepdsl.runtime.Schedule;\n", "")
    for java_class in ("CpuOps", "Workspace"):
        if f"{java_class}." not in steps:
            text = text.replace(f"import deepdsl.runtime.{java_class};\n", "")
    helpers = ("arena", "counter", "dim", "fed", "rate", "tensor")
    statics = [f"import static deepdsl.runtime.Kernels.{f};" for f in helpers if re.search(rf"\b{f}\(", table_text)]
    return text.replace("import deepdsl.runtime.Buf;\n", "\n".join(statics) + "\n\nimport deepdsl.runtime.Buf;\n", 1)
