"""The kernels' section of the class: each generated kernel as a named constant holding its Java body, and its CUDA
kernel for Name.cu under the same name; kernels that read the same but for their sizes (or the numbers
java/constants.py lifts) are written once."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from deepdsl.backends.cuda.kernels import group_kernel, ie_kernel, multi_kernel
from deepdsl.backends.escape import java_comment, java_string
from deepdsl.backends.java.constants import lift, number_name, numbers
from deepdsl.backends.java.kernels import (
    flat_form,
    float_literal,
    is_flat,
    java_cost,
    java_group_kernel,
    java_kernel,
    split_of,
)
from deepdsl.backends.java.names import camel, identifier
from deepdsl.backends.java.settings import read_settings, with_settings
from deepdsl.backends.java.state import Emitter
from deepdsl.backends.java.unit_axes import padded
from deepdsl.backends.sizes import Sizes
from deepdsl.ir import REGISTRY, Stmt, Value
from deepdsl.ir.groups import group_form
from deepdsl.ir.indexexpr import Affine, Apply, Const, Read, Reduce, Var, format_ie, renumber
from deepdsl.ir.types import DType
from deepdsl.memory import Plan

_PLACEHOLDER = "dd_kernel_"  # the name a kernel is written under to compare it with the kernels written before


def ctype(v: Value) -> str:
    """The C type a value is stored as on the CUDA device: float, dd_bf16 (library.cu: a value the plan stores in
    bf16, --precision bf16) or long long."""
    return {DType.F32: "float", DType.BF16: "dd_bf16"}.get(v.type.dtype, "long long")


def _constant(method_name: str) -> str:
    """`linearEpilogue10` -> `LINEAR_EPILOGUE10`: the name of a kernel's constant."""
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", method_name).upper()


def meaning(body: Any, out: tuple, shapes: tuple, cuda: bool = False) -> str:
    """What a kernel computes, `out[i0] = (sum[r0:in0.dim(0)] in0[r0, i0])`, true of every statement it serves: a
    reduction's range and a mean's count by the sizes' names as the kernel reads them (backends/sizes.py), the
    Java body's `in0.dim(0)`, the CUDA kernel's size parameter `n0_0`; a number where the kernel has one."""
    sizes = Sizes(tuple(n for _, n in out), shapes)

    def size(var: str, n: int, where: Any) -> str:
        name = sizes.range_of(var, n, where)
        return name if cuda else re.sub(r"^n(\d+)_(\d+)$", r"in\1.dim(\2)", name)

    def go(x: Any) -> str:
        if isinstance(x, Reduce):
            return f"({x.kind}[{', '.join(f'{v}:{size(v, n, x.body)}' for v, n in x.vars)}] {go(x.body)})"
        if not isinstance(x, Apply):
            return format_ie(x, tuple(f"in{k}" for k in range(len(shapes))))
        if x.fn == "/" and isinstance(x.args[0], Reduce) and isinstance(x.args[1], Const):  # a mean: its count
            r = x.args[0]
            named = [size(v, n, r.body) for v, n in r.vars]
            if (
                r.kind == "sum"
                and x.args[1].value == math.prod(n for _, n in r.vars)
                and not any(map(str.isdigit, named))
            ):
                return f"({go(r)} / ({' * '.join(named)}))"
        return format_ie(Apply(x.fn, tuple(Var(go(a)) for a in x.args)))  # as format_ie, with its arguments' text

    return f"out[{', '.join(v for v, _ in out)}] = {go(body)}"


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


