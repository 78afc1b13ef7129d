"""A Plan as one CUDA C translation unit: the hand-written library (library.cu), then one kernel per statement,
group, reduction pass or multi-tensor launch of the plan, and its launches in program order (`program`). A kernel
identical to an earlier one but for its name is written once and its comment lists the statements it serves.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from importlib.resources import files

from deepdsl.backends.cuda.expressions import ctype_of
from deepdsl.backends.cuda.kernels import Form, group_kernel, ie_kernel, multi_kernel
from deepdsl.backends.cuda.launch import (
    BLOCK,
    VECTOR_ALIGN,
    Arg,
    CudaProgram,
    Kernel,
    Launch,
    check_size,
    segment_blocks,
)
from deepdsl.backends.cuda.passes import pass_kernels
from deepdsl.backends.escape import c_comment
from deepdsl.ir import REGISTRY, Stmt
from deepdsl.ir.analysis import index_form, output_indices
from deepdsl.ir.groups import group_form
from deepdsl.ir.indexexpr import (
    format_ie,
)  # fmt: skip
from deepdsl.ir.printer import format_stmt
from deepdsl.ir.reductions import reduction_group, reduction_groups
from deepdsl.ir.vendor import VendorCall, vendor_call
from deepdsl.memory.groups import planned_groups
from deepdsl.memory.launches import pass_scratch, planned_launches
from deepdsl.memory.plan import Plan


def library_source() -> str:
    return files("deepdsl.backends.cuda").joinpath("library.cu").read_text()


def entries_source() -> str:
    """entries.cu: the library's ops as kernels taking their sizes as arguments (the Java CUDA device's)."""
    return files("deepdsl.backends.cuda").joinpath("entries.cu").read_text()


def _ident(text: str) -> str:
    return re.sub(r"_+", "_", re.sub(r"[^A-Za-z0-9_]", "_", text)).strip("_")


@dataclass
class _Program:
    plan: Plan
    prefix: str = ""
    updates: dict[str, str] = field(default_factory=dict)  # update value -> the tensor it replaces
    tensors: dict[str, str] = field(default_factory=dict)  # value -> program tensor (input, parameter, state)
    views: dict[str, str] = field(default_factory=dict)  # view value -> its base value
    # a view that starts inside its base (a reduced gradient, `bucket_slice`): value -> its byte offset there
    view_offsets: dict[str, int] = field(default_factory=dict)
    taken: set[str] = field(default_factory=set)
    texts: list[str] = field(default_factory=list)
    seen: dict[str, str] = field(default_factory=dict)  # kernel code with its name blanked -> its name
    also: dict[str, list[str]] = field(default_factory=dict)  # kernel -> the later statements it serves
    launches: list[Launch] = field(default_factory=list)

    def name(self, s: Stmt, suffix: str = "", what: str = "") -> str:
        what = what or ("_".join(s.a["ops"]) if s.op == "fused" and s.a.get("ops") else s.op)
        where = s.layer or self.updates.get(s.out.name, "")  # an update is named after its parameter
        parts = [self.prefix + what, _ident(where), "v" + _ident(s.out.name) + suffix]
        base = "__".join(p for p in parts if p)
        name, k = base, 2
        while name in self.taken:
            name, k = f"{base}_{k}", k + 1
        self.taken.add(name)
        return name

    def arg(self, value: str, ctype: str) -> Arg:
        """Where `value` lives: a view in its base's storage, an update written in place in its tensor's."""
        base, within = value, 0
        while base in self.views:
            within += self.view_offsets.get(base, 0)
            base = self.views[base]
        base = self.plan.in_state.get(base, base)
        if base in self.tensors:
            assert within == 0, f"%{value}: a view inside a tensor"
            return Arg(value, "tensor", self.tensors[base], 0, ctype)
        return Arg(value, "arena", base, self.plan.buffer_of(base).offset + within, ctype)

    def add(self, s: Stmt, kernel: str, k: Kernel, values: tuple[str, ...], ctypes: tuple[str, ...],
            also: tuple[str, ...] = (), vendor: VendorCall | None = None, scratch: Arg | None = None,
            finishes: bool = False) -> None:  # fmt: skip
        """Launch `k`; a kernel identical to an earlier one but for its name is not written again: the launch
        uses the earlier kernel, whose comment lists the statements it serves. `scratch`: the statement's planned
        workspace, the last argument."""
        code = "\n".join(line for line in k.text.split("\n") if not line.startswith("//"))
        key = code.replace(f" {kernel}(", " KERNEL(", 1)
        if key in self.seen:
            kernel = self.seen[key]
            self.also[kernel].append(f"%{s.out.name}")
        else:
            self.seen[key] = kernel
            self.also[kernel] = []
            self.texts.append(k.text)
        args = tuple(self.arg(v, t) for v, t in zip(values, ctypes)) + ((scratch,) if scratch is not None else ())
        self.launches.append(Launch(kernel, s.out.name, s.op, k.grid, k.block, 0, k.static_smem, args, k.covers,
                                    k.loop, k.tiles, also, vendor, finishes=finishes))  # fmt: skip

    def group(self, stmts: tuple[Stmt, ...]) -> None:
        """One kernel for the statements of a group (ir/groups.py): every result written in the same loop."""
        form = group_form(stmts)
        shared = form.inputs
        what = "_".join(s.a["ops"][0] if s.op == "fused" and s.a.get("ops") else s.op for s in stmts)
        name = self.name(stmts[-1], what=what)  # after the last result: an update's parameter
        comments = tuple(format_stmt(s) for s in stmts)
        ctypes = tuple(ctype_of(v.type.dtype) for v in shared)
        shapes = tuple(v.type.shape for v in shared)
        outs = tuple(ctype_of(s.out.type.dtype) for s in stmts)
        k = group_kernel(name, form.bodies, stmts[0].out.type.numel, shapes, ctypes, form.held, comments,
                         out_ctypes=outs)  # fmt: skip
        values = (*(s.out.name for s in stmts), *(v.name for v in shared))
        self.add(stmts[0], name, k, values, outs + ctypes, tuple(s.out.name for s in stmts[1:]))

    def reductions(self, stmts: tuple[Stmt, ...]) -> bool:
        """The kernels of a pass (ir/reductions.py): a large sum, or reductions over the same range with the running
        statistics' updates; False (nothing launched) where the plan gave it no scratch (a workspace limit)."""
        rg = reduction_group(stmts)
        if rg is None:
            return False
        planned = pass_scratch(self.plan, stmts, rg)
        if planned is None:
            return False
        scratch = [Arg(f"workspace:{f.stmt.out.name}", "arena", f.stmt.out.name, ws.offset, "double")
                   for f, ws in zip(rg.sums, planned)]  # fmt: skip
        what = "_".join(f.stmt.a["ops"][-1] if f.stmt.op == "fused" and f.stmt.a.get("ops") else f.stmt.op
                        for f in rg.sums)  # fmt: skip
        head = rg.sums[0].stmt  # the first result: what the launches are named and listed by
        name = self.name(head, what=what)
        k = pass_kernels(name, rg, tuple(format_stmt(s) for s in stmts))
        results = [f.stmt.out.name for f in rg.sums] + [u.out.name for u, _ in rg.updates]
        running = [u.inputs[0].name for u, _ in rg.updates]  # a state tensor, or the input of an inverse deviation
        ins = [v.name for v in k.inputs]
        in_types = [ctype_of(v.type.dtype) for v in k.inputs]
        also = tuple(results[1:])  # in the order of the kernel's outputs
        outs = tuple(self.arg(v, "float") for v in results)
        reads = (*(self.arg(v, t) for v, t in zip(ins, in_types)), *(self.arg(v, "float") for v in running))
        self.add(head, name, k.kernel, (), (), also)
        # the results, the partial sums (split passes), the inputs, the running statistics; no vendor routine serves it
        self.launches[-1] = dataclasses.replace(self.launches[-1], smem=0, args=(*outs, *scratch, *reads), vendor=None)
        return True

    def memory(self, values: tuple[str, ...], ctypes: tuple[str, ...]) -> tuple[tuple[bool, ...], bool]:
        """For a kernel writing values[0] from values[1:]: which of its pointers may be `__restrict__` (the output
        when no input shares its memory, an input when it is not the output's memory), and whether every pointer is
        16-byte aligned for float4 accesses (arena offsets are; a tensor is an allocation of its own)."""
        args = [self.arg(v, t) for v, t in zip(values, ctypes)]
        where = [(a.storage, a.name if a.storage == "tensor" else a.offset) for a in args]
        out_shared = any(w == where[0] for w in where[1:])
        restrict = (not out_shared, *(w != where[0] for w in where[1:]))
        aligned = all(a.storage == "tensor" or a.offset % VECTOR_ALIGN == 0 for a in args)
        return restrict, aligned

    def multi(self, launch: tuple[tuple[Stmt, ...], ...]) -> None:
        """One kernel for the groups of a multi-tensor launch (ir/launches.py): each group a segment of a table."""
        kinds: dict[tuple, int] = {}
        rows = []
        values: list[str] = []
        ctypes_all: list[str] = []
        first = 0
        for stmts in launch:
            form = group_form(stmts)
            ctypes = tuple(ctype_of(v.type.dtype) for v in form.inputs)
            outs = tuple(ctype_of(s.out.type.dtype) for s in stmts)
            key = (form.bodies, tuple(tuple(sorted(h.items())) for h in form.held), ctypes, outs)
            kind = kinds.setdefault(key, len(kinds))
            numel = stmts[0].out.type.numel
            check_size(stmts[-1].out.name, numel, *(v.type.numel for v in form.inputs))
            blocks = segment_blocks(numel)
            count = len(stmts) + len(form.inputs)
            rows.append((first, blocks, numel, kind, count))
            first += blocks
            values += [*(s.out.name for s in stmts), *(v.name for v in form.inputs)]
            ctypes_all += list(outs) + list(ctypes)
        width = 4 + max(r[4] for r in rows)
        ops = dict.fromkeys(s.a["ops"][-1] if s.op == "fused" and s.a.get("ops") else s.op for g in launch for s in g)
        name = self.name(launch[0][0], what="multi_tensor_" + "_".join(ops), suffix="")
        parameters = [self.updates.get(g[-1].out.name, f"%{g[-1].out.name}") for g in launch]
        comments = (f"one launch for the updates of {len(launch)} tensors ({len(kinds)} kind"
                    f"{'s' if len(kinds) > 1 else ''} of loop): {', '.join(parameters)}",)  # fmt: skip
        text = multi_kernel(name, tuple((key[0], tuple(dict(h) for h in key[1]), key[2]) for key in kinds), width,
                            comments, tuple(key[3] for key in kinds))  # fmt: skip
        self.taken.add(name)
        self.seen[text] = name
        self.also[name] = []
        self.texts.append(text)
        args = tuple(self.arg(v, t) for v, t in zip(values, ctypes_all))
        total = sum(r[2] for r in rows)
        also = tuple(s.out.name for g in launch for s in g)[1:]
        grid = (first, 1, 1)
        self.launches.append(Launch(name, launch[0][0].out.name, "multi_tensor", grid, (BLOCK, 1, 1), 0, 0, args,
                                    total, "multi-tensor", also=also, table=tuple(rows), width=width))  # fmt: skip

    def statement(self, s: Stmt) -> None:
        op = REGISTRY[s.op]
        if op.view:
            self.views[s.out.name] = s.inputs[0].name
            if s.op == "bucket_slice":  # elements [offset, ...) of a reduced bucket (ops/collective.py)
                self.view_offsets[s.out.name] = 4 * s.a["offset"]
            return
        in_types = tuple(ctype_of(v.type.dtype) for v in s.inputs)
        out_type = ctype_of(s.out.type.dtype)
        values = (s.out.name, *(v.name for v in s.inputs))
        own = index_form(s)
        form: Form | None = (own.body, own.out) if own is not None else None
        if form is None and op.cuda_form is not None:
            form = op.cuda_form(s)
        arity = op.arity if op.arity is not None else len(s.inputs)
        if form is not None:
            if out_type not in ("float", "dd_bf16"):
                raise ValueError(f"%{s.out.name} = {s.op}: index-expression kernels write float32 (or bf16) only")
            if own is not None:  # an op's own index form takes no epilogue: every input is the body's
                arity = len(s.inputs)
            body, out = form
            name = self.name(s)
            shapes = tuple(v.type.shape for v in s.inputs[:arity])
            meaning = (
                f"out[{', '.join(v for v, _ in out)}] = {format_ie(body, tuple(f'in{k}' for k in range(len(shapes))))}"
            )
            restrict, vector = self.memory(values[: 1 + arity], (out_type, *in_types[:arity]))
            k = ie_kernel(name, body, out, shapes, in_types[:arity], (format_stmt(s), meaning), restrict=restrict,
                          vector=vector, out_ctype=out_type)  # fmt: skip
            # an op written from its index form (channel_sum) or CUDA form (avg_pool2d) may have a vendor routine too
            self.add(s, name, k, values[: 1 + arity], (out_type, *in_types[:arity]), vendor=vendor_call(s))
        elif op.cuda is None:
            raise ValueError(f"no CUDA kernel for op {s.op!r} (statement %{s.out.name})")
        else:
            name = self.name(s)
            ws = self.plan.workspace.get(s.out.name)
            if op.workspace is None:
                k = op.cuda(name, s, in_types[:arity])
            else:  # the kernel may take (a part of) the statement's planned workspace
                k = op.cuda(name, s, in_types[:arity], workspace=ws.nbytes if ws is not None else 0)
            scratch = None
            if k.scratch:
                assert ws is not None and k.scratch <= ws.nbytes, f"%{s.out.name}: more scratch than planned"
                scratch = Arg(f"workspace:{s.out.name}", "arena", s.out.name, ws.offset, "float")
            self.add(s, name, k, values[: 1 + arity], (out_type, *in_types[:arity]), vendor=vendor_call(s),
                     scratch=scratch)  # fmt: skip
            if k.finish is not None:  # named {name}_finish by the op's kernel; on the output and the scratch
                self.taken.add(f"{name}_finish")
                self.add(s, f"{name}_finish", k.finish, (s.out.name,), (out_type,), scratch=scratch, finishes=True)
        if "epilogue" in s.a:
            extras = s.inputs[arity:]
            out = output_indices(s.out.type)
            shapes = (s.out.type.shape, *(v.type.shape for v in extras))
            epi = s.a["epilogue"]
            ename = self.name(s, "_epilogue")
            names = ("out", *(f"in{k}" for k in range(1, len(shapes))))
            meaning = f"out[{', '.join(v for v, _ in out)}] = {format_ie(epi, names)}"
            evalues = (s.out.name, s.out.name, *(v.name for v in extras))
            restrict, vector = self.memory(evalues, (out_type, out_type, *in_types[arity:]))
            ek = ie_kernel(ename, epi, out, shapes, (out_type, *in_types[arity:]),
                           (f"epilogue of %{s.out.name}: {meaning}",), restrict=restrict, vector=vector,
                           out_ctype=out_type)  # fmt: skip
            self.add(s, ename, ek, evalues, (out_type, out_type, *in_types[arity:]))


