"""The Java backend: the planned training and inference programs as one readable Java class.

`emit_java(program, train_plan, infer_plan)` gives the text of `public final class NAME extends Network`:
parameters, model state and optimizer state as named fields; one inner class per plan (`Training`, and
`Inference` for the test program, whose first part `predict()` is what inferStep runs) holding the plan's layout
table (every temporary at its arena offset, by name) and its statements as straight-line calls (each run of
calls under a comment naming its layer and source line); and one generated kernel per distinct index expression.
Every operation of a step is a call of the device `dev`
(runtime Device.java), so the CPU and the CUDA device run the same list of calls: an op without an index form
is a library call (`dev.conv2d(...)`, `dev.matmul(...)`) with the parameters its registry entry's `java` field
declares (output, inputs, then attributes); an op with one (or with a CUDA index form, the shape ops) is a
generated kernel, `dev.run(K, out, in...)`, where `K` is a constant holding the kernel's name in Name.cu (its
CUDA source) and its Java body; a fused epilogue is a kernel run over the op's output right after its call. The
runtime (deepdsl/runtime/*.java) holds everything that does not depend on the network: training loop, data,
parameter files, devices.

This module writes the class around the steps (its header, settings and fields); the modules beside it write
the rest: steps.py the step methods and the plans' inner classes with their layout tables, calls.py the device
calls, kernel_section.py the kernels (Java and CUDA), settings.py the run-time settings, roles.py the names of
temporaries, state.py what the writer knows while it writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from typing import Any

from deepdsl.backends.escape import java_comment, java_string
from deepdsl.backends.java.constants import constant_name, varying
from deepdsl.backends.java.kernels import float_literal
from deepdsl.backends.java.names import block_abbreviations, class_name
from deepdsl.backends.java.roles import gradient_values
from deepdsl.backends.java.state import Emitter
from deepdsl.backends.java.steps import plan_classes
from deepdsl.frontend.program import Program, Schedule
from deepdsl.ir import Graph
from deepdsl.ir.analysis import classified_label, regression_target
from deepdsl.memory import Plan
from deepdsl.memory.report import total_peak
from deepdsl.version import __version__

DEFAULT_WORKSPACE_LIMIT = 1 << 30
# the editing contract, as the class's header, docs/java.md and the README state it (tests/backends/test_java_truth.py)
CONTRACT = "deepdsl compile rewrites {file}: the network is the source; a copy of the class may be edited by hand"


def runtime_sources() -> dict[str, str]:
    """The runtime's Java sources shipped in the package: file name -> text."""
    folder = resources.files("deepdsl") / "runtime"
    return {f.name: f.read_text() for f in sorted(folder.iterdir(), key=lambda f: f.name) if f.name.endswith(".java")}


def _state_of(p: Any, shapes: dict[str, tuple[int, ...]]) -> tuple[str, str] | None:
    """(parameter, what) of an optimizer state named `opt/<parameter>/<what>` and shaped as that parameter
    (`shapes`: each parameter's)."""
    head, _, rest = p.value.name.partition("/")
    param, _, what = rest.rpartition("/")
    if head != "opt" or param not in shapes or shapes[param] != p.value.type.shape or not what:
        return None
    return param, what


def _constant_name(g: Graph, p: Any) -> str:
    """constants.constant_name of a constant of the training step `g`: the backward pass's seed is the scalar 1
    that only the gradient reads."""
    value, shape = float(p.init.args[0]), p.value.type.shape
    readers = {s.out.name for s in g.stmts if any(v.name == p.value.name for v in s.inputs)}
    seed = "loss" in dict(g.outputs) and value == 1.0 and not shape and bool(readers)
    return constant_name(value, shape, seed and readers <= gradient_values(g, "loss"))


def _common_prefix(names: list[str]) -> str:
    """`model.` where every name is `model.SOMETHING`, else ""."""
    firsts = {n.split(".", 1)[0] for n in names}
    return f"{firsts.pop()}." if len(firsts) == 1 and all("." in n for n in names) else ""


def _init_text(p: Any) -> str:
    i = p.init
    args = [f"{a:g}" for a in i.args]
    if i.kind in ("he", "xavier"):
        args += [f"fan_in={i.fan_in}", f"fan_out={i.fan_out}"]
    return f"{i.kind}({', '.join(args)})"


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


def _data_flag(data: tuple[str, tuple[tuple[Any, Any], ...]]) -> str:
    kind, args = data
    values = [v for _, v in args]
    return f"{kind}:{values[0]}" if values else kind


