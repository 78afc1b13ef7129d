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
CUDA source, which this module writes too) and its Java body; a fused epilogue is a kernel run over the op's
output right after its call. The runtime (deepdsl/runtime/*.java) holds everything that does not depend on the
network: training loop, data, parameter files, devices.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from deepdsl.backends.cuda.kernels import group_kernel, ie_kernel
from deepdsl.backends.escape import java_comment, java_string
from deepdsl.backends.java.constants import lift, numbers, varying
from deepdsl.backends.java.kernels import flat_form, float_literal, is_flat, java_group_kernel, java_kernel
from deepdsl.backends.java.names import Namer, abbreviated, block_abbreviations, camel, class_name, identifier
from deepdsl.backends.java.text import long_literal, method
from deepdsl.frontend.program import Program, Schedule
from deepdsl.ir import REGISTRY, Graph, Stmt, Value
from deepdsl.ir.analysis import classified_label, index_form, output_indices
from deepdsl.ir.groups import group_form
from deepdsl.ir.indexexpr import Affine, Apply, Const, Read, Reduce, Var, format_ie, renumber
from deepdsl.ir.registry import JavaCall
from deepdsl.ir.types import DType
from deepdsl.memory import Plan
from deepdsl.memory.groups import planned_groups
from deepdsl.memory.report import total_peak
from deepdsl.version import __version__

# the library calls' attributes written through Network's helpers of the same name: pad(0, 0), stride(1, 1)
NAMED_ARGUMENTS = frozenset({"groups", "pad", "stride", "kernel", "inShape", "wShape", "transposeA", "transposeB"})
MAX_STATEMENTS_PER_METHOD = 200  # keeps every step method far below Java's 64 KB of bytecode
LAYOUT_ROWS = 1000  # temporaries a layout class initialises (about 30 bytes of its constructor each)
DEFAULT_WORKSPACE_LIMIT = 1 << 30
NETWORK_MEMBERS = (
    "arena", "at", "view", "copy", "scalar", "input", "label", "param", "state", "optimizerState", "train", "test",
    "tokens",
    "save", "load", "main", "iteration", "trainStep", "inferStep", "SETTINGS", "WORKSPACE_LIMIT", "Buf", "Kernel",
    "Network", "Parallel", "Settings", "settings", "workspaceLimit", "run", "useData", "reportTo", "dev",
    "inputs", "labels", "use", "device", "constant", "evalStep", "batchByName", "isLabel", "field", "batchSize",
    "tested", "rate", "rateBuffer", "learningRate", "learningRateInput", "Schedule", "predict", "setting", "set",
    "get", "batch",
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


def _state_of(p: Any, g: Graph) -> tuple[str, str] | None:
    """(parameter, what) of an optimizer state named `opt/<parameter>/<what>` and shaped as that parameter."""
    head, _, rest = p.value.name.partition("/")
    param, _, what = rest.rpartition("/")
    shapes = {q.value.name: q.value.type.shape for q in g.params if q.kind == "param"}
    if head != "opt" or param not in shapes or shapes[param] != p.value.type.shape or not what:
        return None
    return param, what


def _epilogue_name(e: Any, rank: int) -> str | None:
    """What an epilogue computes, where it is one of the common ones: `bias_add_relu`, `channel_bias_add` (over
    NCHW), `relu_grad`; else None."""
    zero = Const(0.0)
    if isinstance(e, Apply) and e.fn == "max" and len(e.args) == 2 and e.args[1] == zero:
        inner = _epilogue_name(e.args[0], rank)
        return f"{inner}_relu" if inner else None
    if isinstance(e, Apply) and e.fn == "+" and all(isinstance(a, Read) for a in e.args):
        own, bias = e.args
        if own.input == 0 and len(own.index) == rank and len(bias.index) == 1 and bias.index == own.index[1:2]:
            return "channel_bias_add" if rank == 4 else "bias_add"
    if isinstance(e, Apply) and e.fn == "select" and e.args[2] == zero:
        test = e.args[0]
        if isinstance(test, Apply) and test.fn == ">" and test.args[1] == zero and isinstance(e.args[1], Read):
            return "relu_grad"
    return None


def _common_prefix(names: list[str]) -> str:
    """`model.` where every name is `model.SOMETHING`, else ""."""
    firsts = {n.split(".", 1)[0] for n in names}
    return f"{firsts.pop()}." if len(firsts) == 1 and all("." in n for n in names) else ""


def _role(ops: list[str]) -> str:
    """What a fused statement's result is called: its last op without the words of how it broadcasts
    (`broadcast_channel_add` -> `add`, `pow_scalar` -> `pow`)."""
    last = ops[-1].removeprefix("broadcast_channel_").removesuffix("_scalar")
    return last or ops[-1]


def _without_update(kernel: str) -> str:
    """`RUNNING_UPDATE` -> `RUNNING`: the words of a kernel's name an update method adds `update` to."""
    return "_".join(w for w in kernel.split("_") if w != "UPDATE") or kernel


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name).lower()


def library_arguments(s: Stmt) -> list[str]:
    """The attribute arguments of the runtime call of `s`, by the parameters its registry entry declares."""
    attrs = {k: v for k, v in s.attrs if k not in ("epilogue", "inplace")}
    call = java_call(s.op)
    args = []
    for (java_type, param), key in zip(call.attributes, call.keys):
        if key == "step":  # the step counter, an input of the statement, is passed as a long
            args.append("iteration")
        elif key == "limit":  # the device's workspace limit
            continue
        elif key in attrs and param in NAMED_ARGUMENTS:  # pad(0, 0): Network's helpers name what a number is
            args.append(f"{param}({_java_value(attrs[key], java_type).removeprefix('new int[] {').rstrip('}')})")
        elif key in attrs:
            args.append(_java_value(attrs[key], java_type))
        elif java_type == "boolean":
            args.append(f"{param}(false)" if param in NAMED_ARGUMENTS else "false")  # an absent flag is off
        else:
            raise ValueError(f"{call.cls}.{s.op} takes '{param}', which statement %{s.out.name} does not have")
    return args


# the hyperparameters the update kernels read at run time, as settings of the class: op -> attribute -> setting
# (adam_moment's beta is beta1 for the first moment, beta2 for the second)
SETTINGS: dict[str, dict[str, str]] = {
    "sgd_plain": {"lr": "lr", "weight_decay": "weight_decay"},
    "sgd_momentum": {"momentum": "momentum", "weight_decay": "weight_decay"},
    "sgd_step": {"lr": "lr"},
    "adam_moment": {"beta": "beta"},
    "adam_step": {"lr": "lr", "beta1": "beta1", "beta2": "beta2", "eps": "eps"},
    "clip_scale": {"clip": "clip"},
    # with a schedule the rate is the step's input opt/lr (Network sets it from the schedule before each step)
    "sgd_plain_scheduled": {"weight_decay": "weight_decay"},
    "adam_step_scheduled": {"beta1": "beta1", "beta2": "beta2", "eps": "eps"},
}
MAX_SETTINGS = 16  # Network.java's room for settings
_SENTINEL = float(1 << 20)  # an attribute stands as _SENTINEL + k in a body until the Read of setting k replaces it

_PLACEHOLDER = "dd_kernel_"  # the name a kernel is written under to compare it with the kernels written before


def _ctype(v: Value) -> str:
    return "float" if v.type.dtype is DType.F32 else "long long"


def _constant(method_name: str) -> str:
    """`linearEpilogue10` -> `LINEAR_EPILOGUE10`: the name of a kernel's constant."""
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", method_name).upper()


def _body_lambda(name: str, arity: int) -> str:
    return f"b -> {name}({', '.join(f'b[{k}]' for k in range(arity))})"


@dataclass
class _Emitter:
    namer: Namer = field(default_factory=lambda: Namer(NETWORK_MEMBERS))
    globals: dict[str, str] = field(default_factory=dict)  # inputs, parameters, state -> field name
    temps: Namer = field(default_factory=Namer)  # the results of the step being written
    in_state: dict[str, str] = field(default_factory=dict)  # results written over the tensor they update
    counters: frozenset[str] = frozenset()  # the step's iteration-counter input (a long, not a Buf)
    kernels: dict[tuple, str] = field(default_factory=dict)  # (body, out, shapes, ctypes) -> constant name
    kernel_text: list[str] = field(default_factory=list)  # the Java methods
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
    number_fields: dict[str, str] = field(default_factory=dict)  # their fields -> the constant they hold
    prefix: str = ""  # what every parameter's name starts with (ResNet-50's `model.`), left out of names
    short: dict[str, str] = field(default_factory=dict)  # repeated blocks' short names (`bottleneck` -> `b`)

    def declare(self, v: Value, prefix: str = "") -> str:
        """The field of a tensor of the program, named after it without the `prefix` every parameter's name
        shares (ResNet-50's `model.`); an optimizer state without its `opt/`: `cv1_W_momentum`."""
        name = abbreviated(v.name.removeprefix("opt/").removeprefix(prefix), self.short)
        self.globals[v.name] = self.namer(v.name, identifier(name))
        return self.globals[v.name]

    def tensor(self, v: Value) -> str:
        if v.name in self.in_state:
            return self.globals[self.in_state[v.name]]
        return self.globals.get(v.name) or self.temps(v.name, self.temp_names.get(v.name))

    def with_settings(self, stmts: tuple[Stmt, ...]) -> tuple[tuple[Stmt, ...], list[str]]:
        """`stmts` with each hyperparameter attribute replaced by a sentinel value, and the fields of the settings
        they read, in the order of their sentinels (see `read_settings`)."""
        used: list[str] = []
        out = []
        for st in stmts:
            table = SETTINGS.get(st.op)
            if not table:
                out.append(st)
                continue
            attrs = []
            for k, v in st.attrs:
                if k not in table:
                    attrs.append((k, v))
                    continue
                name = table[k] if table[k] != "beta" else ("beta1" if st.a.get("power", 1) == 1 else "beta2")
                key = (name, float(v))
                if key not in self.settings:
                    if len(self.settings) >= MAX_SETTINGS:
                        raise ValueError(f"more than {MAX_SETTINGS} optimizer settings in one network")
                    self.settings[key] = self.namer(f"setting:{name}:{v}", name)
                if self.settings[key] not in used:
                    used.append(self.settings[key])
                attrs.append((k, _SENTINEL + used.index(self.settings[key])))
            out.append(st.replace(attrs=tuple(attrs)))
        return tuple(out), used

    def _add(self, name: str, java: str, cuda: Any, arity: int, sized: bool, doc: str) -> str:
        """Records kernel `name` (its Java method, its CUDA kernel) and returns the name of its constant."""
        const = self.namer(f"constant:{name}", _constant(name))
        self.cuda_text.append(cuda.text)
        if sized:
            make = f"Kernel.elementwise({java_string(name)}, "
        elif cuda.loop == "block-stride":
            make = f"Kernel.rows({java_string(name)}, {cuda.block[0]}, "
        else:
            make = f"Kernel.shaped({java_string(name)}, "
        line = f"  static final Kernel {const} = {make}{_body_lambda(name, arity)});"
        if len(line) > 120:
            line = f"  static final Kernel {const} =\n      {make}{_body_lambda(name, arity)});"
        doc_line, rest = java.split("\n", 1)  # the constant under the method's comment, above the method
        self.kernel_text.append(f"{doc_line}\n{line}\n{rest}")
        return const

    def kernel(self, op: str, value: str, body: Any, out: tuple, inputs: tuple[Value, ...], doc: str,
               shapes: tuple | None = None, ctypes: tuple[str, ...] | None = None) -> str:  # fmt: skip
        """The constant of the kernel computing `body` over `out`. Its sizes are arguments (the buffers' dims), so
        statements whose kernels read the same but for their sizes share one; so are the numbers in which they
        differ (java/constants.py), the buffers `self.extra` names, which the call passes after the inputs."""
        self.extra = []
        shapes = shapes if shapes is not None else tuple(v.type.shape for v in inputs)
        ctypes = ctypes if ctypes is not None else tuple(_ctype(v) for v in inputs)
        body = canonical_names(body)
        doc = _meaning(body, out, len(shapes))  # with the names the kernel reads (r0, r1, ...)
        values = numbers(body)
        if values:  # the kernel with every number an argument: statements that differ only in numbers share it
            n = len(values)
            template = lift(body, len(shapes), tuple(range(n)))
            every = (*shapes, *((),) * n)
            key = (
                java_kernel(_PLACEHOLDER, template, out, every),
                ie_kernel(_PLACEHOLDER, template, out, every, (*ctypes, *("float",) * n), generic=True).text,
            )
            self.seen.setdefault(key, set()).add(tuple(values))
            which = self.lifted.get(key, ())
            if which:
                body = lift(body, len(shapes), which)
                shapes = (*shapes, *((),) * len(which))
                ctypes = (*ctypes, *("float",) * len(which))
                doc = _meaning(body, out, len(shapes))
                self.extra = [self.number(values[k]) for k in which]
        flat = is_flat(body, out, shapes)
        java = java_kernel(_PLACEHOLDER, body, out, shapes)
        cuda = ie_kernel(_PLACEHOLDER, body, out, shapes, ctypes, generic=True)
        key = (java, cuda.text, cuda.loop)
        if key not in self.kernels:
            name = self.namer(f"kernel:{op}:{value}", camel(op))
            cuda = ie_kernel(name, body, out, shapes, ctypes, (doc,), generic=True)
            java = java_kernel(name, body, out, shapes, doc)
            self.kernels[key] = self._add(name, java, cuda, 1 + len(shapes), flat, doc)
        return self.kernels[key]

    def number(self, value: float) -> str:
        """The field of a constant buffer holding `value`, a number a kernel takes as an argument: `k0_1`."""
        text = float_literal(value).removesuffix("f")
        spelt = text.replace(".", "_").replace("e-", "e_minus_").replace("-", "minus_")  # 1e-05 -> 1e_minus_05
        field_name = self.namer(f"number:{text}", identifier(f"k{spelt}"))
        self.number_fields.setdefault(field_name, f"constant({java_string(field_name)}, {float_literal(value)})")
        self.roles[field_name] = "k"
        return field_name

    def group(self, stmts: tuple[Stmt, ...], temps: list[str]) -> str:
        """The call of the one loop computing the statements of a group into `temps`."""
        read_as, used = self.with_settings(stmts)
        form = group_form(read_as)
        shared, readers = form.inputs, form.held
        bodies = tuple(read_settings(b, len(shared)) for b in form.bodies)
        ctypes = (*(_ctype(v) for v in shared), *("float",) * len(used))
        key = ("group", tuple(flat_form(b) for b in bodies), tuple(tuple(sorted(h.items())) for h in readers),
               len(shared), ctypes)  # fmt: skip
        if key not in self.kernels:
            ops = [st.a["ops"][0] if st.op == "fused" and st.a.get("ops") else st.op for st in stmts]
            name = self.namer(f"kernel:group:{stmts[0].out.name}", camel("_".join(ops)))
            n = len(shared) + len(used)
            names = (*(f"in{k}" for k in range(n)), *(f"out{m}" for m in range(len(bodies))))
            texts = []
            for j, (b, h) in enumerate(zip(bodies, readers)):  # a held result reads as the output it was written to
                readable = renumber(b, {k: k for k in range(n)} | {k: n + m for k, m in h.items()})
                texts.append(f"out{j}[e] = {format_ie(flat_form(readable), names)}")
            doc = "; ".join(texts)
            java = java_group_kernel(name, tuple(bodies), tuple(readers), n, doc)
            shapes = (*(v.type.shape for v in shared), *((),) * len(used))
            numel = stmts[0].out.type.numel
            cuda = group_kernel(name, tuple(bodies), numel, shapes, ctypes, tuple(readers), (doc,), generic=True)
            self.kernels[key] = self._add(name, java, cuda, len(bodies) + n, True, doc)
        ins = [self.tensor(v) for v in shared]
        return self.run(self.kernels[key], temps, ins, used, all(st.out.name in self.in_state for st in stmts))

    def run(self, kernel: str, outs: list[str], ins: list[str], settings: list[str], update: bool) -> str:
        """`dev.run(kernel, outs..., ins..., settings...)`; for an update written over its tensors, the call of the
        class's method for that kernel, which takes each tensor once and reads the settings itself:
        `sgdMomentumStep(cv1_W_momentum, cv1_W, cv1_dW)`."""
        if not update:
            return f"dev.run({', '.join([kernel, *outs, *ins, *settings])});"
        tensors = list(dict.fromkeys([*outs, *ins]))
        key = (kernel, tuple(tensors.index(t) for t in [*outs, *ins]), tuple(settings))
        if key not in self.helpers:
            names: list[str] = []
            for t in tensors:
                role = self.roles.get(t, "x")
                names.append(role if role not in names else f"{role}{sum(n.startswith(role) for n in names) + 1}")
            helper = self.namer(f"helper:{key}", camel(f"update_{_snake(_without_update(kernel))}"))
            args = [names[i] for i in key[1]]
            doc = f"/** {kernel} over the tensors it updates ({', '.join(names)}), with the settings it reads. */"
            params = ", ".join(f"Buf {n}" for n in names)
            self.helpers[key] = helper
            self.helper_text.append(
                method(doc, f"private void {helper}({params})", [f"dev.run({', '.join([kernel, *args, *settings])});"])
            )
        return f"{self.helpers[key]}({', '.join(tensors)});"

    def statement(self, s: Stmt, temp: str) -> list[str]:
        """The Java lines of one statement (its result Buf is `temp`, already bound)."""
        op = REGISTRY[s.op]
        args = [self.tensor(v) for v in s.inputs if v.name not in self.counters]  # the step counter: a long
        if op.view:
            return []
        (read_as,), used = self.with_settings((s,))
        own = index_form(read_as)
        form = (own.body, own.out) if own is not None else op.cuda_form(s) if op.cuda_form is not None else None
        arity = op.arity if op.arity is not None else len(s.inputs)
        if form is not None and "epilogue" not in s.a or own is not None:
            body, out = form
            body = read_settings(body, len(s.inputs))
            what = s.op
            if s.op == "fused" and s.a.get("ops"):
                what = "_".join(s.a["ops"])
            elif s.op == "indexed" and s.layer:  # a tensor function (or its gradient): named after it
                what = re.sub(r"\d+$", "", s.layer.rsplit(".", 1)[-1])
            shapes = (*(v.type.shape for v in s.inputs), *((),) * len(used))
            ctypes = (*(_ctype(v) for v in s.inputs), *("float",) * len(used))
            doc = _meaning(body, out, len(shapes))
            k = self.kernel(what, s.out.name, body, out, (), doc, shapes, ctypes)
            return [self.run(k, [temp], [*args, *self.extra], used, s.out.name in self.in_state)]
        own_args = args[:arity] if "epilogue" in s.a else args
        if form is not None:  # a shape op with an epilogue: its kernel, then the epilogue's
            body, out = form
            k = self.kernel(s.op, s.out.name, body, out, s.inputs[:arity], _meaning(body, out, arity))
            lines = [f"dev.run({', '.join([k, temp, *own_args, *self.extra])});"]
        else:
            lines = [f"dev.{java_call(s.op).device}({', '.join([temp, *own_args, *library_arguments(s)])});"]
        if "epilogue" in s.a:
            extras = s.inputs[arity:]
            out = output_indices(s.out.type)
            shapes = (s.out.type.shape, *(v.type.shape for v in extras))
            ctypes = ("float", *(_ctype(v) for v in extras))
            epilogue = s.a["epilogue"]
            what = _epilogue_name(epilogue, len(out)) or f"{s.op}_epilogue"
            k = self.kernel(what, s.out.name, epilogue, out, (), _meaning(epilogue, out, len(shapes)), shapes, ctypes)
            lines.append(f"dev.run({', '.join([k, temp, temp, *args[arity:], *self.extra])});")
        return lines

    def items(self, p: Plan) -> list[tuple[str, Any]]:
        """The plan's work in order: statements, groups of statements one loop computes (ir/groups.py), then the
        copies of the updates not computed in place."""
        g = p.graph
        items: list[tuple[str, Any]] = [
            ("stmt", group[0]) if len(group) == 1 else ("group", group) for group in planned_groups(p)
        ]
        return items + [("update", (name, v)) for name, v in g.updates if self.in_state.get(v.name) != name]

    def program(self, title: str, doc: str, p: Plan, kind: str, result: str | None,
                segments: list[tuple[str, str, list[tuple[str, Any]]]]) -> list[str]:  # fmt: skip
        """The inner class `title` that runs plan `p`: its temporaries first, each at its offset of the arena (the
        plan's layout table), then one method per segment (name, doc, items), a long one split into parts named
        after the blocks they cover."""
        g = p.graph
        self.temps = Namer(tuple(self.namer.taken))
        self.temp_names = temp_names(g, result, self.prefix, self.short)
        self.gradient = gradient_values(g, result)
        layout = []
        self.in_state = dict(p.in_state)
        for group in planned_groups(p):
            for s in group:
                if s.out.name in self.in_state:
                    continue
                t = self.tensor(s.out)
                if s.out.name in self.gradient:
                    self.roles[t] = "grad"
                shape = ", ".join(map(str, s.out.type.shape))
                if REGISTRY[s.op].view:
                    layout.append(f"final Buf {t} = view({self.tensor(s.inputs[0])}{', ' + shape if shape else ''});")
                else:
                    offset = long_literal(p.buffer_of(s.out.name).offset)
                    layout.append(f"final Buf {t} = at({offset}{', ' + shape if shape else ''});")
        methods = []
        for name, mdoc, items in segments:
            parts = _split(items)
            if len(parts) == 1:
                methods.append(method(f"/** {mdoc} */", f"void {name}()", self.calls(parts[0])))
                continue
            names = [self.temps(f"{name}:part{k}", _part_name(name, part, self.gradient))
                     for k, part in enumerate(parts)]  # fmt: skip
            methods.append(method(f"/** {mdoc} */", f"void {name}()", [f"{n}();" for n in names]))
            for k, part in enumerate(parts):
                pdoc = f"/** Part {k + 1} of {name}: {java_comment(_layers(part))}. */"
                methods.append(method(pdoc, f"private void {names[k]}()", self.calls(part)))
        head = f"    // the layout: each temporary of {java_comment(g.name)}'s {kind} at its byte offset of the arena"
        # a class's field initialisers are one constructor, which Java limits to 64 KB of bytecode: a long table is
        # continued in classes the step's class extends, each under LAYOUT_ROWS rows
        chunks = [layout[k : k + LAYOUT_ROWS] for k in range(0, len(layout), LAYOUT_ROWS)] or [[]]
        lines = []
        for k, rows in enumerate(chunks[:-1]):
            parent = f" extends {title}Layout{k}" if k else ""
            lines += [f"  /** The layout of {title}, rows {k * LAYOUT_ROWS + 1} to {k * LAYOUT_ROWS + len(rows)}. */",
                      f"  private class {title}Layout{k + 1}{parent} {{", *([head] if not k else []),
                      *(f"    {line}" for line in rows), "  }", ""]  # fmt: skip
        parent = f" extends {title}Layout{len(chunks) - 1}" if len(chunks) > 1 else ""
        lines += [f"  /** {doc} */", f"  private final class {title}{parent} {{", *([head] if len(chunks) == 1 else []),
                  *(f"    {line}" for line in chunks[-1])]  # fmt: skip
        for m in methods:
            lines += ["", *(f"  {line}" if line else "" for line in m.split("\n"))]
        return [*lines, "  }"]

    def calls(self, part: list[tuple[str, Any]]) -> list[str]:
        """The device calls of a part of a step, each run of calls under a comment saying where they come from."""
        body: list[str] = []
        last = [""]

        def comment(st: Stmt) -> None:
            here = _where(st, self.in_state, self.prefix)
            if here == _UPDATES:  # an optimizer's update names itself (updateSgdMomentumSgdStep(fc1_W, ...))
                return
            if here != last[0]:
                body.append(f"// {java_comment(here)}")
                last[0] = here

        for what, item in part:
            if what == "update":
                name, v = item
                param = self.globals[name]
                if self.tensor(v) != param:
                    body.append(f"dev.copy({self.tensor(v)}, {param});")
                continue
            if what == "group":
                temps = []
                for st in item:
                    temps.append(self.tensor(st.out))
                    comment(st)
                body.append(self.group(item, temps))
                continue
            if not REGISTRY[item.op].view:  # a view is a row of the layout table, not a call
                comment(item)
                body += self.statement(item, self.tensor(item.out))
        return body


# what a statement's result is, by its op: in the forward pass, and as part of the gradient
_FORWARD_ROLES = {"conv2d": "out", "linear": "out", "matmul": "out", "batch_matmul": "out", "max_pool2d": "out",
                  "avg_pool2d": "out", "global_avg_pool": "out", "lrn": "out", "softmax": "out", "log_softmax": "out",
                  "concat": "out", "softmax_cross_entropy": "loss", "cross_entropy": "loss", "mse": "loss",
                  "reshape": "out"}  # fmt: skip
_BACKWARD_ROLES = {"conv2d_backward_filter": "dW", "conv2d_backward_data": "dx", "channel_sum": "db",
                   "max_pool2d_backward": "dx", "avg_pool2d_backward": "dx", "global_avg_pool_backward": "dx",
                   "lrn_backward": "dx", "softmax_backward": "dx", "log_softmax_backward": "dx",
                   "softmax_cross_entropy_backward": "dscores", "cross_entropy_backward": "dp", "reshape": "dx",
                   "sum_axes": "db"}  # fmt: skip


def _layer_part(layer: str, prefix: str = "", short: dict[str, str] | None = None) -> str:
    """The part of a layer path that names a temporary: `model.stage2.block1.conv1` -> `stage2_block1_conv1`,
    without the prefix the parameters' names share (`model.max_pool1` -> `max_pool1`) and with repeated blocks
    written short (`stage2.bottleneck1.conv_bn1.bn` -> `s2_b1_cb1_bn`, names.block_abbreviations)."""
    parts = [p for p in abbreviated(layer.removeprefix(prefix), short or {}).split(".") if p]
    return "_".join(parts[1:] if len(parts) >= 3 and not prefix else parts)


def _ancestors(g: Graph, values: list[str]) -> set[str]:
    producer = {s.out.name: s for s in g.stmts}
    found: set[str] = set()
    todo = list(values)
    while todo:
        name = todo.pop()
        if name in found or name not in producer:
            continue
        found.add(name)
        todo += [v.name for v in producer[name].inputs]
    return found


def forward_values(g: Graph, result: str | None) -> set[str]:
    """The results `result` depends on (the forward pass of a training step); every result without one."""
    return _ancestors(g, [g.output(result).name]) if result is not None else {s.out.name for s in g.stmts}


def gradient_values(g: Graph, result: str | None) -> set[str]:
    """The results of a training step's backward pass: what the parameters' updates need beyond the forward pass."""
    if result is None:
        return set()
    params = {p.value.name for p in g.params if p.kind == "param"}
    return _ancestors(g, [v.name for name, v in g.updates if name in params]) - forward_values(g, result)


def temp_names(g: Graph, result: str | None, prefix: str = "", short: dict[str, str] | None = None) -> dict[str, str]:
    """The name each result of a step would like, by its layer and its role there: `cv1_out` (the forward
    result), `cv1_dW`, `cv1_db`, `fc1_dx` (gradients), `bn1_channel_mean` (another op of the layer). With `result`
    (the training step's loss), the statements the loss does not depend on are the gradient's."""
    gradient = gradient_values(g, result)
    names = {}
    for s in g.stmts:
        backward = s.out.name in gradient
        fused = s.op == "fused" and bool(s.a.get("ops"))
        what = _role(list(s.a["ops"])) if fused else s.op
        if backward:  # noqa: SIM108
            role = _BACKWARD_ROLES.get(s.op, "d_" + what)
            if s.op == "matmul":
                role = "dW" if s.a.get("transpose_a") else "dx"
        else:  # a fused forward result is its layer's output (`relu1_out`)
            role = "out" if fused else _FORWARD_ROLES.get(s.op, what)
        where = _layer_part(s.layer, prefix, short)
        names[s.out.name] = identifier(f"{where}_{role}" if where else role)
    return names


def canonical_names(e: Any) -> Any:
    """`e` with its reductions' variables renamed r0, r1, ... in the order they appear (the IR numbers them
    per statement), so that two statements' kernels read the same when they compute the same."""
    names: dict[str, str] = {}

    def affine(a: Affine) -> Affine:
        return Affine(tuple((names.get(v, v), c) for v, c in a.terms), a.const)

    def go(x: Any) -> Any:
        if isinstance(x, Reduce):
            for v, _ in x.vars:
                names.setdefault(v, f"r{len(names)}")
            return Reduce(x.kind, tuple((names[v], n) for v, n in x.vars), go(x.body))
        if isinstance(x, Apply):
            return Apply(x.fn, tuple(go(a) for a in x.args))
        if isinstance(x, Read):
            return Read(x.input, tuple(affine(a) for a in x.index))
        if isinstance(x, Var):
            return Var(names.get(x.name, x.name))
        return x

    return go(e)


def read_settings(e: Any, first: int) -> Any:
    """`e` with each setting's sentinel (Emitter.with_settings) read from input `first + k`, a scalar; `1 - beta`
    (Adam's moments) too."""
    if isinstance(e, Const):
        k = e.value - _SENTINEL
        if k == int(k) and 0 <= k < MAX_SETTINGS:
            return Read(first + int(k), ())
        k = 1 - e.value - _SENTINEL
        if k == int(k) and 0 <= k < MAX_SETTINGS:
            return Apply("-", (Const(1.0), Read(first + int(k), ())))
        return e
    if isinstance(e, Apply):
        return Apply(e.fn, tuple(read_settings(a, first) for a in e.args))
    if isinstance(e, Reduce):
        return Reduce(e.kind, e.vars, read_settings(e.body, first))
    return e


def _where(s: Stmt, in_state: dict[str, str], prefix: str = "") -> str:
    """Where a statement comes from: its layer (without the parameters' common prefix) and source position (`cv1,
    lenet.ddsl:13:13`), an optimizer's update, else its op."""
    if s.layer or s.span:
        at = f"{s.span.file.rsplit('/', 1)[-1]}:{s.span.line}:{s.span.col}" if s.span else ""
        return ", ".join(x for x in (s.layer.removeprefix(prefix), at) if x)
    if s.out.name in in_state:
        return _UPDATES
    return s.op


_UPDATES = "the optimizer's updates"


def _meaning(body: Any, out: tuple, inputs: int) -> str:
    index = ", ".join(v for v, _ in out)
    return f"out[{index}] = {format_ie(body, tuple(f'in{k}' for k in range(inputs)))}"


def _part_name(kind: str, part: list[tuple[str, Any]], gradient: set[str]) -> str:
    """A part's method, after the blocks it covers and, in a training step, its pass: `forwardStemToStage2`,
    `backwardStage3`, `updates`; `predictStage3` in a segment `predict`."""
    blocks: list[str] = []
    stmts = [st for what, item in part if what != "update" for st in (item if what == "group" else (item,))]
    for st in stmts:
        top = _block(st.layer).split(".")[-1] if st.layer else ""
        if top and top not in blocks:
            blocks.append(top)
    if not blocks:
        return "updates"
    backward = any(st.out.name in gradient for st in stmts)
    forward = any(st.out.name not in gradient for st in stmts)
    where = blocks[0] if len(blocks) == 1 else f"{blocks[0]}_to_{blocks[-1]}"
    if kind != "step":
        return camel(f"{kind}_{where}")
    passes = "" if backward == forward else "backward_" if backward else "forward_"
    return camel(f"{passes}{where}")


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


def _steps(e: _Emitter, cls: str, train: Plan, infer: Plan | None, test: Plan) -> tuple[list[list[str]], list[str]]:
    """The inner classes that run the plans, and the step methods of the class that call them. The test program
    (evalStep) computes `predict` too: where its statements that `predict` needs come first, inferStep runs them
    alone (its plan is then the test plan's beginning), else inferStep runs the inference plan of its own."""
    names = Namer((cls,))
    training, inference, testing = (names(n) for n in ("Training", "Inference", "Testing"))

    def instance(title: str) -> str:  # the field holding the inner class's instance
        return title[:1].lower() + title[1:]

    e.in_state = dict(train.in_state)
    e.counters = frozenset(d.value.name for d in train.graph.inputs if d.kind == "step")
    doc = "The training step: its temporaries and its calls."
    step_doc = "Forward, backward, update."
    classes = [e.program(training, doc, train, "training step", "loss", [("step", step_doc, e.items(train))])]
    field_lines = [f"private {training} {instance(training)};"]
    placed = [f"{instance(training)} = new {training}();"]
    train_loss = f"{instance(training)}.{e.tensor(train.graph.output('loss'))}"
    steps = [
        method("/** One training step on the batch in the inputs; returns the loss. */", "protected float trainStep()",
               [f"{instance(training)}.step();", f"return dev.scalar({train_loss});"])
    ]  # fmt: skip
    e.in_state = dict(test.in_state)
    e.counters = frozenset(d.value.name for d in test.graph.inputs if d.kind == "step")
    items = e.items(test)
    cut = _predict_first(test, items) if infer is not None else None
    if cut is not None:
        doc = "The test program (inference semantics): the prediction, then the loss."
        segments = [("predict", "The prediction (inferStep runs this alone).", items[:cut]),
                    ("loss", "The loss of the prediction.", items[cut:])]  # fmt: skip
        classes.append(e.program(inference, doc, test, "test program", None, segments))
        run = instance(inference)
        predict_calls = [f"{run}.predict();"]
        eval_calls = [f"{run}.predict();", f"{run}.loss();"]
        loss = f"{run}.{e.tensor(test.graph.output('loss'))}"
        predict = f"{run}.{e.tensor(test.graph.output('predict'))}"
    else:
        doc = "The test program (inference semantics): the loss."
        classes.append(e.program(testing, doc, test, "test program", None, [("loss", doc, items)]))
        run = instance(testing)
        eval_calls = [f"{run}.loss();"]
        loss = f"{run}.{e.tensor(test.graph.output('loss'))}"
        if infer is not None:
            e.in_state = dict(infer.in_state)
            doc = "The inference program: the prediction."
            classes.append(e.program(inference, doc, infer, "inference program", None,
                                     [("predict", doc, e.items(infer))]))  # fmt: skip
            predict_calls = [f"{instance(inference)}.predict();"]
            predict = f"{instance(inference)}.{e.tensor(infer.graph.output('predict'))}"
    for c in (inference, testing):
        if any(f"private final class {c} " in line for k in classes for line in k):
            field_lines.append(f"private {c} {instance(c)};")
            placed.append(f"{instance(c)} = new {c}();")
    steps.append(method("/** The loss on the batch in the inputs in inference semantics (the test phase). */",
                        "protected float evalStep()", [*eval_calls, f"return dev.scalar({loss});"]))  # fmt: skip
    if infer is None:
        steps.append(method("/** The network defines no `predict`. */", "protected Buf inferStep()", ["return null;"]))
    else:
        steps.append(method("/** The network's prediction for the batch in the inputs. */",
                            "protected Buf inferStep()", [*predict_calls, f"return dev.read({predict});"]))  # fmt: skip
    hook = method("/** The steps' temporaries, placed in the arena of the device that took the network. */",
                  "@Override\n  protected void placeTemporaries()", placed)  # fmt: skip
    return classes, ["\n".join(f"  {line}" for line in field_lines), hook, *steps]


def _predict_first(p: Plan, items: list[tuple[str, Any]]) -> int | None:
    """Where the statements `predict` needs end in `items` when none of the others comes before; else None."""
    needed = _ancestors(p.graph, [p.graph.output("predict").name])
    marks = []
    for what, item in items:
        stmts = item if what == "group" else (item,) if what == "stmt" else ()
        marks.append(any(st.out.name in needed for st in stmts) if stmts else False)
    if True not in marks:
        return None
    cut = len(marks) - marks[::-1].index(True)
    return cut if all(marks[:cut]) or all(m or items[k][0] == "stmt" and REGISTRY[items[k][1].op].view
                                          for k, m in enumerate(marks[:cut])) else None  # fmt: skip


@dataclass(frozen=True)
class Emitted:
    java: str  # Name.java
    kernels: str  # the CUDA kernels of its Kernel constants, for Name.cu (after the library)


def emit_java(
    program: Program, train: Plan, infer: Plan | None, test: Plan, workspace_limit: int = DEFAULT_WORKSPACE_LIMIT
) -> Emitted:
    """The Java class of `program` from the plans of its training, (when it has `predict`) inference and test
    programs, and the CUDA source of its kernels. Written twice where kernels differ only in numbers: the first
    time finds them, the second takes those numbers as arguments (java/constants.py)."""
    first = _Emitter()
    emitted = _emit(first, program, train, infer, test, workspace_limit)
    lifted = varying(first.seen)
    return _emit(_Emitter(lifted=lifted), program, train, infer, test, workspace_limit) if lifted else emitted


def _emit(e: _Emitter, program: Program, train: Plan, infer: Plan | None, test: Plan, workspace_limit: int) -> Emitted:
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
    for p in g.params:  # in the graph's order, which is the parameter file's
        if titles[p.kind] != previous:
            declarations.append(f"  // {titles[p.kind]}")
            previous = titles[p.kind]
        shape = ", ".join(map(str, p.value.type.shape))
        shape = ", " + shape if shape else ""
        of = _state_of(p, g)
        if p.kind == "opt" and of is not None and of[0] in e.globals:  # opt/<param>/<what>, shaped as its param
            call = f"optimizerState({e.globals[of[0]]}, {java_string(of[1])})"
        elif p.kind == "opt":
            call = f"optimizerState({java_string(p.value.name)}{shape})"
        elif p.kind == "const":
            call = f"constant({java_string(p.value.name)}, {float_literal(p.init.args[0])}{shape})"
        else:
            kind = "param" if p.kind == "param" else "state"
            call = f"{kind}({java_string(p.value.name)}, {java_string(_init_text(p))}{shape})"
        declarations.append(f"  private final Buf {e.declare(p.value, prefix)} = {call};")
        e.roles[e.globals[p.value.name]] = {"param": "w", "state": "state", "opt": "opt"}.get(p.kind, "x")
    classes, steps = _steps(e, cls, train, infer, test)
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
        "          .workspaceLimit(WORKSPACE_LIMIT)",
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
    legend = ""
    if e.short:  # the short names of repeated blocks, as the layer comments above the calls spell them out
        pairs = ", ".join(f"{v} = {k}" for k, v in sorted(e.short.items(), key=lambda kv: kv[1]))
        legend = f"\n * Repeated blocks are named short in fields: {java_comment(pairs)}."
    header = [
        f"// Generated by deepdsl {__version__} from {source or 'a .ddsl file'}. Edit the network, not this file.",
        "",
        "import deepdsl.runtime.Buf;",
        "import deepdsl.runtime.Kernel;",
        "import deepdsl.runtime.Network;",
        "import deepdsl.runtime.Parallel;",
        "import deepdsl.runtime.Schedule;",
        "",
        "/**",
        f" * {name}: training and inference of {source or 'the network'}, every temporary at a fixed offset of one",
        f" * arena of {arena:,} bytes. Run it with {{@code java {cls} --help}}. Each step is one list of calls of",
        " * the device {@code dev}: the CPU device runs each kernel's Java method below, the CUDA device its",
        f" * kernel of {cls}.cu.{legend}",
        " */",
        f"public final class {cls} extends Network {{",
        "  /** Scratch bytes a convolution may take beyond the arena (--workspace-limit overrides it). */",
        f"  public static final long WORKSPACE_LIMIT = {workspace_limit}L;",
        "",
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
        f"  // ---- kernels: each a constant, its Java method and a kernel of {cls}.cu of the same name ----",
    ]
    kernels = ["", *"\n\n".join(e.kernel_text).split("\n")]
    lines = header + body + methods + constants + kernels + ["}", ""]
    text = "\n".join(lines)
    if not any("Parallel.range" in k for k in e.kernel_text):
        text = text.replace("import deepdsl.runtime.Parallel;\n", "")
    if not e.kernel_text:
        text = text.replace("import deepdsl.runtime.Kernel;\n", "")
    if cfg.lr is None:
        text = text.replace("import deepdsl.runtime.Schedule;\n", "")
    return Emitted(text, "\n\n".join(e.cuda_text) + "\n")
