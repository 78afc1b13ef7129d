"""Calls during elaboration: built-in layers, partial applications, compositions, defs, tensor
functions and shared layer instances, with their naming scopes and argument checking."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from deepdsl.errors import DslArgumentError, DslError, DslRecursionError, DslTypeError, Note, Span, did_you_mean
from deepdsl.frontend import ast
from deepdsl.frontend.builtins import BUILTINS, QUERIES, REQUIRED, SPECS, ArgSpec
from deepdsl.frontend.program import LayerRow
from deepdsl.frontend.values import (
    BuiltinFn,
    Composed,
    DefFn,
    Env,
    LayerInstance,
    Partial,
    Scope,
    Spec,
    TensorFn,
    TensorVal,
    describe,
)
from deepdsl.ir.types import INT_MAX

if TYPE_CHECKING:
    from deepdsl.frontend.elaborate import Elaborator


@dataclass(frozen=True)
class CallArg:
    name: str | None
    value: Any
    span: Span


def call(
    el: Elaborator, fn: Any, args: tuple[CallArg, ...], span: Span, name: str | None = None, own: bool = False
) -> Any:
    """Apply `fn`. `own`: the callee names its parameters in the current scope itself (a layer
    instance's direct function); `name`: the top-level binding that names the call."""
    if isinstance(fn, BuiltinFn):
        return call_builtin(el, fn.name, args, span, name, own)
    if isinstance(fn, Partial):
        if isinstance(fn.fn, BuiltinFn):
            tensors = single_input(el, args, span, fn.fn.name)
            try:  # the statements point at the layer's definition; an error also at this use
                return apply_builtin(el, fn.fn.name, tensors, dict(fn.args), fn.span, name, own)
            except DslError as err:
                if err.span != span and not any(n.span == span for n in err.notes):
                    err.notes = (*err.notes, Note(f"{fn.fn.name} applied here", span))
                raise
        first = single_input(el, args, span, "the function")
        inner = (CallArg(None, first[0], span), *(CallArg(k or None, v, span) for k, v in fn.args))
        return call(el, fn.fn, inner, span, name, own)
    if isinstance(fn, Composed):
        (x,) = single_input(el, args, span, "a composition")
        return call(el, fn.outer, (CallArg(None, call(el, fn.inner, args, span), span),), span)
    if isinstance(fn, LayerInstance):
        el.applications += 1
        saved = el.scope
        el.scope = Scope(fn.path, fn, el.applications, applied_at=span)
        try:
            return call(el, fn.fn, args, span, own=True)
        finally:
            el.scope = saved
    if isinstance(fn, DefFn):
        return call_def(el, fn.node, args, span, name, own)
    if isinstance(fn, TensorFn):
        from deepdsl.frontend.tensorfn import call_tensor_fn

        explicit, args = take_name(args)
        tensors = []
        for a in args:
            if a.name is not None or not isinstance(a.value, TensorVal):
                raise DslArgumentError(
                    f"tensor function '{fn.node.name}' takes tensors, got {describe(a.value)}", a.span
                )
            tensors.append(a.value)
        path = call_path(el, fn.node.name, explicit, name, own)
        return as_layer(el, fn.node.name, path, span, lambda: call_tensor_fn(el, fn.node, tuple(tensors), path, span))
    raise DslTypeError(f"{describe(fn)} is not a function and cannot be called", span)


def single_input(el: Elaborator, args: tuple[CallArg, ...], span: Span, what: str) -> tuple[TensorVal, ...]:
    if len(args) != 1 or args[0].name is not None or not isinstance(args[0].value, TensorVal):
        got = ", ".join(describe(a.value) for a in args) or "nothing"
        raise DslArgumentError(f"{what} is applied to one tensor, got {got}", span)
    return (args[0].value,)


def call_path(el: Elaborator, base: str, explicit: str | None, name: str | None, own: bool) -> str:
    if own:
        return el.scope.path
    if explicit is None and name is not None and not el.scope.path:
        return name
    return el.scope.child_path(base, explicit)


def call_builtin(el: Elaborator, fname: str, args: tuple[CallArg, ...], span: Span, name: str | None, own: bool) -> Any:
    if fname in SPECS and not (fname in BUILTINS and BUILTINS[fname].inputs == 0 and _shape_call(args)):
        family, specs = SPECS[fname]
        bound = bind_args(el, fname, specs, args, span)
        return Spec(family, fname, tuple(bound.items()))
    if fname in QUERIES:
        return query(el, fname, args, span)
    b = BUILTINS[fname]
    positional = [a for a in args if a.name is None]
    if b.inputs == 0:  # a built-in of no tensor (normal, uniform): its arguments only
        tensors, rest = (), args
    elif b.inputs == -1:
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
        explicit, rest = take_name(args)
        bound = bind_args(el, fname, b.args, rest, span)
        if explicit is not None:
            bound["name"] = explicit
        return Partial(BuiltinFn(fname), tuple(bound.items()), span)
    explicit, rest = take_name(rest)
    bound = bind_args(el, fname, b.args, rest, span)
    if explicit is not None:
        bound["name"] = explicit
    return apply_builtin(el, fname, tensors, bound, span, name, own)


def _shape_call(args: tuple[CallArg, ...]) -> bool:
    """`uniform((N, D), ...)`, the sampling built-in, not the initialiser `uniform(a)`: its first argument is a
    shape tuple, or it names shape=, low= or high=."""
    positional = [a for a in args if a.name is None]
    return bool(positional and isinstance(positional[0].value, tuple)) or any(
        a.name in ("shape", "low", "high") for a in args
    )


def apply_builtin(
    el: Elaborator,
    fname: str,
    xs: tuple[TensorVal, ...],
    bound: dict[str, Any],
    span: Span,
    name: str | None,
    own: bool,
) -> TensorVal:
    b = BUILTINS[fname]
    bound = dict(bound)
    explicit = bound.pop("name", None)
    for x in xs:
        if not isinstance(x, TensorVal):
            raise DslArgumentError(f"{fname} takes tensors, got {describe(x)}", span)
    path = call_path(el, fname, explicit, name, own) if b.layer else ""
    return as_layer(el, fname, path, span, lambda: b.apply(el, path, xs, bound, span), b.layer)


def as_layer(
    el: Elaborator, kind: str, path: str, span: Span, run: Callable[[], TensorVal], row: bool = True
) -> TensorVal:
    before, params_before = len(el.b.stmts), len(el.b.params)
    out = run()
    if row and len(el.b.stmts) > before:
        count = sum(p.value.type.numel for p in el.b.params[params_before:] if p.kind == "param")
        el.rows.append(LayerRow(path, kind, out.value.type, count, span))
    return out


def query(el: Elaborator, fname: str, args: tuple[CallArg, ...], span: Span) -> int:
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
    el: Elaborator, fname: str, specs: tuple[ArgSpec, ...], args: tuple[CallArg, ...], span: Span
) -> dict[str, Any]:
    """Match arguments to a built-in's signature, convert and range-check them."""
    positional = [a for a in args if a.name is None]
    by_position = [s for s in specs if not s.keyword]  # a keyword-only argument is never taken by position
    if len(positional) > len(by_position):
        extra = positional[len(by_position)]
        b = BUILTINS.get(fname)
        count = {-1: "any number of tensors", 1: "1 tensor"}
        tensors = "" if b is None else count.get(b.inputs, f"{b.inputs} tensors")
        rest = ", ".join(s.name for s in by_position)
        takes = " then ".join(t for t in (tensors, rest) if t) or "no arguments"
        raise DslArgumentError(f"too many arguments for {fname}: it takes {takes}", extra.span)
    names = [s.name for s in specs]
    listing = f"its arguments are: {', '.join(names)}" if names else f"{fname} takes no arguments"
    out, where = match_arguments(fname, "argument", names, args, listing)
    for spec in specs:
        if spec.name not in out:
            if spec.default is REQUIRED:
                sig = ", ".join(s.name if s.default is REQUIRED else f"{s.name}=..." for s in specs)
                raise DslArgumentError(f"{fname} needs its argument '{spec.name}'", span, hint=f"{fname}({sig})")
            out[spec.name], where[spec.name] = spec.default, span
        if out[spec.name] is not None or spec.default is not None:
            out[spec.name] = convert(fname, spec, out[spec.name], where[spec.name])
    return out