def _data_settings(program: Program) -> list[str]:
    """The Settings lines of the train block's augmentation and of a regression's target (the test's mean absolute
    error): `.augment(new Augment("x").crop(4, 4).flip(0.5).normalize(...))`, `.regression("t")`."""
    cfg = program.train
    lines = []
    if cfg.augment and cfg.augment_input is not None:
        calls = []
        for kind, args in cfg.augment:
            a = dict(args)
            if kind == "crop":
                calls.append(f".crop({a['pad'][0]}, {a['pad'][1]})")
            elif kind == "flip":
                calls.append(f".flip({float(a['p'])!r})")
            else:
                mean, std = (", ".join(float_literal(v) for v in a[k]) for k in ("mean", "std"))
                calls.append(f".normalize(new float[] {{{mean}}}, new float[] {{{std}}})")
        augment = f"new deepdsl.runtime.Augment({java_string(cfg.augment_input)}){''.join(calls)}"
        lines.append(f"          .augment({augment})")
    target = regression_target(program.graph)
    if target is not None:
        lines.append(f"          .regression({java_string(target)})")
    return lines


@dataclass(frozen=True)
class Emitted:
    java: str  # Name.java
    kernels: str  # the CUDA kernels of its Kernel constants, for Name.cu (after the library)


def emit_java(
    program: Program, train: Plan, infer: Plan | None, test: Plan, workspace_limit: int = DEFAULT_WORKSPACE_LIMIT,
    deterministic: bool = False,
) -> Emitted:  # fmt: skip
    """The Java class of `program` from the plans of its training, (when it has `predict`) inference and test
    programs, and the CUDA source of its kernels. Written twice where kernels differ only in numbers: the first
    time finds them, the second takes those numbers as arguments (java/constants.py)."""
    first = Emitter()
    emitted = _emit(first, program, train, infer, test, workspace_limit, deterministic)
    lifted = varying(first.seen)
    shared = frozenset(form for form, ranks in first.forms.items() if len(ranks) > 1)  # java/unit_axes.py
    if not lifted and not shared:
        return emitted
    again = Emitter(lifted=lifted, shared=shared, memo=first.memo)  # the kernels printed once serve both
    return _emit(again, program, train, infer, test, workspace_limit, deterministic)


