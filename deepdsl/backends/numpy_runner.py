"""The NumPy reference runner: executes a Graph statement by statement with each op's NumPy kernel.

float32 by default, float64 on request (for gradient checks). Values are dropped after their last use
and the live bytes are counted, so the runner reports the peak it actually held.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from deepdsl.errors import DslProgramError
from deepdsl.ir import REGISTRY, Graph, ParamDef, Stmt
from deepdsl.ir.analysis import last_uses
from deepdsl.memory import Plan
from deepdsl.memory.plan import workspace_need
from deepdsl.ops.indexed import apply_epilogue


@dataclass(frozen=True)
class RunResult:
    outputs: dict[str, np.ndarray]
    updates: dict[str, np.ndarray]
    peak_bytes: int  # the most bytes of statement results alive at once (inputs and parameters not counted)


class NonFinite(DslProgramError):
    """A NaN or Inf appeared; names the first statement that produced one."""


def param_value(p: ParamDef, params: dict[str, np.ndarray]) -> np.ndarray:
    """The array of parameter `p`: from `params`, or for a hoisted constant (kind "const") its one value."""
    if p.kind == "const" and p.value.name not in params:
        return np.full(p.value.type.shape, p.init.args[0], np.float32)
    return params[p.value.name]


def run(
    g: Graph, feeds: dict[str, np.ndarray], params: dict[str, np.ndarray], dtype: type = np.float32,
    check_finite: bool = False,
) -> RunResult:  # fmt: skip
    env: dict[str, np.ndarray] = {}
    for d in g.inputs:
        x = np.asarray(feeds[d.value.name])
        env[d.value.name] = x.astype(dtype) if d.kind == "input" else x
    for p in g.params:
        env[p.value.name] = np.asarray(param_value(p, params), dtype=dtype)
    last = last_uses(g)
    held = {d.value.name for d in g.inputs} | {p.value.name for p in g.params}
    views = {s.out.name for s in g.stmts if REGISTRY[s.op].view}
    live = peak = 0
    for i, s in enumerate(g.stmts):
        need = workspace_need(s)  # the same algorithm as a plan with workspace, its scratch allocated here
        scratch = np.empty(need * np.dtype(dtype).itemsize // 4, dtype=np.uint8) if need else None
        out = _execute(s, env, dtype, scratch)
        if check_finite and out.dtype.kind == "f" and not np.all(np.isfinite(out)):
            where = f" in layer '{s.layer}'" if s.layer else ""
            raise NonFinite(f"statement %{s.out.name} = {s.op}(...){where} produced a NaN or Inf", s.span)
        reused = s.inputs[s.a["inplace"]].name if "inplace" in s.a else None
        if reused is not None:  # the result goes into the dying input's buffer
            target = env[reused]
            np.copyto(target, out)
            out = target
        env[s.out.name] = out
        if not REGISTRY[s.op].view and reused is None:
            live += out.nbytes
            peak = max(peak, live)
        for v in set(s.inputs):
            if last.get(v.name) == i and v.name in env and v.name not in held:
                dead = env.pop(v.name)
                if v.name not in views and v.name != reused:
                    live -= dead.nbytes
    outputs = {name: env[v.name] for name, v in g.outputs}
    updates = {name: env[v.name] for name, v in g.updates}
    return RunResult(outputs, updates, peak)


def _execute(s: Stmt, env: dict[str, np.ndarray], dtype: type, workspace: np.ndarray | None = None) -> np.ndarray:
    with np.errstate(all="ignore"):  # NaN and Inf are found and reported by the caller, not printed by NumPy
        return _kernel(s, env, dtype, workspace)


def _kernel(s: Stmt, env: dict[str, np.ndarray], dtype: type, workspace: np.ndarray | None = None) -> np.ndarray:
    op = REGISTRY[s.op]
    assert op.numpy is not None, f"op {s.op} has no NumPy kernel"
    xs = tuple(env[v.name] for v in s.inputs)

    def primary(xs: tuple) -> np.ndarray:  # in the planned workspace where the plan gave the statement one
        return np.asarray(op.numpy(xs, s.a) if workspace is None else op.numpy_ws(xs, s.a, workspace))

    if "epilogue" in s.a:
        out = apply_epilogue(primary(xs[: op.arity]), xs[op.arity :], s.a["epilogue"])
    else:
        out = primary(xs)
    if out.dtype.kind == "f" and out.dtype != dtype:
        out = out.astype(dtype)
    assert out.shape == s.out.type.shape, f"{s.op}: kernel gave {out.shape}, the shape rule {s.out.type.shape}"
    return out


def run_plan(p: Plan, feeds: dict[str, np.ndarray], params: dict[str, np.ndarray], poison: bool = False) -> RunResult:
    """Run a planned program in float32 inside one preallocated arena: every value is a view at its offset.

    `peak_bytes` is measured: the end of the highest arena region any statement wrote. With `poison`, a buffer's region
    is filled with NaN as soon as its last reader ran, so a read after reuse would show in the results.
    """
    g = p.graph
    arena = np.zeros(p.arena_bytes, dtype=np.uint8)
    env: dict[str, np.ndarray] = {}
    for d in g.inputs:
        x = np.asarray(feeds[d.value.name])
        env[d.value.name] = x.astype(np.float32) if d.kind == "input" else x
    for q in g.params:  # a copy: updates in the plan's in_state are written into it
        env[q.value.name] = np.array(param_value(q, params), dtype=np.float32)
    dies: dict[int, list] = {}
    for b in p.buffers:
        dies.setdefault(b.end, []).append(b)
    used = 0
    for i, s in enumerate(g.stmts):
        t = s.out.type
        dtype = np.float32 if t.dtype.value == "f32" else np.int64
        if REGISTRY[s.op].view:
            env[s.out.name] = env[s.inputs[0].name].reshape(t.shape)
        elif s.out.name in p.in_state:  # written over the parameter it replaces, outside the arena
            storage = env[p.in_state[s.out.name]]
            np.copyto(storage, _execute(s, env, np.float32))
            env[s.out.name] = storage
        else:
            ws = p.workspace.get(s.out.name)
            scratch = arena[ws.offset : ws.offset + ws.nbytes] if ws else None
            out = _execute(s, env, np.float32, scratch)
            if ws:
                used = max(used, ws.offset + ws.nbytes)
            b = p.buffer_of(s.out.name)
            view = np.ndarray(t.shape, dtype=dtype, buffer=arena, offset=b.offset)
            np.copyto(view, out)
            env[s.out.name] = view
            used = max(used, b.offset + b.nbytes)  # the region the value occupies
        if poison:
            ws = p.workspace.get(s.out.name)
            for b in (*dies.get(i, []), *([ws] if ws else [])):
                arena[b.offset : b.offset + b.nbytes].view(np.float32)[:] = np.nan
    outputs = {name: np.array(env[v.name]) for name, v in g.outputs}
    updates = {name: np.array(env[v.name]) for name, v in g.updates}
    return RunResult(outputs, updates, used)