def call_def(el: Elaborator, node: ast.Def, args: tuple[CallArg, ...], span: Span, name: str | None, own: bool) -> Any:
    explicit = None
    if not any(p.name == "name" for p in node.params):
        explicit, args = take_name(args)
    try:
        env = bind_def(el, node, args, span)
    except DslArgumentError:
        # `bottleneck(64, 256)` with the input left out: a function waiting for it
        first = next((a for a in args if a.name is None), None)
        takes_input = first is None or not isinstance(first.value, TensorVal)
        if node.params and takes_input and not any(a.name == node.params[0].name for a in args):
            try:
                bind_def(el, node, (CallArg(None, None, span), *args), span)
            except DslArgumentError:
                pass
            else:
                kept = tuple((a.name or "", a.value) for a in args)
                if explicit is not None:
                    kept += (("name", explicit),)
                return Partial(DefFn(node), kept, span)
        raise
    if node.name in el.def_stack:
        chain = " -> ".join([*el.def_stack[el.def_stack.index(node.name) :], node.name])
        raise DslRecursionError(f"recursive call of '{node.name}' ({chain}); defs cannot recurse", span)
    path = call_path(el, node.name, explicit, name, own)
    saved = el.scope
    el.scope = saved if own else Scope(path, saved.owner, saved.application, applied_at=saved.applied_at)
    el.def_stack.append(node.name)
    try:
        el.block(node.body.stmts, env)
        return el.eval(node.body.result, env)
    finally:
        el.def_stack.pop()
        el.scope = saved