def _add(e: Emitter, name: str, java: str, cuda: Any, outputs: int, flat: bool, cost: str | None, doc: str,
         split: int = 0, columns: bool = False, group: bool = False, same: str | None = None) -> str:  # fmt: skip
    """Records kernel `name` (its Java body, its CUDA kernel) and returns the name of its constant, which holds its
    launch shape, its cost per output element (kernels.java_cost) and its Java body as a lambda; `split` is the
    output axis a shaped kernel's pieces cover, `columns` a sum down columns, whose pieces the runtime keeps wide
    (kernels.split_of). `same`: the constant of the same Java body over another CUDA kernel (the same loop, other
    pointers `__restrict__`), whose variant this one is."""
    const = e.namer(f"constant:{name}", _constant(name))
    e.cuda_text.append(cuda.text)
    if same is not None:
        e.kernel_text.append(f"  /** {java_comment(doc)} */\n  static final Kernel {const} = {same}.variant("
                             f"{java_string(name)});")  # fmt: skip
        return const
    args = [java_string(name), *([cost] if cost is not None else [])]
    if outputs > 1 or group:  # a group's body (its outputs an array), of one statement in a multi-tensor launch
        make = f"Kernel.group({java_string(name)}, {outputs}, {cost}"
    elif flat:  # with a float4 loop beside the scalar one, which the CUDA device sizes its grid for
        make = f"Kernel.{'vectorised' if cuda.float4 else 'elementwise'}({', '.join(args)}"
    elif cuda.loop == "block-stride":
        factory = "columns" if columns else "rows"
        make = f"Kernel.{factory}({', '.join([args[0], str(cuda.block[0]), *args[1:]])}"
    elif split:
        make = f"Kernel.shapedOn({', '.join([args[0], str(split), *args[1:]])}"
    else:
        make = f"Kernel.shaped({', '.join(args)}"
    head = f"  static final Kernel {const} = {make}, (out, in, lo, hi) -> {{"
    if len(head) > 120 and cost is not None:  # the cost and the body on a continuation line
        at = make.rindex(", ")
        head = f"  static final Kernel {const} = {make[:at]},\n      {make[at + 2 :]}, (out, in, lo, hi) -> {{"
    e.kernel_text.append(f"  /** {java_comment(doc)} */\n{head}\n{java}\n  }});")
    return const


def _negative_zeros(e: Any) -> tuple[int, ...]:
    """Which of `e`'s constants (counted in order) are -0.0: Python's -0.0 == 0.0, so bodies differing only in a
    zero's sign compare (and hash) equal, and a key of printed work holds this beside the body."""
    values: list[float] = []

    def walk(x: Any) -> None:
        if isinstance(x, Const):
            values.append(x.value)
        elif isinstance(x, Apply):
            for a in x.args:
                walk(a)
        elif isinstance(x, Reduce):
            walk(x.body)

    walk(e)
    return tuple(k for k, v in enumerate(values) if v == 0 and math.copysign(1.0, v) < 0)


def _java(e: Emitter, body: Any, out: tuple, shapes: tuple, tail: bool = False) -> str:
    """kernels.java_kernel, printed once per distinct kernel of the class (a network's repeated blocks, both
    steps and both of emit_java's passes ask for the same ones) and reused."""
    key = ("java", body, _negative_zeros(body), out, shapes, tail)
    if key not in e.memo:
        e.memo[key] = java_kernel(body, out, shapes, tail)
    return e.memo[key]


def _cuda(e: Emitter, name: str, body: Any, out: tuple, shapes: tuple, ctypes: tuple | None = None,
          comments: tuple[str, ...] = (), restrict: tuple[bool, ...] | None = None,
          out_ctype: str = "float") -> Any:  # fmt: skip
    """cuda.kernels.ie_kernel of a shape-generic kernel, printed once per distinct kernel (as _java) and reused. An
    element-wise one takes its pointers `__restrict__` as `restrict` says (the output first; see `apart`) and has a
    float4 loop beside its scalar one where its reads allow (cuda/kernels.py `vectorisable`), which it takes at run
    time where the size and the pointers' alignment allow. `out_ctype`: the output's storage (dd_bf16 for a bf16
    value: the store rounds)."""
    key = ("cuda", name, body, _negative_zeros(body), out, shapes, ctypes, comments, restrict, out_ctype)
    if key not in e.memo:
        e.memo[key] = ie_kernel(name, body, out, shapes, ctypes, comments, generic=True, restrict=restrict,
                                vector=True, out_ctype=out_ctype)  # fmt: skip
    return e.memo[key]


