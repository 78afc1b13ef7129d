"""The training and inference programs: lowering, reverse-mode gradients, optimizer updates.

- `lower(g, mode)` rewrites the ops whose meaning depends on the program (batch norm uses batch
  statistics and updates its running statistics in training, running statistics in inference;
  dropout masks in training, is the identity in inference) through each op's `lower` rule.
- `train_program(g, optimizer)` is forward + backward + update: reverse accumulation over the
  statement list, each statement's gradient emitted by its op's `vjp` rule, the gradients of a value
  used several times summed; then one update per parameter (DESIGN §2.4 optimizers).
- `infer_program(g)` is the forward program with the `predict` output only; `eval_program(g)` the one of the test
  phase, with `loss` (and `predict`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from deepdsl.errors import DslProgramError
from deepdsl.frontend.program import param_matches, param_matches_any
from deepdsl.ir import REGISTRY, Graph, GraphBuilder, Init, InputDef, ParamDef, Stmt, Value
from deepdsl.ir.types import DType, TensorType
from deepdsl.passes.dce import dce

STEP = "step"  # the train program's iteration counter input (seeds dropout masks)
LR = "opt/lr"  # the train program's learning-rate input, where a schedule gives it (kind "lr", f32[])


def replay(g: Graph, b: GraphBuilder, hook: Callable[[GraphBuilder, Stmt], Value | None] | None = None) -> dict:
    """Re-emit `g`'s statements into `b` (inputs and params already there); `hook` may replace one."""
    vmap: dict[str, Value] = {d.value.name: d.value for d in b.inputs}
    vmap.update({p.value.name: p.value for p in b.params})
    for s in g.stmts:
        s2 = s.replace(inputs=tuple(vmap[v.name] for v in s.inputs))
        out = hook(b, s2) if hook else None
        if out is None:
            out = b.emit(s2.op, *s2.inputs, span=s2.span, layer=s2.layer, **s2.a)
        vmap[s.out.name] = out
    return vmap


def _start(g: Graph, with_step: bool) -> GraphBuilder:
    b = GraphBuilder(g.name)
    for d in g.inputs:
        b.add_input(d)
    if with_step:
        b.add_input(InputDef(Value(STEP, TensorType((), DType.I64)), "step"))
    for p in g.params:
        b.add_param(p)
    return b


@dataclass(frozen=True)
class LowerContext:
    """What a lowering rule may depend on: the program kind, the run's seed and the step input."""

    train: bool
    seed: int = 1
    step: Value | None = None


def lower(g: Graph, mode: str, seed: int = 1) -> Graph:
    """Apply every op's lowering for `mode` ("train" or "infer")."""
    train = mode == "train"
    b = _start(g, with_step=train and any(_uses(g, op) for op in ("dropout", "sample_normal", "sample_uniform")))
    step = next((d.value for d in b.inputs if d.kind == "step"), None)
    ctx = LowerContext(train, seed, step)

    def hook(b: GraphBuilder, s: Stmt) -> Value | None:
        rule = REGISTRY[s.op].lower
        return rule(b, s, ctx) if rule else None

    vmap = replay(g, b, hook)
    for name, v in g.outputs:
        b.output(name, vmap[v.name])
    return b.build()


def _uses(g: Graph, op: str) -> bool:
    return any(s.op == op for s in g.stmts)


def infer_program(g: Graph) -> Graph:
    """`predict` under inference semantics, taking only the inputs it reads (no labels)."""
    if not any(name == "predict" for name, _ in g.outputs):
        raise DslProgramError("the network defines no `predict`, so it has no inference program")
    return _forward(g, ("predict",))


def eval_program(g: Graph) -> Graph:
    """The test program: `loss` (and `predict`, where the network has one) under inference semantics, as the test
    phase reports them; it takes every input and label the loss reads."""
    return _forward(g, tuple(name for name in ("loss", "predict") if any(n == name for n, _ in g.outputs)))