def bind_def(el: Elaborator, node: ast.Def, args: tuple[CallArg, ...], span: Span) -> Env:
    params = [p.name for p in node.params]
    positional = [a for a in args if a.name is None]
    if len(positional) > len(params):
        raise DslArgumentError(
            f"'{node.name}' takes {len(params)} arguments, got {len(positional)}", positional[len(params)].span
        )
    values, _ = match_arguments(f"'{node.name}'", "parameter", params, args)
    for p in node.params:
        if p.name not in values:
            if p.default is None:
                raise DslArgumentError(f"'{node.name}' needs its argument '{p.name}'", span)
            values[p.name] = el.eval(p.default, el.globals)
    return Env(values, el.globals)


def match_arguments(
    what: str, noun: str, names: list[str], args: tuple[CallArg, ...], listing: str | None = None
) -> tuple[dict[str, Any], dict[str, Span]]:
    """Positional arguments in order, then keywords by name (the caller has checked the positional count).
    An unknown keyword gets the nearest name as a hint, else `listing`; a name given twice is an error."""
    values: dict[str, Any] = {}
    where: dict[str, Span] = {}
    for name, a in zip(names, (a for a in args if a.name is None)):
        values[name], where[name] = a.value, a.span
    for a in args:
        if a.name is None:
            continue
        if a.name not in names:
            hint = did_you_mean(a.name, names) or listing
            raise DslArgumentError(f"{what} has no {noun} '{a.name}'", a.span, hint=hint)
        if a.name in values:
            raise DslArgumentError(f"argument '{a.name}' of {what} is given twice", a.span)
        values[a.name], where[a.name] = a.value, a.span
    return values, where


def take_name(args: tuple[CallArg, ...]) -> tuple[str | None, tuple[CallArg, ...]]:
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


