"""The CUDA device's side of a generated class: each step as a table of kernel launches (`trainKernels()`,
`inferKernels()`), built from the plan's CUDA program (backends/cuda/kernels.py) and run by the runtime's
CudaDevice."""

from __future__ import annotations

from deepdsl.backends.cuda.kernels import Arg, CudaProgram
from deepdsl.backends.escape import java_comment, java_string
from deepdsl.backends.java.names import Namer
from deepdsl.backends.java.text import long_literal, method, wrapped
from deepdsl.ir.printer import format_stmt
from deepdsl.memory import Plan

LAUNCHES_PER_METHOD = 400  # keeps every table method far below Java's 64 KB of bytecode


def cuda_tables(kind: str, p: Plan, prog: CudaProgram, source: str, namer: Namer) -> list[str]:
    """The static method `{kind}Kernels()`: the step as the CUDA device runs it, one `launch` line per kernel of
    `source` (the .cu file) in plan order under the statement it implements, then the copies and the result; split
    into parts like the steps for big networks."""
    g = p.graph
    kinds = {d.value.name: d.kind for d in g.inputs}
    stmts = {s.out.name: s for s in g.stmts}

    def arg(a: Arg) -> str:
        if a.storage == "arena":
            return f"arena({long_literal(a.offset)})"
        kind = kinds.get(a.name)
        if kind == "step":
            return "counter()"
        if kind == "lr":
            return "rate()"
        return f"{'fed' if kind in ('input', 'label') else 'tensor'}({java_string(a.name)})"

    def dim(d: tuple[int, int, int]) -> str:
        return f"dim({d[0]})" if d[1:] == (1, 1) else f"dim({d[0]}, {d[1]}, {d[2]})"

    items: list[list[str]] = []  # the lines of one launch (under its statement's comment), of a copy
    previous = None
    for x in prog.launches:
        lines = []
        if x.stmt != previous:
            for name in (x.stmt, *x.also):  # the statements the kernel computes
                st = stmts[name]
                where = format_stmt(st).rsplit("  # ", 1)
                comment = f"%{st.out.name} = {st.op}({', '.join('%' + v.name for v in st.inputs)})"
                lines.append("// " + java_comment(comment + (f"  # {where[1]}" if len(where) == 2 else "")))
            previous = x.stmt
        head = f"k.launch({java_string(x.kernel)}, {dim(x.grid)}, {dim(x.block)}, "
        items.append(lines + wrapped(head, [arg(a) for a in x.args], ");"))
    for src, tensor, nbytes in prog.copies:
        items.append([f"k.copy({arg(src)}, {java_string(tensor)}, {long_literal(nbytes)});"])
    result = "predict" if kind == "infer" else "loss"
    where = dict(prog.results)[result]
    shape = ", ".join(map(str, g.output(result).type.shape))
    result_line = f"k.result({arg(where)}{', ' + shape if shape else ''});"
    name = namer(f"kernels:{kind}", f"{kind}Kernels")
    what = {"train": "training step", "infer": "inference step", "eval": "test step"}[kind]
    doc = f"/** The {what} on the CUDA device: the kernels of {java_comment(source)} in plan order. */"
    size = LAUNCHES_PER_METHOD
    chunks = [[line for item in items[i : i + size] for line in item] for i in range(0, len(items), size)]
    if len(chunks) == 1:
        body = ["Kernels k = new Kernels();", *chunks[0], result_line, "return k;"]
        return [method(doc, f"static Kernels {name}()", body)]
    calls = [f"{name}{i + 1}(k);" for i in range(len(chunks))]
    out = [method(doc, f"static Kernels {name}()", ["Kernels k = new Kernels();", *calls, result_line, "return k;"])]
    for i, chunk in enumerate(chunks):
        out.append(method(f"/** Part {i + 1} of {name}. */", f"private static void {name}{i + 1}(Kernels k)", chunk))
    return out