def places(p: Plan) -> dict[str, tuple[str, str, int, int]]:
    """Where each value of plan `p` lives, for `apart`: (storage, base, first byte, end) of a value in the arena (its
    buffer: its views and the in-place results written over it share it) or in a tensor of its own (an input,
    parameter or state, the whole of it; an update written in place is its tensor), a view where its base is; a
    value found in neither is left out (`apart` takes it to share every other's memory)."""
    g = p.graph
    base = {s.out.name: s.inputs[0].name for s in g.stmts if REGISTRY[s.op].view}
    tensors = {d.value.name for d in (*g.inputs, *g.params)}
    where: dict[str, tuple[str, str, int, int]] = {}
    for v in (*(d.value for d in g.inputs), *(d.value for d in g.params), *(s.out for s in g.stmts)):
        name = v.name
        while name in base and name not in p.index:
            name = base[name]
        name = p.in_state.get(name, name)
        if name in p.index:
            b = p.buffer_of(name)
            where[v.name] = ("arena", "", b.offset, b.offset + b.nbytes)
        elif name in tensors:
            where[v.name] = ("tensor", name, 0, 1)
    return where


def apart(e: Emitter, out: Value, inputs: tuple[Value | None, ...]) -> tuple[bool, ...]:
    """Which pointers of an element-wise kernel writing `out` from `inputs` may be `__restrict__` (memory no other
    pointer of the kernel writes), as the PyCUDA runner decides them (cuda/translation.py `memory`): the output where no
    input shares its memory, an input where it is not the output's memory; None (a number or setting the call
    passes, which no kernel writes) always. A value the plan does not place (`e.places`) shares everyone's."""
    mine = e.places.get(out.name)

    def shares(v: Value | None) -> bool:
        if v is None:
            return False
        theirs = e.places.get(v.name)
        if mine is None or theirs is None:
            return True
        return mine[:2] == theirs[:2] and mine[2] < theirs[3] and theirs[2] < mine[3]

    shared = tuple(shares(v) for v in inputs)
    return (not any(shared), *(not x for x in shared))


def _form(e: Emitter, body: Any, out: tuple, shapes: tuple) -> tuple:
    """The text of a rank-4 kernel for every size (lane sums with their tails), by which a rank-2 statement's
    padded form meets a rank-4 statement's own (unit_axes.py)."""
    return _java(e, body, out, shapes, tail=True), _cuda(e, _PLACEHOLDER, body, out, shapes).text


@dataclass(frozen=True)
class _Prepared:
    """What kernel() finds of a statement's kernel before it looks at what the class has met: the same for every
    statement of the same body and sizes (a network's repeated blocks) and in both passes of emit_java."""

    body: Any  # the body with its reductions' variables renamed r0, r1, ... (canonical_names)
    form: tuple | None  # its rank-4 text for every size, by which rank-2 and rank-4 statements meet (unit_axes.py)
    wide: tuple | None  # its padded rank-4 form (body, out, shapes, views), where it has one
    values: tuple[float, ...]  # its numbers (java/constants.py)
    template: tuple | None  # the texts of its kernel with every number an argument, where it has numbers


def _prepare(e: Emitter, body: Any, out: tuple, shapes: tuple, ctypes: tuple[str, ...], pad: bool) -> _Prepared:
    """kernel()'s analysis of a body at its sizes, done once per distinct body, sizes and argument types."""
    key = ("prepare", body, _negative_zeros(body), out, shapes, ctypes, pad)
    if key in e.memo:
        return e.memo[key]
    body = canonical_names(body)
    form = wide = None
    if pad and not numbers(body) and not is_flat(body, out, shapes):
        wide = padded(body, out, shapes, unit=2)
        if wide is not None:
            wide = (canonical_names(wide[0]), *wide[1:])
        rank4 = len(out) == 4 or any(len(s) == 4 for s in shapes) and len(out) == 1
        form = _form(e, *wide[:3]) if wide is not None else _form(e, body, out, shapes) if rank4 else None
    values = tuple(numbers(body))
    template = None
    if values:  # the kernel with every number an argument: statements that differ only in numbers share it
        n = len(values)
        lifted = lift(body, len(shapes), tuple(range(n)))
        every = (*shapes, *((),) * n)
        template = (
            _java(e, lifted, out, every),
            _cuda(e, _PLACEHOLDER, lifted, out, every, (*ctypes, *("float",) * n)).text,
        )
    e.memo[key] = _Prepared(body, form, wide, values, template)
    return e.memo[key]


