"""Mixed precision (--precision bf16): the element type of every value, and the casts, from the ops' storage facts
(ir/registry.py OpDef.storage). A pure Graph -> Graph pass, the last of the pipeline; the identity at fp32 and tf32.

- `bf16` (GEMMs, convolutions, attention's batched products) reads bf16 operands: each fp32 tensor it reads (a
  master weight, a loss gradient) goes through one `cast_bf16` statement (round to nearest even), made once per
  value before its first such reader; its result is bf16 (products accumulated in fp32 by every backend).
- `bf16_out` (element-wise ops, pooling, a fused statement without a reduction) computes in fp32 from its inputs
  as they are and stores bf16.
- `follow` (views, copies: transpose, concat, slice) has its first input's type.
- `fp32` (reductions, batch-norm and layer-norm statistics, softmax, losses, the optimiser) computes and stores
  fp32, reading a bf16 input widened (exact).
- Always fp32: scalars, integer values, every value the step writes back (parameters, optimiser state, running
  statistics: fp32 master copies) and every statement that reads optimiser state; so the update reads fp32
  master weights and state (and a bf16 weight gradient widened, as autocast's are).
- An in-place result (`inplace`) whose element type differs from the buffer it would reuse gets its own.
"""

from __future__ import annotations

from deepdsl.ir import REGISTRY, Graph, Stmt, Value
from deepdsl.ir.types import DType, TensorType


def _as(v: Value, dtype: DType) -> Value:
    return v if v.type.dtype is dtype else Value(v.name, TensorType(v.type.shape, dtype))


def precision(g: Graph, precision: str = "fp32") -> Graph:
    """`g` with bf16 storage where the ops' facts allow it (precision bf16); `g` itself for fp32 and tf32."""
    if precision != "bf16":
        return g
    now: dict[str, Value] = {}  # a value's name -> the value with its element type
    for d in g.inputs:
        now[d.value.name] = d.value
    optimiser = set()
    for q in g.params:
        now[q.value.name] = q.value
        if q.kind == "opt":
            optimiser.add(q.value.name)
    written = {v.name for _, v in g.updates}
    casts: dict[str, Value] = {}
    taken = {v.name for v in now.values()} | {s.out.name for s in g.stmts}
    stmts: list[Stmt] = []
    for s in g.stmts:
        inputs = tuple(now[v.name] for v in s.inputs)
        kind = REGISTRY[s.op].stores(s.a)
        out = s.out.type
        if (out.dtype is not DType.F32 or out.rank == 0 or s.out.name in written
                or any(v.name in optimiser for v in s.inputs)):  # fmt: skip
            kind = "fp32"
        if kind == "bf16":
            inputs = tuple(_cast(v, casts, taken, stmts, s) for v in inputs)
        if kind == "follow":
            bf16 = bool(inputs) and inputs[0].type.dtype is DType.BF16 and out.dtype is DType.F32
            dtype = DType.BF16 if bf16 else out.dtype
        else:
            dtype = DType.BF16 if kind in ("bf16", "bf16_out") else out.dtype
        attrs = s.attrs
        if "inplace" in s.a and inputs[s.a["inplace"]].type.dtype is not dtype:
            attrs = tuple((k, v) for k, v in s.attrs if k != "inplace")
        value = _as(s.out, dtype)
        now[s.out.name] = value
        stmts.append(Stmt(value, s.op, inputs, attrs, s.span, s.layer))
    return g.replace(
        stmts=tuple(stmts),
        outputs=tuple((name, now[v.name]) for name, v in g.outputs),
        updates=tuple((name, now[v.name]) for name, v in g.updates),
    )


def _cast(v: Value, casts: dict[str, Value], taken: set[str], stmts: list[Stmt], reader: Stmt) -> Value:
    """`v` as bf16 for a `bf16` reader: itself when it is bf16 (or not a float tensor), else its cast, made once."""
    if v.type.dtype is not DType.F32 or v.type.rank == 0:
        return v
    if v.name not in casts:
        name, k = f"{v.name}.bf16", 1
        while name in taken:
            name, k = f"{v.name}.bf16.{k}", k + 1
        taken.add(name)
        casts[v.name] = Value(name, TensorType(v.type.shape, DType.BF16))
        stmts.append(Stmt(casts[v.name], "cast_bf16", (v,), (), reader.span, reader.layer))
    return casts[v.name]
