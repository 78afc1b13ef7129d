"""Elaboration: AST -> the forward tensor program (an `ir.Graph`), every shape known.

Names are resolved (with "did you mean" hints), consts evaluated (`--set` overrides them), `layer`
bindings made once with shared parameters, defs called with fresh parameters named by call path
(DESIGN §2.3), loops unrolled, conditions decided, and every built-in and tensor function lowered to
registry ops through the GraphBuilder, whose shape rules check every statement. Errors in one item are
collected and elaboration goes on with the next, so several are reported at once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from deepdsl.errors import (
    Diagnostics,
    DslArgumentError,
    DslError,
    DslNameError,
    DslProgramError,
    DslRecursionError,
    DslShapeError,
    DslTypeError,
    DslWarning,
    Note,
    Span,
    did_you_mean,
)
from deepdsl.frontend import ast
from deepdsl.frontend.builtins import BUILTINS, QUERIES, REQUIRED, SPECS, ArgSpec
from deepdsl.frontend.program import LayerRow, Program
from deepdsl.frontend.train import train_config
from deepdsl.frontend.values import (
    BuiltinFn,
    Composed,
    DefFn,
    Function,
    LayerInstance,
    Partial,
    Scope,
    Spec,
    TensorFn,
    TensorVal,
    describe,
)
from deepdsl.ir import GraphBuilder, Init, InputDef, ParamDef, ShapeError, TensorType, Value
from deepdsl.ir.types import DType

MAX_STEPS = 2_000_000  # evaluation steps before we call a program too large to unroll
INT_LIMIT = 2**62


class Poisoned(Exception):
    """A name whose definition already failed; its uses are not reported again."""


_POISON = object()


class Env:
    def __init__(self, values: dict[str, Any], parent: Env | None = None):
        self.values = values
        self.parent = parent

    def lookup(self, name: str) -> Any:
        env: Env | None = self
        while env is not None:
            if name in env.values:
                return env.values[name]
            env = env.parent
        raise KeyError(name)

    def names(self) -> set[str]:
        out: set[str] = set()
        env: Env | None = self
        while env is not None:
            out |= set(env.values)
            env = env.parent
        return out


@dataclass(frozen=True)
class CallArg:
    name: str | None
    value: Any
    span: Span


class Elaborator:
    def __init__(self, module: ast.Module, modules: dict[str, ast.Module], sets: dict[str, int | float]):
        self.module = module
        self.modules = modules  # included files by path, already parsed
        self.sets = dict(sets)
        self.diags = Diagnostics()
        self.b = GraphBuilder(module.network or "Network")
        self.globals = Env({})
        self.declared: dict[str, Span] = {}  # every top-level name, for "used before its definition"
        self.store: dict[str, tuple[TensorVal, int, int]] = {}  # param name -> (value, owner id, application)
        self.param_spans: dict[str, Span] = {}
        self.rows: list[LayerRow] = []
        self.def_stack: list[str] = []
        self.scope = Scope("")
        self.steps = 0
        self.applications = 0
        self.loss: TensorVal | None = None
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
        self._hoist(m, [])
        for item in m.items:
            try:
                self._item(item)
            except (Poisoned, DslError) as err:
                if isinstance(err, DslError):
                    self.diags.add(err)
                for name in _bound_names(item):
                    self.globals.values[name] = _POISON
            except RecursionError:
                self.diags.add(DslProgramError("the expression is nested too deeply", item.span))
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
        self.diags.raise_if_errors()
        assert self.loss is not None and train is not None
        self.b.output("loss", self.loss.value)
        if self.predict is not None:
            self.b.output("predict", self.predict.value)
        graph = self.b.build()
        self._warn_unused(graph)
        return Program(graph, tuple(self.rows), train, tuple(self.diags.warnings))

    def _const_names(self) -> set[str]:
        return {i.name for mod in [self.module] for i in mod.items if isinstance(i, ast.Const)}

    def _hoist(self, m: ast.Module, stack: list[str]) -> None:
        """Defs and tensor functions (of this file and its includes) are visible everywhere."""
        for item in m.items:
            if isinstance(item, ast.Include):
                self._include(item, m, stack)
            elif isinstance(item, (ast.Def, ast.TensorDef)):
                if self._declare(item.name, item.span):
                    self.globals.values[item.name] = DefFn(item) if isinstance(item, ast.Def) else TensorFn(item)
            elif m is self.module:
                for name in _bound_names(item):
                    self._declare(name, item.span, define=False)

    def _include(self, item: ast.Include, m: ast.Module, stack: list[str]) -> None:
        key = _resolve(m.file, item.path)
        if key in stack or key == self.module.file:
            self.diags.add(DslProgramError(f"include cycle: {' -> '.join([*stack, key])}", item.span))
            return
        sub = self.modules.get(key)
        if isinstance(sub, DslError):
            self.diags.add(sub)
            return
        if sub is None:
            self.diags.add(DslProgramError(f"cannot read included file '{item.path}'", item.span))
            return
        for inner in sub.items:
            if not isinstance(inner, (ast.Def, ast.TensorDef, ast.Include)):
                self.diags.add(
                    DslProgramError("an included file may hold only def, tensor and include items", inner.span)
                )
        self._hoist(sub, [*stack, key])

    def _declare(self, name: str, span: Span, define: bool = True) -> bool:
        if name in self.declared and self.declared[name] != span:
            first = self.declared[name]
            self.diags.add(DslNameError(f"'{name}' is defined twice", span, notes=[Note("first defined here", first)]))
            return False
        if name in BUILTINS or name in SPECS or name in QUERIES:
            self.diags.add(DslNameError(f"'{name}' is a built-in and cannot be redefined", span))
            return False
        self.declared[name] = span
        return True

    # ---- items ----

    def _item(self, item: ast.Item) -> None:
        g = self.globals
        if isinstance(item, ast.Const):
            value = self.sets[item.name] if item.name in self.sets else self.eval(item.value, g)
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise DslTypeError(f"a const must be a number, got {describe(value)}", item.value.span)
            g.values[item.name] = value
        elif isinstance(item, (ast.Input, ast.Label)):
            dims = tuple(self.eval_int(d, g, "a dimension", low=1) for d in item.shape)
            if isinstance(item, ast.Input):
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
        return LayerInstance(value, _join(self.scope.path, name), span)

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
        else:
            self.predict = value

    # ---- expressions ----

    def eval(self, e: ast.Expr, env: Env, name: str | None = None) -> Any:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise DslProgramError("the program is too large to unroll (over 2,000,000 evaluation steps)", e.span)
        if isinstance(e, ast.IntLit):
            return self._int(e.value, e.span)
        if isinstance(e, (ast.FloatLit, ast.StrLit, ast.BoolLit)):
            return e.value
        if isinstance(e, ast.Name):
            return self.lookup(e.name, env, e.span)
        if isinstance(e, ast.TupleLit):
            return tuple(self.eval(i, env) for i in e.items)
        if isinstance(e, ast.Unary):
            return self._unary(e, self.eval(e.operand, env))
        if isinstance(e, ast.Binary):
            return self._binary(e, env)
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
            return self.call(fn, args, e.span, name=name)
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

    def _int(self, v: int, span: Span) -> int:
        if abs(v) >= INT_LIMIT:
            raise DslProgramError(f"integer {v} is too large", span)
        return v

    def _unary(self, e: ast.Unary, v: Any) -> Any:
        if e.op == "not":
            if not isinstance(v, bool):
                raise DslTypeError(f"`not` needs true or false, got {describe(v)}", e.span)
            return not v
        if isinstance(v, TensorVal):
            return self.emit("neg", (v,), e.span, "", "-")
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return -v
        raise DslTypeError(f"cannot negate {describe(v)}", e.span)

    def _binary(self, e: ast.Binary, env: Env) -> Any:
        if e.op in ("and", "or"):
            left = self.eval(e.left, env)
            if not isinstance(left, bool):
                raise DslTypeError(f"`{e.op}` needs true or false, got {describe(left)}", e.left.span)
            if (e.op == "and" and not left) or (e.op == "or" and left):
                return left
            right = self.eval(e.right, env)
            if not isinstance(right, bool):
                raise DslTypeError(f"`{e.op}` needs true or false, got {describe(right)}", e.right.span)
            return right
        a, b = self.eval(e.left, env), self.eval(e.right, env)
        if isinstance(a, TensorVal) or isinstance(b, TensorVal):
            return self._tensor_arith(e, a, b)
        if e.op in ("==", "!="):
            if isinstance(a, Function) or isinstance(b, Function):
                raise DslTypeError("functions cannot be compared", e.span)
            return (a == b) == (e.op == "==")
        num = (int, float)
        if not isinstance(a, num) or isinstance(a, bool) or not isinstance(b, num) or isinstance(b, bool):
            raise DslTypeError(f"`{e.op}` needs numbers, got {describe(a)} and {describe(b)}", e.span)
        return self._number_op(e, a, b)

    def _number_op(self, e: ast.Binary, a: float, b: float) -> Any:
        both_int = isinstance(a, int) and isinstance(b, int)
        op = e.op
        if op in ("/", "%") and b == 0:
            raise DslProgramError("division by zero", e.span)
        if op == "^":
            if both_int and b < 0:
                raise DslProgramError("an integer power needs a non-negative exponent", e.span)
            if abs(b) > 4096 or (both_int and abs(a) > 1 and b * max(1, int(abs(a)).bit_length()) > 62):
                raise DslProgramError("the power is too large", e.span)
        ops: dict[str, Callable[[Any, Any], Any]] = {
            "+": lambda x, y: x + y, "-": lambda x, y: x - y, "*": lambda x, y: x * y,
            "/": lambda x, y: x // y if both_int else x / y, "%": lambda x, y: x % y, "^": lambda x, y: x**y,
            "==": lambda x, y: x == y, "!=": lambda x, y: x != y, "<": lambda x, y: x < y,
            "<=": lambda x, y: x <= y, ">": lambda x, y: x > y, ">=": lambda x, y: x >= y,
        }  # fmt: skip
        try:
            result = ops[op](a, b)
        except (OverflowError, ZeroDivisionError, ValueError) as exc:
            raise DslProgramError(f"cannot compute `{op}`: {exc}", e.span) from None
        return self._int(result, e.span) if isinstance(result, int) and not isinstance(result, bool) else result

    def _tensor_arith(self, e: ast.Binary, a: Any, b: Any) -> TensorVal:
        num = (int, float)
        op = e.op
        if isinstance(a, TensorVal) and isinstance(b, TensorVal):
            names = {"+": "add", "-": "sub", "*": "mul", "/": "div"}
            if op not in names:
                raise DslTypeError(f"`{op}` is not defined between two tensors", e.span)
            if a.shape != b.shape:
                raise DslShapeError(
                    f"`{op}` needs tensors of one shape, got {a.value.type} and {b.value.type}", e.span,
                    notes=[Note(f"{a.value.type} comes from {a.origin}", a.span),
                           Note(f"{b.value.type} comes from {b.origin}", b.span)],
                    hint="tensor arithmetic is element-wise and never broadcasts silently",
                )  # fmt: skip
            return self.emit(names[op], (a, b), e.span, "", op)
        t, c = (a, b) if isinstance(a, TensorVal) else (b, a)
        if not isinstance(c, num) or isinstance(c, bool):
            raise DslTypeError(f"`{op}` between a tensor and {describe(c)}", e.span)
        c = float(c)
        left = t is a
        if op == "+":
            return self.emit("add_scalar", (t,), e.span, "", op, value=c)
        if op == "*":
            return self.emit("mul_scalar", (t,), e.span, "", op, value=c)
        if op == "-":
            return (
                self.emit("add_scalar", (t,), e.span, "", op, value=-c)
                if left
                else self.emit("rsub_scalar", (t,), e.span, "", op, value=c)
            )
        if op == "/":
            if left and c == 0:
                raise DslProgramError("division by zero", e.span)
            return (
                self.emit("mul_scalar", (t,), e.span, "", op, value=1.0 / c)
                if left
                else self.emit("rdiv_scalar", (t,), e.span, "", op, value=c)
            )
        if op == "^" and left:
            return self.emit("pow_scalar", (t,), e.span, "", op, value=c)
        raise DslTypeError(f"`{op}` is not defined between {describe(a)} and {describe(b)}", e.span)

    # ---- calls ----

    def call(self, fn: Any, args: tuple[CallArg, ...], span: Span, name: str | None = None, own: bool = False) -> Any:
        """Apply `fn`. `own`: the callee names its parameters in the current scope itself (a layer
        instance's direct function); `name`: the top-level binding that names the call."""
        if isinstance(fn, BuiltinFn):
            return self._call_builtin(fn.name, args, span, name, own)
        if isinstance(fn, Partial):
            if isinstance(fn.fn, BuiltinFn):
                tensors = self._single_input(args, span, fn.fn.name)
                try:  # the statements point at the layer's definition; an error also at this use
                    return self._apply_builtin(fn.fn.name, tensors, dict(fn.args), fn.span, name, own)
                except DslError as err:
                    if err.span != span and not any(n.span == span for n in err.notes):
                        err.notes = (*err.notes, Note(f"{fn.fn.name} applied here", span))
                    raise
            first = self._single_input(args, span, "the function")
            inner = (CallArg(None, first[0], span), *(CallArg(k or None, v, span) for k, v in fn.args))
            return self.call(fn.fn, inner, span, name, own)
        if isinstance(fn, Composed):
            (x,) = self._single_input(args, span, "a composition")
            return self.call(fn.outer, (CallArg(None, self.call(fn.inner, args, span), span),), span)
        if isinstance(fn, LayerInstance):
            self.applications += 1
            saved = self.scope
            self.scope = Scope(fn.path, fn, self.applications)
            try:
                return self.call(fn.fn, args, span, own=True)
            finally:
                self.scope = saved
        if isinstance(fn, DefFn):
            return self._call_def(fn.node, args, span, name, own)
        if isinstance(fn, TensorFn):
            from deepdsl.frontend.tensorfn import call_tensor_fn

            explicit, args = _take_name(args)
            tensors = []
            for a in args:
                if a.name is not None or not isinstance(a.value, TensorVal):
                    raise DslArgumentError(
                        f"tensor function '{fn.node.name}' takes tensors, got {describe(a.value)}", a.span
                    )
                tensors.append(a.value)
            path = self._path(fn.node.name, explicit, name, own)
            return self._as_layer(
                fn.node.name, path, span, lambda: call_tensor_fn(self, fn.node, tuple(tensors), path, span)
            )
        raise DslTypeError(f"{describe(fn)} is not a function and cannot be called", span)

    def _single_input(self, args: tuple[CallArg, ...], span: Span, what: str) -> tuple[TensorVal, ...]:
        if len(args) != 1 or args[0].name is not None or not isinstance(args[0].value, TensorVal):
            got = ", ".join(describe(a.value) for a in args) or "nothing"
            raise DslArgumentError(f"{what} is applied to one tensor, got {got}", span)
        return (args[0].value,)

    def _path(self, base: str, explicit: str | None, name: str | None, own: bool) -> str:
        if own:
            return self.scope.path
        if explicit is None and name is not None and not self.scope.path:
            return name
        return self.scope.child_path(base, explicit)

    def _call_builtin(self, fname: str, args: tuple[CallArg, ...], span: Span, name: str | None, own: bool) -> Any:
        if fname in SPECS:
            family, specs = SPECS[fname]
            bound = self.bind_args(fname, specs, args, span)
            return Spec(family, fname, tuple(bound.items()))
        if fname in QUERIES:
            return self._query(fname, args, span)
        b = BUILTINS[fname]
        positional = [a for a in args if a.name is None]
        if b.inputs == -1:
            tensors = tuple(a.value for a in positional if isinstance(a.value, TensorVal))
            rest = tuple(a for a in args if not (a.name is None and isinstance(a.value, TensorVal)))
        elif positional and isinstance(positional[0].value, TensorVal):
            lead = [a.value for a in positional[: b.inputs]]
            if len(lead) < b.inputs or not all(isinstance(v, TensorVal) for v in lead):
                raise DslArgumentError(f"{fname} takes {b.inputs} tensors", span)
            tensors = tuple(lead)
            rest = tuple(a for a in args if a not in positional[: b.inputs])
        else:
            if b.inputs != 1:
                raise DslArgumentError(f"{fname} takes {b.inputs} tensors as its first arguments", span)
            explicit, rest = _take_name(args)
            bound = self.bind_args(fname, b.args, rest, span)
            if explicit is not None:
                bound["name"] = explicit
            return Partial(BuiltinFn(fname), tuple(bound.items()), span)
        explicit, rest = _take_name(rest)
        bound = self.bind_args(fname, b.args, rest, span)
        if explicit is not None:
            bound["name"] = explicit
        return self._apply_builtin(fname, tensors, bound, span, name, own)

    def _apply_builtin(
        self, fname: str, xs: tuple[TensorVal, ...], bound: dict[str, Any], span: Span, name: str | None, own: bool
    ) -> TensorVal:
        b = BUILTINS[fname]
        bound = dict(bound)
        explicit = bound.pop("name", None)
        for x in xs:
            if not isinstance(x, TensorVal):
                raise DslArgumentError(f"{fname} takes tensors, got {describe(x)}", span)
        path = self._path(fname, explicit, name, own) if b.layer else ""
        return self._as_layer(fname, path, span, lambda: b.apply(self, path, xs, bound, span), b.layer)

    def _as_layer(self, kind: str, path: str, span: Span, run: Callable[[], TensorVal], row: bool = True) -> TensorVal:
        before, params_before = len(self.b.stmts), len(self.b.params)
        out = run()
        if row and len(self.b.stmts) > before:
            count = sum(p.value.type.numel for p in self.b.params[params_before:] if p.kind == "param")
            self.rows.append(LayerRow(path, kind, out.value.type, count, span))
        return out

    def _query(self, fname: str, args: tuple[CallArg, ...], span: Span) -> int:
        want = 1 + QUERIES[fname]
        if len(args) != want or any(a.name for a in args) or not isinstance(args[0].value, TensorVal):
            extra = ", axis" if fname == "dim" else ""
            raise DslArgumentError(f"{fname} takes (tensor{extra})", span)
        shape = args[0].value.shape
        if fname == "rank":
            return len(shape)
        axis = 1 if fname == "channels" else args[1].value
        if not isinstance(axis, int) or isinstance(axis, bool) or not -len(shape) <= axis < len(shape):
            raise DslArgumentError(f"axis {axis!r} is out of range for a rank-{len(shape)} tensor", args[-1].span)
        return shape[axis]

    def bind_args(
        self, fname: str, specs: tuple[ArgSpec, ...], args: tuple[CallArg, ...], span: Span
    ) -> dict[str, Any]:
        """Match arguments to a built-in's signature, convert and range-check them."""
        out: dict[str, Any] = {}
        where: dict[str, Span] = {}
        positional = [a for a in args if a.name is None]
        if len(positional) > len(specs):
            extra = positional[len(specs)]
            b = BUILTINS.get(fname)
            count = {-1: "any number of tensors", 1: "1 tensor"}
            tensors = "" if b is None else count.get(b.inputs, f"{b.inputs} tensors")
            rest = ", ".join(s.name for s in specs)
            takes = " then ".join(t for t in (tensors, rest) if t) or "no arguments"
            raise DslArgumentError(f"too many arguments for {fname}: it takes {takes}", extra.span)
        for spec, a in zip(specs, positional):
            out[spec.name], where[spec.name] = a.value, a.span
        names = [s.name for s in specs]
        for a in args:
            if a.name is None:
                continue
            if a.name not in names:
                raise DslArgumentError(
                    f"{fname} has no argument '{a.name}'", a.span, hint=did_you_mean(a.name, names)
                    or (f"its arguments are: {', '.join(names)}" if names else f"{fname} takes no arguments"),
                )  # fmt: skip
            if a.name in out:
                raise DslArgumentError(f"argument '{a.name}' of {fname} is given twice", a.span)
            out[a.name], where[a.name] = a.value, a.span
        for spec in specs:
            if spec.name not in out:
                if spec.default is REQUIRED:
                    sig = ", ".join(s.name if s.default is REQUIRED else f"{s.name}=..." for s in specs)
                    raise DslArgumentError(f"{fname} needs its argument '{spec.name}'", span, hint=f"{fname}({sig})")
                out[spec.name], where[spec.name] = spec.default, span
            if out[spec.name] is not None or spec.default is not None:
                out[spec.name] = _convert(fname, spec, out[spec.name], where[spec.name])
        return out

    def _call_def(self, node: ast.Def, args: tuple[CallArg, ...], span: Span, name: str | None, own: bool) -> Any:
        explicit = None
        if not any(p.name == "name" for p in node.params):
            explicit, args = _take_name(args)
        try:
            env = self._bind_def(node, args, span)
        except DslArgumentError:
            # `bottleneck(64, 256)` with the input left out: a function waiting for it
            first = next((a for a in args if a.name is None), None)
            takes_input = first is None or not isinstance(first.value, TensorVal)
            if node.params and takes_input and not any(a.name == node.params[0].name for a in args):
                try:
                    self._bind_def(node, (CallArg(None, None, span), *args), span)
                except DslArgumentError:
                    pass
                else:
                    kept = tuple((a.name or "", a.value) for a in args)
                    if explicit is not None:
                        kept += (("name", explicit),)
                    return Partial(DefFn(node), kept, span)
            raise
        if node.name in self.def_stack:
            chain = " -> ".join([*self.def_stack[self.def_stack.index(node.name) :], node.name])
            raise DslRecursionError(f"recursive call of '{node.name}' ({chain}); defs cannot recurse", span)
        path = self._path(node.name, explicit, name, own)
        saved = self.scope
        self.scope = saved if own else Scope(path, saved.owner, saved.application)
        self.def_stack.append(node.name)
        try:
            self.block(node.body.stmts, env)
            return self.eval(node.body.result, env)
        finally:
            self.def_stack.pop()
            self.scope = saved

    def _bind_def(self, node: ast.Def, args: tuple[CallArg, ...], span: Span) -> Env:
        values: dict[str, Any] = {}
        params = [p.name for p in node.params]
        positional = [a for a in args if a.name is None]
        if len(positional) > len(params):
            raise DslArgumentError(
                f"'{node.name}' takes {len(params)} arguments, got {len(positional)}", positional[len(params)].span
            )
        for p, a in zip(params, positional):
            values[p] = a.value
        for a in args:
            if a.name is None:
                continue
            if a.name not in params:
                raise DslArgumentError(
                    f"'{node.name}' has no parameter '{a.name}'", a.span, hint=did_you_mean(a.name, params)
                )
            if a.name in values:
                raise DslArgumentError(f"argument '{a.name}' of '{node.name}' is given twice", a.span)
            values[a.name] = a.value
        for p in node.params:
            if p.name not in values:
                if p.default is None:
                    raise DslArgumentError(f"'{node.name}' needs its argument '{p.name}'", span)
                values[p.name] = self.eval(p.default, self.globals)
        return Env(values, self.globals)

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
        full = _join(path, local)
        if any(d <= 0 for d in shape):
            raise DslShapeError(f"parameter {full} would have the shape {list(shape)}", span)
        owner = id(self.scope.owner) if self.scope.owner is not None else 0
        if full in self.store:
            value, who, app = self.store[full]
            if owner and who == owner and app != self.scope.application:
                if value.shape != shape:
                    raise DslShapeError(
                        f"the shared layer '{self.scope.path}' is applied to an input of another shape: "
                        f"{full} was made {value.value.type}, here it would be {TensorType(shape)}", span,
                        notes=[Note("its first application", self.param_spans[full])],
                    )  # fmt: skip
                return value
            raise DslNameError(
                f"parameter name '{full}' is already used",
                span,
                notes=[Note("first made here", self.param_spans[full])],
                hint='give one of the calls another name="..."',
            )
        t = TensorType(shape)
        fan_in, fan_out = _fans(shape)
        init_args = tuple(float(v) for _, v in init.args)
        pdef = ParamDef(Value(full, t), Init(init.name, init_args, fan_in, fan_out), kind, path, span)
        value = TensorVal(self.b.add_param(pdef), f"parameter '{full}'", span)
        self.store[full] = (value, owner, self.scope.application)
        self.param_spans[full] = span
        return value

    def emit(self, op: str, xs: tuple[TensorVal, ...], span: Span, path: str, kind: str, **attrs: Any) -> TensorVal:
        try:
            v = self.b.emit(op, *(x.value for x in xs), span=span, layer=path, **attrs)
        except ShapeError as exc:
            notes = [Note(f"{x.value.type} comes from {x.origin}", x.span) for x in xs if "parameter" not in x.origin]
            raise DslShapeError(str(exc), span, notes=notes) from None
        origin = f"{kind} '{path}'" if path else f"`{kind}`"
        return TensorVal(v, origin, span)

    def _warn_unused(self, graph: Any) -> None:
        needed = {graph.output("loss").name}
        for s in reversed(graph.stmts):
            if s.out.name in needed:
                needed.update(v.name for v in s.inputs)
        unused: dict[str, list[ParamDef]] = {}
        for p in graph.trainable:
            if p.value.name not in needed:
                unused.setdefault(p.layer, []).append(p)
        for layer, params in unused.items():
            listed = ", ".join(p.value.name for p in params)
            self.diags.add(
                DslWarning(f"the parameters of '{layer}' ({listed}) do not affect the loss and will not be trained",
                           params[0].span)  # fmt: skip
            )


# ---- helpers ----


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _fans(shape: tuple[int, ...]) -> tuple[int, int]:
    if len(shape) == 1:
        return shape[0], shape[0]
    receptive = 1
    for d in shape[2:]:
        receptive *= d
    return shape[1] * receptive, shape[0] * receptive


def _take_name(args: tuple[CallArg, ...]) -> tuple[str | None, tuple[CallArg, ...]]:
    explicit = None
    rest = []
    for a in args:
        if a.name == "name":
            if not isinstance(a.value, str) or not a.value.isidentifier():
                raise DslArgumentError("name= takes a string that is a plain identifier", a.span)
            explicit = a.value
        else:
            rest.append(a)
    return explicit, tuple(rest)


def _needs_params(fn: Function) -> bool:
    return isinstance(fn, BuiltinFn) and fn.name in ("conv", "full", "batch_norm")


def _bound_names(item: ast.Item) -> tuple[str, ...]:
    if isinstance(item, (ast.Const, ast.Input, ast.Label, ast.Layer, ast.Bind)):
        return (item.name,)
    return ()


def _resolve(base: str, rel: str) -> str:
    from pathlib import Path

    return str((Path(base).parent / rel).resolve())


def _convert(fname: str, spec: ArgSpec, v: Any, span: Span) -> Any:
    """Check one argument against its spec; ints widen to floats, an int is a square pair."""

    def bad(want: str) -> DslArgumentError:
        return DslArgumentError(f"argument '{spec.name}' of {fname} must be {want}, got {describe(v)}", span)

    def check_range(x: float) -> None:
        if spec.low is not None and x < spec.low:
            raise DslArgumentError(f"argument '{spec.name}' of {fname} must be at least {spec.low:g}, got {x:g}", span)
        if spec.below is not None and x >= spec.below:
            raise DslArgumentError(
                f"argument '{spec.name}' of {fname} must be less than {spec.below:g}, got {x:g}", span
            )

    is_int = isinstance(v, int) and not isinstance(v, bool)
    if spec.kind == "int":
        if not is_int:
            raise bad("an integer")
        check_range(v)
        return v
    if spec.kind == "pair":
        pair = (v, v) if is_int else v
        if not (
            isinstance(pair, tuple)
            and len(pair) == 2
            and all(isinstance(p, int) and not isinstance(p, bool) for p in pair)
        ):
            raise bad("an integer or a pair (h, w)")
        for p in pair:
            check_range(p)
        return tuple(pair)
    if spec.kind == "float":
        if not (is_int or isinstance(v, float)):
            raise bad("a number")
        check_range(float(v))
        return float(v)
    if spec.kind == "bool":
        if not isinstance(v, bool):
            raise bad("true or false")
        return v
    if spec.kind == "str":
        if not isinstance(v, str):
            raise bad("a string")
        return v
    if spec.kind == "init":
        if isinstance(v, BuiltinFn) and v.name in SPECS and SPECS[v.name][0] == "init" and not SPECS[v.name][1]:
            return Spec("init", v.name, ())
        if not (isinstance(v, Spec) and v.family == "init"):
            raise bad("an initialiser such as he(), xavier(), gaussian(0.01), uniform(0.1) or constant(0)")
        return v
    raise AssertionError(spec.kind)
