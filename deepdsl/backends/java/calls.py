"""The device calls of a step: a library op as `dev.conv2d(...)` with the parameters its registry entry's `java`
declares, a generated kernel as `dev.run(K, out, in...)`, a fused epilogue as a kernel run over the op's output,
an update written over its tensors as a call of a class method that reads the settings; each run of calls under a
comment naming its layer and source position."""

from __future__ import annotations

import re
from typing import Any

from deepdsl.backends.escape import java_comment, java_string
from deepdsl.backends.java.kernel_section import apart, ctype, group_constant, kernel, multi_constant
from deepdsl.backends.java.kernels import float_literal
from deepdsl.backends.java.names import camel
from deepdsl.backends.java.passes import Pass, partial_names, pass_constant
from deepdsl.backends.java.settings import read_settings, with_settings
from deepdsl.backends.java.state import Emitter
from deepdsl.backends.java.text import method
from deepdsl.ir import REGISTRY, Stmt
from deepdsl.ir.analysis import index_form, output_indices
from deepdsl.ir.indexexpr import Apply, Const, Read
from deepdsl.ir.registry import JavaCall

# the library calls' attributes written through Network's helpers of the same name: pad(0, 0), stride(1, 1)
NAMED_ARGUMENTS = frozenset(
    {"groups", "pad", "stride", "kernel", "inShape", "wShape", "transposeA", "transposeB", "dilation"}
)
# the data-parallel statements (passes/data_parallel.py) as Network's calls: the bucket packed (its tensors times the
# scale) into its buffer and its sum over the ranks started, `allReduceStart(0, bucket, scale, g1, g2)`; the wait for
# it, `allReduceWait(0, bucket)` (a view of the bucket in the plan, a call in the step)
COLLECTIVE_CALLS = {"allreduce_start": "allReduceStart", "allreduce_wait": "allReduceWait"}
# attributes a statement may leave out, and the value its call then passes: a convolution without dilation
DEFAULTS = {"dilation": (1, 1)}


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
    attrs = {k: v for k, v in DEFAULTS.items() if k in call.keys} | attrs
    for (java_type, param), key in zip(call.attributes, call.keys):
        if key == "step":  # the step counter, an input of the statement, is passed as a long
            args.append("iteration")
        elif key == "offset":  # data parallelism: the shard's first sample in the step's global batch, a long
            args.append("sampleOffset()")
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


def group(e: Emitter, stmts: tuple[Stmt, ...], temps: list[str]) -> str:
    """The call of the one loop computing the statements of a group into `temps`."""
    constant, shared, used = group_constant(e, stmts)
    ins = [e.tensor(v) for v in shared]
    return run(e, constant, temps, ins, used, all(st.out.name in e.in_state for st in stmts))


def multi(e: Emitter, launch: tuple[tuple[Stmt, ...], ...]) -> list[str]:
    """The call of the multi-tensor launch of the optimiser's updates (ir/launches.py): each group a segment, its
    tensors (outputs, inputs, settings) in a row, computed by its group kernel."""
    kinds: list[str] = []
    rows: list[str] = []
    counts: list[int] = []  # each row's tensors
    numbers: list[int] = []
    for stmts in launch:
        constant, shared, used = group_constant(e, stmts)
        if constant not in kinds:
            kinds.append(constant)
        numbers.append(kinds.index(constant))
        row = [*(e.tensor(st.out) for st in stmts), *(e.tensor(v) for v in shared), *used]
        rows.append(", ".join(row))
        counts.append(len(row))
    const = multi_constant(e, tuple(kinds), [e.tensor(g[-1].out) for g in launch])
    head = f"dev.runMulti({const}, new int[] {{{', '.join(map(str, numbers))}}}, new Buf[][] {{"
    lines = [head, *(f"  {{{r}}}," for r in rows), "});"]
    # its table on the CUDA device (MultiKernel.table): the count, then a row of 64-bit numbers a segment, 4 and
    # its tensors, as wide as the widest; the same call (the same tensors) reuses one table
    width = 4 + max(counts)
    e.tables["\n".join(lines)] = 8 * (1 + len(rows) * width)
    return lines