def convert(fname: str, spec: ArgSpec, v: Any, span: Span) -> Any:
    """Check one argument against its spec; ints widen to floats, an int is a square pair."""

    def bad(want: str) -> DslArgumentError:
        return DslArgumentError(f"argument '{spec.name}' of {fname} must be {want}, got {describe(v)}", span)

    def check_range(x: float) -> None:
        if not math.isfinite(x):  # nan passes every comparison below
            raise DslArgumentError(f"argument '{spec.name}' of {fname} must be a finite number, got {x:g}", span)
        if spec.low is not None and x < spec.low:
            raise DslArgumentError(f"argument '{spec.name}' of {fname} must be at least {spec.low:g}, got {x:g}", span)
        if spec.below is not None and x >= spec.below:
            raise DslArgumentError(
                f"argument '{spec.name}' of {fname} must be less than {spec.below:g}, got {x:g}", span
            )
        if spec.high is not None and x > spec.high:
            raise DslArgumentError(f"argument '{spec.name}' of {fname} must be at most {spec.high:g}, got {x:g}", span)

    def check_int(x: int) -> None:
        check_range(x)
        if abs(x) > INT_MAX:  # a size, stride, window or count the generated programs hold in an int
            raise DslArgumentError(f"argument '{spec.name}' of {fname} must be at most {INT_MAX:,} (2^31 - 1) in "
                                   f"magnitude, got {x:,}", span)  # fmt: skip

    is_int = isinstance(v, int) and not isinstance(v, bool)
    if spec.kind == "int":
        if not is_int:
            raise bad("an integer")
        check_int(v)
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
            check_int(p)
        return tuple(pair)
    if spec.kind == "ints":  # an int or a tuple of ints (a shape, a permutation)
        ints = (v,) if is_int else v
        if not (isinstance(ints, tuple) and all(isinstance(p, int) and not isinstance(p, bool) for p in ints)):
            raise bad("an integer or a tuple of integers (a, b, ...)")
        for p in ints:
            check_int(p)
        return tuple(ints)
    if spec.kind == "floats":  # a number or a tuple of numbers (class weights, normalize's mean and std)
        nums = (v,) if is_int or isinstance(v, float) else v
        if not (isinstance(nums, tuple) and all(isinstance(p, (int, float)) and not isinstance(p, bool) for p in nums)):
            raise bad("a number or a tuple of numbers (a, b, ...)")
        for p in nums:
            check_range(float(p))
        return tuple(float(p) for p in nums)
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
    if spec.kind == "schedule":
        if isinstance(v, Spec) and v.family == "schedule":
            return v
        if not (is_int or isinstance(v, float)):
            raise bad("a learning rate (a number) or a schedule such as step(0.1, every=30), cosine(0.1)")
        check_range(float(v))
        if float(v) < 0:
            raise DslArgumentError(f"argument '{spec.name}' of {fname} must be at least 0, got {v:g}", span)
        return float(v)
    if spec.kind == "table":  # a layer bound to embedding(...), whose table a tied head reads
        inner = v.fn if isinstance(v, LayerInstance) else None
        if not (isinstance(inner, Partial) and inner.fn == BuiltinFn("embedding")):
            got = describe(v) if not isinstance(v, LayerInstance) else f"the layer '{v.path}', which is no embedding"
            raise DslArgumentError(f"argument '{spec.name}' of {fname} must be an embedding layer bound by name, as "
                                   f"`layer tok = embedding(V, D)`, got {got}", span)  # fmt: skip
        return v
    if spec.kind == "init":
        if isinstance(v, BuiltinFn) and v.name in SPECS and SPECS[v.name][0] == "init" and not SPECS[v.name][1]:
            return Spec("init", v.name, ())
        if not (isinstance(v, Spec) and v.family == "init"):
            raise bad("an initialiser such as he(), xavier(), gaussian(0.01), uniform(0.1) or constant(0)")
        return v
    raise AssertionError(spec.kind)