def kernel(e: Emitter, op: str, value: str, body: Any, out: tuple, inputs: tuple[Value, ...],
           shapes: tuple | None = None, ctypes: tuple[str, ...] | None = None, pad: bool = False,
           maker: tuple[str, dict[str, Any]] | None = None,
           restrict: tuple[bool, ...] | None = None, out_ctype: str = "float") -> str:  # fmt: skip
    """The constant of the kernel computing `body` over `out` (stored as `out_ctype`: dd_bf16 under bf16). Its sizes are
    arguments (the buffers' dims), so statements whose kernels read the same but for their sizes share one; so are the
    numbers in which they differ (java/constants.py), the buffers `e.extra` names (after what they are to `maker`, the
    op and attributes that made them), which the call passes after the inputs. With `pad`, a rank-2 kernel whose rank-4
    form (unit_axes.py) a rank-4 statement has too is that form, and `e.views` the shapes the call passes its tensors
    as. `restrict` (`apart`: the output, then each of `shapes`): the pointers an element-wise kernel takes
    `__restrict__`; statements whose kernels differ in it alone share the Java body (`Kernel.variant`)."""
    e.extra, e.views = [], {}
    shapes = shapes if shapes is not None else tuple(v.type.shape for v in inputs)
    ctypes = ctypes if ctypes is not None else tuple(ctype(v) for v in inputs)
    p = _prepare(e, body, out, shapes, ctypes, pad)
    body = p.body
    tail = False
    if p.form is not None:
        e.forms.setdefault(p.form, set()).add(2 if p.wide is not None else 4)
        if p.form in e.shared:
            tail = True
            if p.wide is not None:
                body, out, shapes, e.views = p.wide
    if p.values:
        e.seen.setdefault(p.template, set()).add(p.values)
        which = e.lifted.get(p.template, ())
        if which:
            body = lift(body, len(shapes), which)
            shapes = (*shapes, *((),) * len(which))
            ctypes = (*ctypes, *("float",) * len(which))
            e.extra = [number(e, p.values[k], maker) for k in which]
            restrict = (*restrict, *(True,) * len(which)) if restrict is not None else None
    flat = is_flat(body, out, shapes)
    restrict = restrict if flat else None
    java = _java(e, body, out, shapes, tail)
    cuda = _cuda(e, _PLACEHOLDER, body, out, shapes, ctypes, restrict=restrict, out_ctype=out_ctype)
    key = (java, cuda.text, cuda.loop)
    if key not in e.kernels:
        # (one name per distinct kernel: the train and infer programs may both have a statement of this op and value
        # whose kernels differ, as two heads' bias adds fused into a linear's epilogue in either order)
        name = e.kernel_names(f"kernel:{op}:{value}:{len(e.kernels)}", camel(op))
        cuda = _cuda(e, name, body, out, shapes, ctypes, (meaning(body, out, shapes, cuda=True),), restrict, out_ctype)
        split, columns = split_of(body, out, shapes)
        doc = meaning(body, out, shapes)
        same = e.kernels.get(("body", java)) if restrict is not None else None
        if same is not None:
            doc += f": as {same}, {_aliasing(restrict)}"
        e.kernels[key] = _add(e, name, java, cuda, 1, flat, java_cost(body, out, shapes), doc, split, columns,
                              same=same)  # fmt: skip
        if restrict is not None:  # the first constant of this Java body, for its variants
            e.kernels.setdefault(("body", java), e.kernels[key])
    return e.kernels[key]


def _aliasing(restrict: tuple[bool, ...]) -> str:
    """What a statement's memory is to its kernel's pointers, `restrict` (`apart`), in words."""
    shared = [f"in{k}" for k, r in enumerate(restrict[1:]) if not r]
    if not shared:
        return "for statements whose output is no input's memory"
    return f"for statements whose output is {' and '.join(shared)}'s memory"