def _forward(g: Graph, outputs: tuple[str, ...]) -> Graph:
    low = lower(g, "infer")
    b = _start(low, with_step=False)
    vmap = replay(low, b)
    for name in outputs:
        b.output(name, vmap[low.output(name).name])
    g2 = dce(b.build())
    used = {v.name for s in g2.stmts for v in s.inputs} | {v.name for _, v in g2.outputs}
    return g2.replace(inputs=tuple(d for d in g2.inputs if d.value.name in used))


def gradients(b: GraphBuilder, loss: Value, wrt: set[str]) -> dict[str, Value]:
    """Emit the backward pass of the statements already in `b`; return d loss / d value by name."""
    stmts = list(b.stmts)
    # only statements between a parameter and the loss need gradients
    depends = set(wrt)
    for s in stmts:
        if REGISTRY[s.op].differentiable and any(v.name in depends for v in s.inputs):
            depends.add(s.out.name)
    grads: dict[str, Value] = {loss.name: b.emit("fill", value=1.0, shape=())}
    for s in reversed(stmts):
        g = grads.get(s.out.name)
        if g is None or s.out.name not in depends:
            continue
        rule = REGISTRY[s.op].vjp
        assert rule is not None, f"op {s.op} has no gradient rule"
        contributions = rule(b, s, g)
        assert len(contributions) == len(s.inputs), f"{s.op}: vjp gives {len(contributions)} gradients"
        for v, dv in zip(s.inputs, contributions):
            if dv is None or v.name not in depends:
                continue
            assert dv.type == v.type, f"{s.op}: gradient {dv.type} for input {v.type}"
            old = grads.get(v.name)
            grads[v.name] = dv if old is None else b.emit("add", old, dv, span=s.span, layer=s.layer)
    return grads


def train_program(
    g: Graph,
    optimizer: tuple[str, tuple[tuple[str, Any], ...]],
    seed: int = 1,
    scheduled: bool = False,
    freeze: tuple[str, ...] = (),
    lr_mult: tuple[tuple[str, float], ...] = (),
) -> Graph:
    """Forward, backward and update; with `scheduled`, the learning rate is the program's input `opt/lr` (kind
    "lr", fed every step from the train block's schedule) instead of the optimizer's constant. The parameters
    `freeze` names (a parameter, or a prefix of its name up to a `.`: a layer) are not trained: the backward
    pass is not asked for their gradients, they get no update and no optimizer state (their batch norm running
    statistics still update, a forward effect, as in PyTorch). `lr_mult` multiplies the learning rate of the
    parameters each name matches (the last match wins)."""
    low = lower(g, "train", seed)
    b = _start(low, with_step=False)
    rate = b.add_input(InputDef(Value(LR, TensorType(())), "lr")) if scheduled else None
    vmap = replay(low, b)
    for name, v in low.updates:
        b.update(name, vmap[v.name])
    loss = vmap[low.output("loss").name]
    b.output("loss", loss)
    for name, v in low.outputs:  # the named terms of a loss of several (`loss:rec`), reported beside it
        if name.startswith("loss:"):
            b.output(name, vmap[v.name])
    trainable = [p for p in low.params if p.kind == "param" and not param_matches_any(p.value.name, freeze)]
    grads = gradients(b, loss, {p.value.name for p in trainable})
    pairs = [(p, grads[p.value.name]) for p in trainable if p.value.name in grads]
    mults = {p.value.name: m for p, _ in pairs for prefix, m in lr_mult if param_matches(p.value.name, prefix)}
    apply_optimizer(b, pairs, optimizer, rate, mults)
    return dce(b.build())  # a vjp rule emits every input's gradient; drop those nobody needs (data inputs)


def gradient_program(g: Graph, seed: int = 1) -> Graph:
    """The training forward pass and every parameter's gradient as outputs `grad:NAME` (for checks)."""
    low = lower(g, "train", seed)
    b = _start(low, with_step=False)
    vmap = replay(low, b)
    loss = vmap[low.output("loss").name]
    b.output("loss", loss)
    trainable = [p.value.name for p in low.params if p.kind == "param"]
    grads = gradients(b, loss, set(trainable))
    for name in trainable:
        if name in grads:
            b.output(f"grad:{name}", grads[name])
    return dce(b.build())