def run(e: Emitter, kernel: str, outs: list[str], ins: list[str], settings: list[str], update: bool) -> str:
    """`dev.run(kernel, outs..., ins..., settings...)`; for an update written over its tensors, the call of the
    class's method for that kernel, which takes each tensor once and reads the settings itself:
    `sgdMomentumStep(cv1_W_momentum, cv1_W, cv1_dW)`."""
    if not update:
        return f"dev.run({', '.join([kernel, *outs, *ins, *settings])});"
    tensors = list(dict.fromkeys([*outs, *ins]))
    key = (kernel, tuple(tensors.index(t) for t in [*outs, *ins]), tuple(settings))
    if key not in e.helpers:
        names: list[str] = []
        for t in tensors:
            role = e.roles.get(t, "x")
            names.append(role if role not in names else f"{role}{sum(n.startswith(role) for n in names) + 1}")
        helper = e.namer(f"helper:{key}", camel(f"update_{_snake(_without_update(kernel))}"))
        args = [names[i] for i in key[1]]
        doc = f"/** {kernel} over the tensors it updates ({', '.join(names)}), with the settings it reads. */"
        params = ", ".join(f"Buf {n}" for n in names)
        e.helpers[key] = helper
        e.helper_text.append(
            method(doc, f"private void {helper}({params})", [f"dev.run({', '.join([kernel, *args, *settings])});"])
        )
    return f"{e.helpers[key]}({', '.join(tensors)});"


def _view(tensor: str, shape: tuple[int, ...] | None) -> str:
    """`tensor`, or where the kernel reads it with another shape, its view of that shape (java/unit_axes.py)."""
    return tensor if shape is None else f"view({tensor}, {', '.join(map(str, shape))})"


def statement(e: Emitter, s: Stmt, temp: str) -> list[str]:
    """The Java lines of one statement (its result Buf is `temp`, already bound)."""
    op = REGISTRY[s.op]
    args = [e.tensor(v) for v in s.inputs if v.name not in e.counters]  # the step counter: a long
    if s.op in COLLECTIVE_CALLS:  # data parallelism: Network's calls of the run's Collective (docs/java.md)
        return [f"{COLLECTIVE_CALLS[s.op]}({', '.join([str(int(s.a['bucket'])), temp, *([] if op.view else args)])});"]
    if op.view:
        return []
    (read_as,), used = with_settings(e, (s,))
    own = index_form(read_as)
    form = (own.body, own.out) if own is not None else op.cuda_form(s) if op.cuda_form is not None else None
    if op.java is not None and op.java.called:  # the device's call, not a generated kernel (the op alone, unfused)
        own = form = None
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
        ctypes = (*(ctype(v) for v in s.inputs), *("float",) * len(used))
        update = s.out.name in e.in_state
        maker = (what, {} if s.op == "fused" else s.a)  # what names the numbers it takes as arguments
        restrict = apart(e, s.out, (*s.inputs, *(None,) * len(used)))
        k = kernel(e, what, s.out.name, body, out, (), shapes, ctypes, not update and not e.counters, maker, restrict,
                   ctype(s.out))  # fmt: skip
        temp, args = _view(temp, e.views.get(-1)), [_view(a, e.views.get(j)) for j, a in enumerate(args)]
        return [run(e, k, [temp], [*args, *e.extra], used, update)]
    own_args = args[:arity] if "epilogue" in s.a else args
    if form is not None:  # a shape op with an epilogue: its kernel, then the epilogue's
        body, out = form
        k = kernel(e, s.op, s.out.name, body, out, s.inputs[:arity], maker=(s.op, s.a), out_ctype=ctype(s.out))
        lines = [f"dev.run({', '.join([k, temp, *own_args, *e.extra])});"]
    else:
        call = java_call(s.op)
        workspace = [e.workspaces.get(s.out.name, "null")] if call.workspace else []  # its planned one, or none
        lines = [f"dev.{call.device}({', '.join([temp, *own_args, *library_arguments(s), *workspace])});"]
    if "epilogue" in s.a:
        extras = s.inputs[arity:]
        out = output_indices(s.out.type)
        shapes = (s.out.type.shape, *(v.type.shape for v in extras))
        ctypes = (ctype(s.out), *(ctype(v) for v in extras))
        epilogue = s.a["epilogue"]
        what = _epilogue_name(epilogue, len(out)) or f"{s.op}_epilogue"
        pad = s.out.name not in e.in_state and not e.counters
        restrict = apart(e, s.out, (s.out, *extras))  # written over its output: in0 is the output's memory
        k = kernel(e, what, s.out.name, epilogue, out, (), shapes, ctypes, pad, (what, {}), restrict, ctype(s.out))
        ins = [_view(a, e.views.get(j)) for j, a in enumerate([temp, *args[arity:]])]
        lines.append(f"dev.run({', '.join([k, _view(temp, e.views.get(-1)), *ins, *e.extra])});")
    return lines