def _emit(e: Emitter, program: Program, train: Plan, infer: Plan | None, test: Plan, workspace_limit: int,
          deterministic: bool = False) -> Emitted:  # fmt: skip
    g: Graph = train.graph
    cls = class_name(g.name)
    cfg = program.train
    declarations = ["  // the batch: inputs and labels (labels as exact float values)"]
    for d in g.inputs:
        if d.kind in ("step", "offset"):  # longs the calls pass: iteration, sampleOffset()
            continue
        shape = ", ".join(map(str, d.value.type.shape))
        named = java_string(d.value.name)
        call = {"label": f"label({named}, {d.classes}, {shape})", "input": f"input({named}, {shape})",
                "lr": "learningRateInput()", "scale": "dataParallelScale()"}[d.kind]  # fmt: skip
        if d.kind == "label" and d.ignore is not None:  # its data may hold a loss's ignore_index
            call = f"labelIgnoring({named}, {d.classes}, {d.ignore}L, {shape})"
        if d.kind == "input" and d.classes is not None:  # token ids (`input t : [N, T] int vocab V`)
            call = f"tokens({named}, {d.classes}, {shape})"
        declarations.append(f"  private final Buf {e.declare(d.value)} = {call};")
    prefix = e.prefix = _common_prefix([p.value.name for p in g.params if p.kind in ("param", "state")])
    e.short = block_abbreviations([s.layer for s in g.stmts if s.layer] + [p.value.name for p in g.params])
    titles = {"param": "parameters", "state": "model state", "opt": "optimizer state",
              "const": "constants (loop-invariant values hoisted out of the step)"}  # fmt: skip
    kinds = [p.kind for p in g.params]
    switches = sum(a != b for a, b in zip(kinds, kinds[1:]) if {a, b} == {"param", "state"})
    if switches > 1:  # interleaved (batch norm's statistics beside its weights): one heading, each call says which
        titles["param"] = titles["state"] = "parameters and model state (state(...): not trained), in file order"
    previous = None
    param_shapes = {q.value.name: q.value.type.shape for q in g.params if q.kind == "param"}
    for p in g.params:  # in the graph's order, which is the parameter file's
        if titles[p.kind] != previous:
            declarations.append(f"  // {titles[p.kind]}")
            previous = titles[p.kind]
        shape = ", ".join(map(str, p.value.type.shape))
        shape = ", " + shape if shape else ""
        of = _state_of(p, param_shapes)
        if p.kind == "opt" and of is not None and of[0] in e.globals:  # opt/<param>/<what>, shaped as its param
            call = f"optimizerState({e.globals[of[0]]}, {java_string(of[1])})"
        elif p.kind == "opt":
            call = f"optimizerState({java_string(p.value.name)}{shape})"
        elif p.kind == "const":  # named for what it is (`dloss`), in the class and at run time
            name = e.namer(p.value.name, _constant_name(g, p))
            call = f"constant({java_string(name)}, {float_literal(p.init.args[0])}{shape})"
        else:
            kind = "param" if p.kind == "param" else "state"
            call = f"{kind}({java_string(p.value.name)}, {java_string(_init_text(p))}{shape})"
        declarations.append(f"  private final Buf {e.declare(p.value, prefix)} = {call};")
        e.roles[e.globals[p.value.name]] = {"param": "w", "state": "state", "opt": "opt"}.get(p.kind, "x")
    classes, steps = plan_classes(e, cls, train, infer, test)
    if e.number_fields:
        declarations.append("  // numbers kernels take as arguments (one kernel serves every value)")
        declarations += [f"  private final Buf {f} = {call};" for f, call in e.number_fields.items()]
    if e.settings:
        flags = ", ".join(f"--{n.replace('_', '-')}" for n, _ in e.settings)
        declarations = [
            f"  // settings: what the update kernels read each step (a flag overrides one: {flags})",
            *(
                f"  private final Buf {f} = setting({java_string(n)}, {float_literal(v)});"
                for (n, v), f in e.settings.items()
            ),  # fmt: skip
            *declarations,
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
        f"          .workspaceLimit({workspace_limit}L)  // the scratch a convolution may take (--workspace-limit)",
    ]
    if e.tables:  # the CUDA device writes them once, in one allocation beside the arena (memcheck: gpu_table_bytes)
        settings.append(f"          .tables({sum(e.tables.values())}L)  // the multi-tensor launches' tables")
    if deterministic:  # cuDNN's heuristic convolution algorithms, not the fastest found (compile --deterministic)
        settings.append("          .deterministic(true)")
    if cfg.precision != "fp32":  # tf32: the CUDA device's libraries in TF32 math (--precision overrides it)
        settings.append(f"          .precision({java_string(cfg.precision)})")
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
    settings += _data_settings(program)
    code, comment = settings[-1].split("  //", 1) if "  //" in settings[-1] else (settings[-1], None)
    settings[-1] = f"{code};" + (f"  //{comment}" if comment is not None else "")
    legend = ""
    if e.short:  # the short names of repeated blocks, as the layer comments above the calls spell them out
        pairs = ", ".join(f"{v} = {k}" for k, v in sorted(e.short.items(), key=lambda kv: kv[1]))
        legend = f"\n * Repeated blocks are named short in fields: {java_comment(pairs)}."
    contract = CONTRACT.format(file=f"{cls}.java").split("; ", 1)
    header = [
        f"// Generated by deepdsl {__version__} from {source or 'a .ddsl file'}. {contract[0]};",
        f'// {contract[1]} (docs/java.md, "Changing the generated program").',
        "",
        "import deepdsl.runtime.Buf;",
        "import deepdsl.runtime.Kernel;",
        "import deepdsl.runtime.MultiKernel;",
        "import deepdsl.runtime.Network;",
        "import deepdsl.runtime.ReductionPass;",
        "import deepdsl.runtime.Schedule;",
        "",
        "/**",
        f" * {name}: training and inference of {source or 'the network'}, every temporary at a fixed offset of one",
        f" * arena of {arena:,} bytes. Run it with {{@code java {cls} --help}}. Each step is one list of calls of",
        " * the device {@code dev}: the CPU device runs each kernel's Java body below, the CUDA device its",
        f" * kernel of {cls}.cu.{legend}",
        " */",
        f"public final class {cls} extends Network {{",
        *settings,
        "",
        *declarations,
    ]
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
    methods = ["", *("\n\n".join(steps + e.helper_text)).split("\n")]
    methods += [line for c in classes for line in ("", *c)]
    constants = [
        "",
        f"  // ---- kernels: each a constant holding its Java body, and a kernel of {cls}.cu of the same name ----",
    ]
    kernels = ["", *"\n\n".join(e.kernel_text).split("\n")]
    lines = header + body + methods + constants + kernels + ["}", ""]
    text = "\n".join(lines)
    if not e.kernel_text:
        text = text.replace("import deepdsl.runtime.Kernel;\n", "")
    # what the class uses, from its code lines alone: a comment or a string may hold any name of the source (a hostile
    # file name "ReductionPass." must not change the imports)
    code = [line.lstrip() for line in text.split("\n") if not line.lstrip().startswith(("//", "*", "/*"))]
    if not any(line.startswith("static final ReductionPass ") for line in code):
        text = text.replace("import deepdsl.runtime.ReductionPass;\n", "")
    if cfg.lr is None:
        text = text.replace("import deepdsl.runtime.Schedule;\n", "")
    if not any(line.startswith("new MultiKernel(") for line in code):  # an inference-only program (ir/launches.py)
        text = text.replace("import deepdsl.runtime.MultiKernel;\n", "")
    return Emitted(text, "\n\n".join(e.cuda_text) + "\n")
