"""Elaboration: AST -> the forward tensor program (an `ir.Graph`), every shape known.

Names are resolved (with "did you mean" hints), consts evaluated (`--set` overrides them), `layer`
bindings made once with shared parameters, defs called with fresh parameters named by call path
(DESIGN §2.3), loops unrolled, conditions decided, and every built-in and tensor function lowered to
registry ops through the GraphBuilder, whose shape rules check every statement. Errors in one item are
collected and elaboration goes on with the next, so several are reported at once.
"""

from __future__ import annotations

import math
from typing import Any

from deepdsl.errors import (
    Diagnostics,
    DslArgumentError,
    DslError,
    DslNameError,
    DslProgramError,
    DslShapeError,
    DslTypeError,
    Note,
    Span,
    did_you_mean,
)
from deepdsl.frontend import arith, ast, calls
from deepdsl.frontend.builtins import BUILTINS, QUERIES, SPECS
from deepdsl.frontend.calls import CallArg
from deepdsl.frontend.declarations import bound_names, hoist
from deepdsl.frontend.javanames import java_class, reserved_class_names
from deepdsl.frontend.limits import INT_LIMIT, MAX_STATEMENTS, MAX_STEPS, too_large, too_many, too_many_elements
from deepdsl.frontend.params import ParamStore, join, no_gradient_check
from deepdsl.frontend.program import LayerRow, Program
from deepdsl.frontend.tensorfn import check_uncalled
from deepdsl.frontend.train import train_config
from deepdsl.frontend.values import (
    BuiltinFn,
    Composed,
    Env,
    Function,
    LayerInstance,
    Scope,
    Spec,
    TensorVal,
    describe,
)
from deepdsl.ir import GraphBuilder, InputDef, ShapeError, TensorType, Value
from deepdsl.ir.types import INT_MAX, MAX_ELEMENTS, DType


class Poisoned(Exception):
    """A name whose definition already failed; its uses are not reported again."""


_POISON = object()


