"""The NumPy reference runner: executes a Graph statement by statement with each op's NumPy kernel.

float32 by default, float64 on request (for gradient checks). Values are dropped after their last use
and the live bytes are counted, so the runner reports the peak it actually held.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from deepdsl.errors import DslProgramError
from deepdsl.ir import REGISTRY, Graph, ParamDef, Stmt
from deepdsl.ir.analysis import last_uses, persistent
from deepdsl.ir.types import DType
from deepdsl.memory import Plan
from deepdsl.memory.plan import workspace_need
from deepdsl.ops.indexed import apply_epilogue
from deepdsl.ops.precision import bf16_bits, from_bf16_bits


@dataclass(frozen=True)
class RunResult:
    outputs: dict[str, np.ndarray]
    updates: dict[str, np.ndarray]
    peak_bytes: int  # the most bytes held at once: every input, parameter and state array, and `arena_bytes`
    arena_bytes: int  # the temporaries: the arena (run_plan), or the most bytes of results alive at once (run)


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
        env[d.value.name] = x.astype(dtype) if d.value.type.dtype.value == "f32" else x
    for p in g.params:
        env[p.value.name] = np.asarray(param_value(p, params), dtype=dtype)
    last = last_uses(g)
    held = persistent(g)
    views = {s.out.name for s in g.stmts if REGISTRY[s.op].view}
    live = peak = 0
    for i, s in enumerate(g.stmts):
        need = workspace_need(s)  # the same algorithm as a plan with workspace, its scratch allocated here
        scratch = np.empty(need * np.dtype(dtype).itemsize // 4, dtype=np.uint8) if need else None
        out = _execute(s, env, dtype, scratch)
        if check_finite and out.dtype.kind in "fu" and not np.all(np.isfinite(_read(out))):
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
    outputs = {name: _read(env[v.name]) for name, v in g.outputs}
    updates = {name: env[v.name] for name, v in g.updates}
    return RunResult(outputs, updates, peak + sum(env[name].nbytes for name in held), peak)


def execute(s: Stmt, env: dict[str, np.ndarray], dtype: type = np.float32) -> np.ndarray:
    """Statement `s`'s result from the values in `env` (by name), in `dtype` (distributed/executor.py's steps)."""
    return _execute(s, env, dtype)


def _execute(s: Stmt, env: dict[str, np.ndarray], dtype: type, workspace: np.ndarray | None = None) -> np.ndarray:
    with np.errstate(all="ignore"):  # NaN and Inf are found and reported by the caller, not printed by NumPy
        return _kernel(s, env, dtype, workspace)


def _read(x: np.ndarray) -> np.ndarray:
    """A value as the kernels read it: a bf16 one (its bits in a uint16 array, --precision bf16) widened to float32."""
    return from_bf16_bits(x) if x.dtype == np.uint16 else x


def _kernel(s: Stmt, env: dict[str, np.ndarray], dtype: type, workspace: np.ndarray | None = None) -> np.ndarray:
    op = REGISTRY[s.op]
    assert op.numpy is not None, f"op {s.op} has no NumPy kernel"
    xs = tuple(_read(env[v.name]) for v in s.inputs)

    def primary(xs: tuple) -> np.ndarray:  # in the planned workspace where the plan gave the statement one
        # (a split sum's scratch holds a GPU's partial sums: NumPy sums without it)
        return np.asarray(
            op.numpy(xs, s.a) if workspace is None or op.numpy_ws is None else op.numpy_ws(xs, s.a, workspace)
        )

    if "epilogue" in s.a:
        out = apply_epilogue(primary(xs[: op.arity]), xs[op.arity :], s.a["epilogue"])
    else:
        out = primary(xs)
    if out.dtype.kind == "f" and out.dtype != dtype:
        out = out.astype(dtype)
    if s.out.type.dtype is DType.BF16:  # stored as bf16: rounded here, at the point the plan says
        out = bf16_bits(out)
    assert out.shape == s.out.type.shape, f"{s.op}: kernel gave {out.shape}, the shape rule {s.out.type.shape}"
    return out


@dataclass(frozen=True)
class ArenaLayout:
    """A plan laid out in one arena: the byte array and, per statement, the views its kernel writes and reads."""

    plan: Plan
    arena: np.ndarray  # uint8, exactly the plan's arena_bytes
    results: tuple[np.ndarray | None, ...]  # statement i's result at its planned offset (None: a view or an update
    # written over its parameter)
    scratch: tuple[np.ndarray | None, ...]  # statement i's workspace region
    hazards: tuple[tuple[tuple[str, int, int], ...], ...]  # (storage, lo, hi) to poison before statement i
    dies: tuple[tuple[tuple[int, int], ...], ...]  # arena byte ranges whose last reader is statement i


_LAYOUTS: dict[int, ArenaLayout] = {}  # by id(plan), the plan kept alive in the layout; a few at most


def layout(p: Plan) -> ArenaLayout:
    """The arena of `p` and its views, made once per plan (a training run reuses them every step)."""
    from deepdsl.memory.check import hazards

    found = _LAYOUTS.get(id(p))
    if found is not None and found.plan is p:
        return found
    g = p.graph
    arena = np.empty(p.arena_bytes, dtype=np.uint8)
    results: list[np.ndarray | None] = []
    scratch: list[np.ndarray | None] = []
    for s in g.stmts:
        t = s.out.type
        if REGISTRY[s.op].view or s.out.name in p.in_state:
            results.append(None)
        else:
            dtype = {"f32": np.float32, "bf16": np.uint16}.get(t.dtype.value, np.int64)
            results.append(np.ndarray(t.shape, dtype=dtype, buffer=arena, offset=p.buffer_of(s.out.name).offset))
        ws = p.workspace.get(s.out.name)
        scratch.append(arena[ws.offset : ws.offset + ws.nbytes] if ws else None)
    bad: list[list[tuple[str, int, int]]] = [[] for _ in g.stmts]
    for h in hazards(p):
        bad[h.at].append((h.storage, h.lo, h.hi))
    dies: list[list[tuple[int, int]]] = [[] for _ in g.stmts]
    for b in (*p.buffers, *p.workspace.values()):
        if b.end < len(g.stmts):
            dies[b.end].append((b.offset, b.offset + b.nbytes))
    found = ArenaLayout(p, arena, tuple(results), tuple(scratch), tuple(map(tuple, bad)), tuple(map(tuple, dies)))
    while len(_LAYOUTS) >= 4:
        _LAYOUTS.pop(next(iter(_LAYOUTS)))
    _LAYOUTS[id(p)] = found
    return found


def run_plan(p: Plan, feeds: dict[str, np.ndarray], params: dict[str, np.ndarray], poison: bool = False) -> RunResult:
    """Run a planned program in float32 inside the one arena it was planned for: every statement's kernel result
    goes to its planned offset, an in-place result over its input, an update over (a copy of) its parameter, and
    every later statement reads it there, so a plan that puts two live values in the same bytes gives wrong
    numbers. Where a kernel (a statement, or a `same_loop` group that the backends run as one loop) would write
    memory it reads at other elements (memory/check.py `hazards`; never in a legal plan), that memory is poisoned
    first: on a device any element's write may land before another's read. `params` is not changed.

    With `poison`, the whole arena is NaN (float32 and bf16) before the step and a region turns NaN again as soon as
    its last reader ran, so a read of memory the plan gave to something else shows in the results. `peak_bytes` is
    measured: the bytes of the arena and of every input, parameter and state array the run held.
    """
    g = p.graph
    lay = layout(p)
    arena = lay.arena
    if poison:  # every byte 0xFF: a NaN in every float32 and every bf16
        arena[:] = 0xFF
    env: dict[str, np.ndarray] = {}
    for d in g.inputs:
        floats = d.value.type.dtype.value == "f32"  # an input or the learning rate; labels and the step are int64
        env[d.value.name] = np.asarray(feeds[d.value.name], dtype=np.float32 if floats else np.int64)
    written = set(p.in_state.values())
    for q in g.params:  # a copy only where an update is written over it
        value = param_value(q, params)
        env[q.value.name] = np.array(value, np.float32) if q.value.name in written else np.asarray(value, np.float32)
    held = arena.nbytes + sum(a.nbytes for a in env.values())
    for i, s in enumerate(g.stmts):
        for storage, lo, hi in lay.hazards[i]:
            memory = arena if storage == "arena" else env[storage.split(" ", 1)[1]].reshape(-1).view(np.uint8)
            memory[lo:hi] = 0xFF  # a NaN in every float32
        target = lay.results[i]
        if target is not None:
            np.copyto(target, _execute(s, env, np.float32, lay.scratch[i]))
            env[s.out.name] = target
        elif REGISTRY[s.op].view:
            env[s.out.name] = env[s.inputs[0].name].reshape(s.out.type.shape)
        else:  # written over the parameter it replaces, outside the arena
            storage = env[p.in_state[s.out.name]]
            np.copyto(storage, _execute(s, env, np.float32))
            env[s.out.name] = storage
        if poison:
            for lo, hi in lay.dies[i]:
                arena[lo:hi] = 0xFF
    outputs = {name: np.array(_read(env[v.name])) for name, v in g.outputs}
    # an update over its parameter is in this run's own copy; one in the arena is copied out of it
    updates = {name: env[v.name] if v.name in p.in_state else np.array(env[v.name]) for name, v in g.updates}
    return RunResult(outputs, updates, held, arena.nbytes)