def reduction_pass(e: Emitter, item: Pass) -> list[str]:
    """`if (!dev.pass(PASS, results..., partials..., inputs..., running...)) { the statements' own calls }`."""
    rg = item.group
    results = [e.tensor(f.stmt.out) for f in rg.sums] + [e.tensor(u.out) for u, _ in rg.updates]
    partials = partial_names(e, item) if rg.split.slices > 1 else []
    const, inputs = pass_constant(e, rg)
    ins = [e.tensor(v) for v in inputs]
    running = [e.tensor(u.inputs[0]) for u, _ in rg.updates]
    own: list[str] = []
    for g in item.groups:
        if len(g) == 1:
            own += statement(e, g[0], e.tensor(g[0].out))
        else:
            own.append(group(e, g, [e.tensor(st.out) for st in g]))
    head = f"if (!dev.pass({', '.join([const, *results, *partials, *ins, *running])})) {{"
    if len(head) > 100:  # the buffers a line each kind, as ReductionPass orders them
        kinds = [(results, "results"), (partials, "partial sums (doubles)"), (ins, "inputs"),
                 (running, "the per-element statements' inputs")]  # fmt: skip
        kinds = [(b, what) for b, what in kinds if b]
        rows = [f"    {', '.join(b)}{',' if k < len(kinds) - 1 else ')) {'}  // {what}"
                for k, (b, what) in enumerate(kinds)]  # fmt: skip
        return [f"if (!dev.pass({const},", *rows, *(f"  {line}" for line in own), "}"]
    return [head, *(f"  {line}" for line in own), "}"]


def calls(e: Emitter, part: list[tuple[str, Any]]) -> list[str]:
    """The device calls of a part of a step, each run of calls under a comment saying where they come from."""
    body: list[str] = []
    last = [""]

    def comment(st: Stmt) -> None:
        here = _where(st, e.in_state, e.prefix)
        if here == _UPDATES:  # an optimizer's update names itself (updateSgdMomentumSgdStep(fc1_W, ...))
            return
        if here != last[0]:
            body.append(f"// {java_comment(here)}")
            last[0] = here

    for what, item in part:
        if what == "update":
            name, v = item
            param = e.globals[name]
            if e.tensor(v) != param:
                body.append(f"dev.copy({e.tensor(v)}, {param});")
            continue
        if what == "multi":
            body.append(f"// {_UPDATES}: one launch")
            last[0] = _UPDATES
            body += multi(e, item)
            continue
        if what == "pass":  # one call on a CUDA device; the CPU runs the statements' own calls (passes.py)
            for st in item.stmts:
                comment(st)
            body += reduction_pass(e, item)
            continue
        if what == "group":
            temps = []
            for st in item:
                temps.append(e.tensor(st.out))
                comment(st)
            body.append(group(e, item, temps))
            continue
        if not REGISTRY[item.op].view or item.op in COLLECTIVE_CALLS:  # a view is a row of the layout table
            comment(item)
            body += statement(e, item, e.tensor(item.out))
    return body


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