def program(plan: Plan, prefix: str = "") -> CudaProgram:
    """The CUDA translation unit of a plan, and its launches in program order; `prefix` starts every kernel's
    name (two programs in one module)."""
    g = plan.graph
    p = _Program(plan, prefix, {v.name: name for name, v in g.updates})
    for d in g.inputs:
        p.tensors[d.value.name] = d.value.name
    for d in g.params:
        p.tensors[d.value.name] = d.value.name
    # the plan's kernels (memory/groups.py), a batch norm's reductions merged into one pass (ir/reductions.py),
    # and the optimiser's updates joined into one multi-tensor launch (memory/launches.py)
    for launch in planned_launches(plan, reduction_groups(planned_groups(plan))):
        if len(launch) > 1:
            p.multi(launch)
            continue
        group = launch[0]
        if p.reductions(group):
            continue
        if reduction_group(group) is not None and len(group) > 1:  # no scratch for the pass: each on its own
            for s in group:
                p.statement(s)
        elif len(group) == 1:
            p.statement(group[0])
        else:
            p.group(launch[0])
    texts = []
    for text in p.texts:
        name = re.search(r"__global__ void (\w+)\(", text)
        served = p.also.get(name[1], []) if name else []
        if served:  # a comment line before the signature
            head, sig = text.rsplit("\nextern", 1) if "\nextern" in text else ("", text[len("extern") :])
            note = f"// also serves {c_comment(', '.join(served))}"
            text = f"{head}\n{note}\nextern{sig}" if head else f"{note}\nextern{sig}"
        texts.append(text)
    body = "\n\n".join(texts) + "\n"
    copies = []
    for name, v in g.updates:
        src = p.arg(v.name, ctype_of(v.type.dtype))
        if not (src.storage == "tensor" and src.name == name):  # computed in the arena: copied after the step
            copies.append((src, name, v.type.nbytes))
    results = tuple((name, p.arg(v.name, ctype_of(v.type.dtype))) for name, v in g.outputs)
    return CudaProgram(translation_unit(g.name, body), tuple(dict.fromkeys(x.kernel for x in p.launches)),
                       tuple(p.launches), body, tuple(copies), results)  # fmt: skip


def translation_unit(name: str, *bodies: str) -> str:
    """The library followed by the kernels of one or more programs."""
    head = (
        f"// deepdsl: the CUDA kernels of {c_comment(name)}. Generated; the hand-written library (library.cu) comes"
        " first.\n\n"
    )
    return head + library_source() + "\n// ---- the program's kernels ----\n\n" + "\n".join(bodies)