def apply_optimizer(
    b: GraphBuilder,
    pairs: list[tuple[ParamDef, Value]],
    optimizer: tuple[str, tuple],
    rate: Value | None = None,
    lr_mult: dict[str, float] | None = None,
) -> None:
    """One update per parameter, in the PyTorch convention (DESIGN §2.4); optimizer state as `opt/...`; the
    learning rate the optimizer's constant, or the scalar input `rate` (a schedule), times the parameter's
    multiplier in `lr_mult` (an attribute `lr_mult` of each update statement that reads the rate)."""
    name, args = optimizer
    a = dict(args)
    if a.get("clip", 0.0) > 0.0:
        total = None
        for _, g in pairs:
            sq = b.emit("sum_squares", g)
            total = sq if total is None else b.emit("add", total, sq)
        assert total is not None
        scale = b.emit("clip_scale", total, clip=a["clip"])
        pairs = [(p, b.emit("scale_by", g, scale)) for p, g in pairs]
    step1 = None
    if name in ("adam", "adamw") and pairs:
        step = _opt_state(b, "opt/step", TensorType(()))
        step1 = b.emit("add_scalar", step, value=1.0)
        b.update("opt/step", step1)
    for p, g in pairs:
        w = p.value
        mult = (lr_mult or {}).get(w.name, 1.0)
        # the rate: the constant `lr` attribute, or the input `rate` after the statement's other inputs
        lr = ({"lr": a["lr"]} if rate is None else {}) | ({"lr_mult": mult} if mult != 1.0 else {})
        more = () if rate is None else (rate,)
        sched = "" if rate is None else "_scheduled"
        wd = {"weight_decay": a.get("weight_decay", 0.0)}
        if name == "sgd":
            if a["momentum"] > 0.0:
                v = _opt_state(b, f"opt/{w.name}/momentum", w.type)
                v1 = b.emit("sgd_momentum", v, g, w, momentum=a["momentum"], **wd)
                b.update(v.name, v1)
                if a.get("nesterov", False):
                    w1 = b.emit("sgd_nesterov" + sched, w, v1, g, *more, momentum=a["momentum"], **wd, **lr)
                else:
                    w1 = b.emit("sgd_step" + sched, w, v1, *more, **lr)
            else:
                w1 = b.emit("sgd_plain" + sched, w, g, *more, **wd, **lr)
        elif name == "rmsprop":
            s = _opt_state(b, f"opt/{w.name}/square_avg", w.type)
            s1 = b.emit("rmsprop_square", s, g, w, alpha=a["alpha"], **wd)
            b.update(s.name, s1)
            if a["momentum"] > 0.0:
                buf = _opt_state(b, f"opt/{w.name}/momentum", w.type)
                buf1 = b.emit("rmsprop_momentum", buf, g, w, s1, momentum=a["momentum"], eps=a["eps"], **wd)
                b.update(buf.name, buf1)
                w1 = b.emit("sgd_step" + sched, w, buf1, *more, **lr)
            else:
                w1 = b.emit("rmsprop_plain" + sched, w, g, s1, *more, eps=a["eps"], **wd, **lr)
        else:
            m = _opt_state(b, f"opt/{w.name}/m", w.type)
            v = _opt_state(b, f"opt/{w.name}/v", w.type)
            m1 = b.emit("adam_moment", m, g, beta=a["beta1"], power=1)
            v1 = b.emit("adam_moment", v, g, beta=a["beta2"], power=2)
            b.update(m.name, m1)
            b.update(v.name, v1)
            betas = {"beta1": a["beta1"], "beta2": a["beta2"], "eps": a["eps"]}
            assert step1 is not None
            if name == "adamw":
                w1 = b.emit("adamw_step" + sched, w, m1, v1, step1, *more, **betas, **wd, **lr)
            else:
                w1 = b.emit("adam_step" + sched, w, m1, v1, step1, *more, **betas, **lr)
        b.update(w.name, w1)


def _opt_state(b: GraphBuilder, name: str, t: TensorType) -> Value:
    return b.add_param(ParamDef(Value(name, t), Init("constant", (0.0,)), "opt"))