def number(e: Emitter, value: float, maker: tuple[str, dict[str, Any]] | None = None) -> str:
    """The field of a constant buffer holding `value`, a number a kernel takes as an argument, named after what it
    is to what made it (`maker`: the op and its attributes; constants.number_name: `bn_var_momentum_n3136`): one
    field for each meaning and value."""
    name = number_name(*maker, value) if maker is not None else number_name("", {}, value).removeprefix("_")
    field_name = e.namer(f"number:{name}:{float_literal(value)}", identifier(name))
    e.number_fields.setdefault(field_name, f"constant({java_string(field_name)}, {float_literal(value)})")
    e.roles[field_name] = "k"
    return field_name


def group_constant(e: Emitter, stmts: tuple[Stmt, ...]) -> tuple[str, tuple[Value, ...], list[str]]:
    """The constant of the one loop computing the statements of a group, the tensors it reads and the settings."""
    read_as, used = with_settings(e, stmts)
    form = group_form(read_as)
    shared, readers = form.inputs, form.held
    bodies = tuple(read_settings(b, len(shared)) for b in form.bodies)
    ctypes = (*(ctype(v) for v in shared), *("float",) * len(used))
    outs = tuple(ctype(st.out) for st in stmts)
    key = ("group", tuple(flat_form(b) for b in bodies), tuple(tuple(sorted(h.items())) for h in readers),
           len(shared), ctypes, *((outs,) if "dd_bf16" in outs else ()))  # fmt: skip
    if key not in e.kernels:
        ops = [st.a["ops"][0] if st.op == "fused" and st.a.get("ops") else st.op for st in stmts]
        name = e.kernel_names(f"kernel:group:{stmts[0].out.name}:{len(e.kernels)}", camel("_".join(ops)))
        n = len(shared) + len(used)
        names = (*(f"in{k}" for k in range(n)), *(f"out{m}" for m in range(len(bodies))))
        texts = []
        for j, (b, h) in enumerate(zip(bodies, readers)):  # a held result reads as the output it was written to
            readable = renumber(b, {k: k for k in range(n)} | {k: n + m for k, m in h.items()})
            texts.append(f"out{j}[e] = {format_ie(flat_form(readable), names)}")
        doc = "; ".join(texts)
        java, work = java_group_kernel(tuple(bodies), tuple(readers))
        shapes = (*(v.type.shape for v in shared), *((),) * len(used))
        numel = stmts[0].out.type.numel
        cuda = group_kernel(name, tuple(bodies), numel, shapes, ctypes, tuple(readers), (doc,), generic=True,
                            out_ctypes=outs)  # fmt: skip
        e.kernels[key] = _add(e, name, java, cuda, len(bodies), True, str(work), doc, group=True)
        e.memo[("group-form", e.kernels[key])] = (tuple(bodies), tuple(readers), ctypes)  # for multi_constant
        e.memo[("group-outs", e.kernels[key])] = outs
    return e.kernels[key], shared, used


def multi_constant(e: Emitter, kinds: tuple[str, ...], parameters: list[str]) -> str:
    """The constant of the multi-tensor kernel (ir/launches.py) whose segments are the group kernels `kinds` (their
    constants, from group_constant): a `MultiKernel` of them, and its CUDA kernel (cuda/kernels.py `multi_kernel`)
    for Name.cu; `parameters` (the tensors it updates) for its comment."""
    key = ("multi", kinds)
    if key not in e.kernels:
        forms = tuple(e.memo[("group-form", k)] for k in kinds)
        width = 4 + max(len(bodies) + len(ctypes) for bodies, _, ctypes in forms)
        name = e.kernel_names(f"kernel:multi:{kinds}", camel("multi_tensor_" + "_".join(
            re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", k).lower() for k in kinds)))  # fmt: skip
        doc = f"one launch for the updates of several tensors, each by one of {', '.join(kinds)}"
        outs = tuple(e.memo[("group-outs", k)] for k in kinds)
        text = multi_kernel(name, forms, width, (f"{doc}: {', '.join(parameters)}",), outs)
        const = e.namer(f"constant:{name}", _constant(name))
        e.cuda_text.append(text)
        e.kernel_text.append(f"  /** {java_comment(doc)} */\n  static final MultiKernel {const} =\n"
                             f"      new MultiKernel({java_string(name)}, {width}, {', '.join(kinds)});")  # fmt: skip
        e.kernels[key] = const
    return e.kernels[key]