class Elaborator:
    def __init__(self, module: ast.Module, modules: dict[str, ast.Module], sets: dict[str, int | float]):
        self.module = module
        self.modules = modules  # included files by path, already parsed
        self.sets = dict(sets)
        self.diags = Diagnostics()
        self.b = GraphBuilder(module.network or "Network")
        self.globals = Env({})
        self.declared: dict[str, Span] = {}  # every top-level name, for "used before its definition"
        self.params = ParamStore(self.b)
        self.rows: list[LayerRow] = []
        self.def_stack: list[str] = []
        self.scope = Scope("")
        self.steps = 0
        self.applications = 0
        self.tensor_fns_called: set[str] = set()
        self.loss: TensorVal | None = None
        self.loss_span: Span | None = None
        self.loss_terms: list[tuple[str, TensorVal]] = []  # the named scalars a loss of several terms adds up
        self.predict: TensorVal | None = None
        self.train: ast.Train | None = None

    # ---- driver ----

    def run(self) -> Program:
        m = self.module
        if m.network is None:
            self.diags.add(
                DslProgramError(
                    "a network file starts with `network Name`",
                    Span.point(m.file, 1, 1),
                    hint="add a first line such as `network LeNet`",
                )  # fmt: skip
            )
        elif not m.network.isidentifier():
            self.diags.add(DslNameError(f"'{m.network}' is not a valid class name", m.network_span))
        elif java_class(m.network) in reserved_class_names():
            cls = java_class(m.network)
            self.diags.add(
                DslNameError(
                    f"'{m.network}' cannot name a network: its Java class {cls} would hide "
                    f"{reserved_class_names()[cls]}, which the generated program uses",
                    m.network_span,
                    hint=f"choose another name, such as '{cls}Net'",
                )  # fmt: skip
            )
        hoist(self, m, [])
        for item in m.items:
            try:
                self._item(item)
            except (Poisoned, DslError) as err:
                if isinstance(err, DslError):
                    self.diags.add(err)
                for name in bound_names(item):
                    self.globals.values[name] = _POISON
            except RecursionError:
                self.diags.add(DslProgramError("the expression is nested too deeply", item.span))
                for name in bound_names(item):  # reported once: its users see a poisoned name, not "used before"
                    self.globals.values[name] = _POISON
        for item in m.items:  # what no one calls is checked all the same
            if isinstance(item, ast.TensorDef) and item.name not in self.tensor_fns_called:
                check_uncalled(self, item)
        unknown = sorted(set(self.sets) - self._const_names())
        for name in unknown:
            consts = self._const_names()
            listed = f"its consts are: {', '.join(sorted(consts))}" if consts else "it has no consts"
            hint = did_you_mean(name, consts) or listed
            self.diags.add(DslArgumentError(f"--set {name}: the network has no const '{name}'", None, hint=hint))
        if self.loss is None and not self.diags.errors:
            self.diags.add(
                DslProgramError(
                    "the network defines no `loss`",
                    m.network_span or Span.point(m.file, 1, 1),
                    hint="add e.g. `loss = softmax_cross_entropy(net(x), y)`",
                )  # fmt: skip
            )
        train = None
        try:
            train = train_config(self.train, self)
        except DslError as err:
            self.diags.add(err)
        except Poisoned:  # the train block uses a name whose definition failed; that error is reported
            pass
        self.diags.raise_if_errors()
        assert self.loss is not None and train is not None
        self.b.output("loss", self.loss.value)
        for name, term in self.loss_terms:  # reported beside the loss (`deepdsl run`, the Java program)
            self.b.output(f"loss:{name}", term.value)
        if self.predict is not None:
            self.b.output("predict", self.predict.value)
        graph = self.b.build()
        for err in too_many_elements(graph):
            self.diags.add(err)
        self.diags.raise_if_errors()
        error, warnings = no_gradient_check(graph, self.loss_span)
        if error is not None:
            self.diags.add(error)
            self.diags.raise_if_errors()
        for warning in warnings:
            self.diags.add(warning)
        return Program(graph, tuple(self.rows), train, tuple(self.diags.warnings))

    def _const_names(self) -> set[str]:
        return {i.name for mod in [self.module] for i in mod.items if isinstance(i, ast.Const)}

    # ---- items ----

    def _item(self, item: ast.Item) -> None:
        g = self.globals
        if isinstance(item, ast.Const):
            value = self._set_value(item.name) if item.name in self.sets else self.eval(item.value, g)
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise DslTypeError(f"a const must be a number, got {describe(value)}", item.value.span)
            g.values[item.name] = value
        elif isinstance(item, (ast.Input, ast.TokenInput, ast.Label)):
            dims = tuple(self.eval_int(d, g, "a dimension", low=1) for d in item.shape)
            if math.prod(dims) > MAX_ELEMENTS:
                what = "label" if isinstance(item, ast.Label) else "input"
                raise too_many(f"{what} '{item.name}'", TensorType(dims), item.span)
            if isinstance(item, ast.TokenInput):
                k = self.eval_int(item.vocab, g, "the vocabulary size", low=1)
                v = self.b.add_input(InputDef(Value(item.name, TensorType(dims, DType.I64)), "input", k, item.span))
                g.values[item.name] = TensorVal(v, f"token input '{item.name}'", item.span, classes=k)
            elif isinstance(item, ast.Input):
                v = self.b.add_input(InputDef(Value(item.name, TensorType(dims)), "input", None, item.span))
                g.values[item.name] = TensorVal(v, f"input '{item.name}'", item.span)
            else:
                k = self.eval_int(item.classes, g, "the number of classes", low=1)
                v = self.b.add_input(InputDef(Value(item.name, TensorType(dims, DType.I64)), "label", k, item.span))
                g.values[item.name] = TensorVal(v, f"label '{item.name}'", item.span, classes=k)
        elif isinstance(item, ast.Layer):
            value = self.eval(item.value, g, name=item.name)
            if not isinstance(value, Function):
                raise DslTypeError(
                    f"a layer binds a function, but this is {describe(value)}", item.value.span,
                    hint=f"use a plain binding `{item.name} = ...` for a tensor",
                )  # fmt: skip
            g.values[item.name] = self._instance(value, item.name, item.span)
        elif isinstance(item, ast.Bind):
            value = self.eval(item.value, g, name=item.name)
            g.values[item.name] = self._instance(value, item.name, item.span) if isinstance(value, Function) else value
        elif isinstance(item, (ast.Loss, ast.Predict)):
            self._output(item)
        elif isinstance(item, ast.Train):
            if self.train is not None:
                raise DslProgramError("a second `train` block", item.span, notes=[Note("the first", self.train.span)])
            self.train = item

    def _instance(self, value: Function, name: str, span: Span) -> Function:
        if isinstance(value, (LayerInstance, BuiltinFn)) and not _needs_params(value):
            return value
        return LayerInstance(value, join(self.scope.path, name), span)

    def _output(self, item: ast.Loss | ast.Predict) -> None:
        what = "loss" if isinstance(item, ast.Loss) else "predict"
        if (self.loss if what == "loss" else self.predict) is not None:
            raise DslProgramError(f"`{what}` is defined twice", item.span)
        value = self.eval(item.value, self.globals, name=None)
        if not isinstance(value, TensorVal):
            raise DslTypeError(f"`{what}` must be a tensor, got {describe(value)}", item.value.span)
        if what == "loss":
            if value.shape != ():
                raise DslShapeError(
                    f"the loss must be a scalar, but it is {value.value.type} (from {value.origin})",
                    item.value.span, hint="wrap the scores in a loss, e.g. softmax_cross_entropy(net(x), y)",
                )  # fmt: skip
            self.loss = value
            self.loss_span = item.span
            self.loss_terms = self._loss_terms(item.value)
        else:
            self.predict = value

    def _loss_terms(self, e: ast.Expr) -> list[tuple[str, TensorVal]]:
        """The terms of a loss such as `rec + 0.5 * kl`: each top-level name its arithmetic reads (not inside a
        call) that is bound to a scalar tensor, in order of first use; none where the loss is one name or call."""
        found: dict[str, TensorVal] = {}

        def go(x: ast.Expr) -> None:
            if isinstance(x, ast.Name):
                v = self.globals.values.get(x.name)
                if isinstance(v, TensorVal) and v.shape == () and x.name not in found:
                    found[x.name] = v
            elif isinstance(x, ast.Binary):
                go(x.left)
                go(x.right)
            elif isinstance(x, ast.Unary):
                go(x.operand)

        if isinstance(e, (ast.Binary, ast.Unary)):
            go(e)
        return list(found.items())

    # ---- expressions ----

    def eval(self, e: ast.Expr, env: Env, name: str | None = None) -> Any:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise DslProgramError("the program is too large to unroll (over 2,000,000 evaluation steps)", e.span)
        if isinstance(e, ast.IntLit):
            return self._int(e.value, e.span)
        if isinstance(e, ast.FloatLit) and not math.isfinite(e.value):
            raise DslProgramError("this number is too large for a float", e.span)
        if isinstance(e, (ast.FloatLit, ast.StrLit, ast.BoolLit)):
            return e.value
        if isinstance(e, ast.Name):
            return self.lookup(e.name, env, e.span)
        if isinstance(e, ast.TupleLit):
            return tuple(self.eval(i, env) for i in e.items)
        if isinstance(e, ast.Unary):
            return arith.unary(self, e, self.eval(e.operand, env))
        if isinstance(e, ast.Binary):
            return arith.binary(self, e, env)
        if isinstance(e, ast.Compose):
            outer, inner = self.eval(e.outer, env), self.eval(e.inner, env)
            for side, v in (("left", outer), ("right", inner)):
                if not isinstance(v, Function):
                    raise DslTypeError(f"`o` composes functions, but its {side} side is {describe(v)}", e.span)
            return Composed(outer, inner)
        if isinstance(e, ast.IfExpr):
            cond = self.eval(e.cond, env)
            if not isinstance(cond, bool):
                raise DslTypeError(f"a condition must be true or false, got {describe(cond)}", e.cond.span)
            return self.eval(e.then if cond else e.other, env, name)
        if isinstance(e, ast.Call):
            fn = self.eval(e.func, env)
            args = tuple(CallArg(a.name, self.eval(a.value, env), a.span) for a in e.args)
            return calls.call(self, fn, args, e.span, name=name)
        raise AssertionError(f"unknown expression {e!r}")

    def lookup(self, name: str, env: Env, span: Span) -> Any:
        try:
            value = env.lookup(name)
        except KeyError:
            value = None
            if name in BUILTINS or name in SPECS or name in QUERIES:
                return BuiltinFn(name)
            if name in self.declared:
                line = self.declared[name].line
                raise DslNameError(f"'{name}' is used before its definition on line {line}", span) from None
            known = env.names() | set(BUILTINS) | set(SPECS) | set(QUERIES)
            raise DslNameError(f"unknown name '{name}'", span, hint=did_you_mean(name, known)) from None
        if value is _POISON:
            raise Poisoned(name)
        return value

    def eval_int(self, e: ast.Expr, env: Env, what: str, low: int | None = None) -> int:
        v = self.eval(e, env)
        if not isinstance(v, int) or isinstance(v, bool):
            raise DslTypeError(f"{what} must be an integer, got {describe(v)}", e.span)
        if low is not None and v < low:
            raise DslShapeError(f"{what} must be at least {low}, got {v}", e.span)
        return v

    def _set_value(self, name: str) -> int | float:
        """A --set value, within the limits of a literal."""
        v = self.sets[name]
        if isinstance(v, int) and abs(v) >= INT_LIMIT:
            raise DslArgumentError(f"--set {name}={v}: the integer is too large (at most 2^62 - 1)", None)
        if isinstance(v, float) and not math.isfinite(v):
            raise DslArgumentError(f"--set {name}={v}: a const must be a finite number", None)
        return v

    def _int(self, v: int, span: Span) -> int:
        if abs(v) >= INT_LIMIT:
            raise DslProgramError(f"integer {v} is too large", span)
        return v

    # ---- calls ----

    def block(self, stmts: tuple[ast.Stmt, ...], env: Env) -> None:
        for s in stmts:
            self.steps += 1
            if isinstance(s, ast.Assign):
                value = self.eval(s.value, env)
                if isinstance(value, Function):
                    value = self._instance(value, s.name, s.span)
                env.values[s.name] = value
            elif isinstance(s, ast.For):
                lo = self.eval_int(s.start, env, "a loop bound")
                hi = self.eval_int(s.stop, env, "a loop bound")
                for i in range(lo, hi):
                    env.values[s.var] = i
                    self.block(s.body, env)
                    if self.steps > MAX_STEPS:
                        raise DslProgramError("the program is too large to unroll", s.span)
            elif isinstance(s, ast.If):
                cond = self.eval(s.cond, env)
                if not isinstance(cond, bool):
                    raise DslTypeError(f"a condition must be true or false, got {describe(cond)}", s.cond.span)
                self.block(s.then if cond else s.other, env)

    # ---- what built-ins and tensor functions call back ----

    def param(
        self, path: str, local: str, shape: tuple[int, ...], init: Spec, span: Span, kind: str = "param"
    ) -> TensorVal:
        """Make parameter `path.local` (or return it, for a shared layer applied again)."""
        if math.prod(shape) > MAX_ELEMENTS:
            raise too_many(f"parameter {join(path, local)}", TensorType(shape), span)
        return self.params.make(self.scope, path, local, shape, init, span, kind)

    def emit(self, op: str, xs: tuple[TensorVal, ...], span: Span, path: str, kind: str, **attrs: Any) -> TensorVal:
        if len(self.b.stmts) >= MAX_STATEMENTS:
            raise DslProgramError(
                f"the network has more than {MAX_STATEMENTS:,} statements", span,
                hint="a loop bound or a depth may be larger than meant",
            )  # fmt: skip
        for key, value in attrs.items():
            if too_large(value):
                raise DslArgumentError(f"{kind}: {key}={value} holds an integer above {INT_MAX:,} (2^31 - 1), which "
                                       "the generated programs cannot hold", span)  # fmt: skip
        notes = [Note(f"{x.value.type} comes from {x.origin}", x.span) for x in xs if "parameter" not in x.origin]
        try:
            v = self.b.emit(op, *(x.value for x in xs), span=span, layer=path, **attrs)
        except ShapeError as exc:
            raise DslShapeError(str(exc), span, notes=notes) from None
        origin = f"{kind} '{path}'" if path else f"`{kind}`"
        if v.type.numel > MAX_ELEMENTS:
            raise too_many(f"the result of {kind}", v.type, span, notes)
        return TensorVal(v, origin, span)


# ---- helpers ----


def _needs_params(fn: Function) -> bool:
    """A built-in that makes parameters (`layer ln = layer_norm`): bound once, so that every use shares them."""
    return isinstance(fn, BuiltinFn) and BUILTINS[fn.name].params
