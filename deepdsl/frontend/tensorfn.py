"""Lowering of `tensor` functions (DESIGN §2.5) to `indexed` statements.

A call binds the size names of the signature to the arguments' sizes, makes the `param`s, and lowers each local
definition (`mu[n] = ...`) and the returned expression to one `indexed` statement (`tensorfn_body.py`). A
function that no one calls is checked on stand-in arguments.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from deepdsl.errors import (
    DslArgumentError,
    DslError,
    DslNameError,
    DslShapeError,
    DslTypeError,
    Note,
    Span,
)
from deepdsl.frontend import ast
from deepdsl.frontend.tensorfn_body import lower
from deepdsl.frontend.values import Env, Spec, TensorVal, describe
from deepdsl.ir.types import DType

if TYPE_CHECKING:
    from deepdsl.frontend.elaborate import Elaborator


def call_tensor_fn(el: Elaborator, fn: ast.TensorDef, args: tuple[TensorVal, ...], path: str, span: Span) -> TensorVal:
    el.tensor_fns_called.add(fn.name)
    if len(args) != len(fn.inputs):
        raise DslArgumentError(f"tensor function '{fn.name}' takes {len(fn.inputs)} tensors, got {len(args)}", span)
    sizes: dict[str, int] = {}
    size_from: dict[str, str] = {}
    tensors: dict[str, TensorVal] = {}
    for tp, x in zip(fn.inputs, args):
        if x.value.type.dtype is not DType.F32:
            raise DslTypeError(f"'{fn.name}' takes float tensors; '{tp.name}' gets {x.value.type}", span)
        if len(x.shape) != len(tp.sizes):
            raise DslShapeError(
                f"'{fn.name}' expects {tp.name} of rank {len(tp.sizes)}, got {x.value.type} from {x.origin}", span,
                notes=[Note(f"{tp.name} is declared here", tp.span)],
            )  # fmt: skip
        for axis, ((sspan, size), actual) in enumerate(zip(tp.sizes, x.shape)):
            where = f"dimension {axis} of {tp.name}"
            if isinstance(size, int):
                if size != actual:
                    raise DslShapeError(f"'{fn.name}' needs {where} to be {size}, got {actual} ({x.value.type})", span)
            elif size in sizes and sizes[size] != actual:
                raise DslShapeError(
                    f"'{fn.name}': size {size} is {sizes[size]} from {size_from[size]} but {actual} from {where}",
                    span, notes=[Note(f"{size} is bound here", sspan)],
                )  # fmt: skip
            else:
                sizes[size], size_from[size] = actual, where
        tensors[tp.name] = x
    env = Env(dict(sizes), el.globals)
    for decl in fn.params:
        dims = tuple(el.eval_int(d, env, "a parameter dimension", low=1) for d in decl.dims)
        init = el.eval(decl.init, env)
        if not (isinstance(init, Spec) and init.family == "init"):
            raise DslTypeError(
                f"a param's initialiser must be he(), constant(v), ...; got {describe(init)}", decl.init.span
            )
        if decl.name in tensors:
            raise DslNameError(f"'{decl.name}' is already an input of '{fn.name}'", decl.span)
        tensors[decl.name] = el.param(path, decl.name, dims, init, decl.span)
    for local in fn.locals:
        if local.name in tensors:
            raise DslNameError(f"'{local.name}' is already defined in '{fn.name}'", local.span)
        what = f"{fn.name}.{local.name}"
        tensors[local.name] = lower(el, env, tensors, local.indices, local.value, path, what, local.span)
    result = lower(el, env, tensors, fn.outputs, fn.result, path, fn.name, span)
    for decl in fn.params:
        if not _mentions(fn, decl.name):
            el.diags.add(_unused(decl))
    return result


# the size a stand-in argument gives each size name of a tensor function that no one calls
STAND_IN_SIZE = 16


def check_uncalled(el: Elaborator, fn: ast.TensorDef) -> None:
    """Check a tensor function that no one calls, so that a mistake in it does not wait for its first use: it is
    lowered once on stand-in arguments of its declared ranks (STAND_IN_SIZE for every size name, the literal
    sizes as written) into a builder of its own, which is thrown away. An error inside a size expression (an
    index range, a param's dimension) is not reported, since it may come from the stand-in sizes; every other
    one (unknown names, types, ranks, arities, ranges that cannot be told) holds for any arguments."""
    from deepdsl.frontend.elaborate import Poisoned
    from deepdsl.frontend.params import ParamStore
    from deepdsl.frontend.values import Scope
    from deepdsl.ir import GraphBuilder, TensorType, Value

    if any(_inside(e.span, fn.span) for e in el.diags.errors):  # its signature is wrong already: said once
        return
    args = []
    for tp in fn.inputs:
        shape = tuple(s if isinstance(s, int) else STAND_IN_SIZE for _, s in tp.sizes)
        args.append(TensorVal(Value(f"{fn.name}.{tp.name}", TensorType(shape)), f"'{tp.name}'", tp.span))
    saved = el.b, el.params, el.scope
    el.b = GraphBuilder(fn.name)
    el.params = ParamStore(el.b)
    el.scope = Scope(fn.name)
    try:
        call_tensor_fn(el, fn, tuple(args), fn.name, fn.span)
    except DslError as err:
        if not any(_inside(err.span, s) for s in _size_spans(fn)):
            el.diags.add(err)
    except Poisoned:  # it reads a definition whose error is reported already
        pass
    finally:
        el.b, el.params, el.scope = saved


def _inside(span: Span | None, outer: Span) -> bool:
    return span is not None and span.file == outer.file and (outer.line, outer.col) <= (span.line, span.col) and (
        span.end_line, span.end_col) <= (outer.end_line, outer.end_col)  # fmt: skip


def _size_spans(fn: ast.TensorDef) -> list[Span]:
    """The spans of every size expression of `fn`: explicit index ranges and param dimensions."""
    found = [d.span for decl in fn.params for d in decl.dims]
    found += [r.size.span for r in fn.outputs if r.size is not None]
    found += [r.size.span for local in fn.locals for r in local.indices if r.size is not None]

    def go(e: ast.IExpr) -> None:
        if isinstance(e, ast.IReduce):
            found.extend(r.size.span for r in e.indices if r.size is not None)
        for child in vars(e).values():
            for c in child if isinstance(child, tuple) else (child,):
                if isinstance(c, ast.IExpr):
                    go(c)

    for local in fn.locals:
        go(local.value)
    go(fn.result)
    return found


def _unused(decl: ast.ParamDecl) -> Any:
    from deepdsl.errors import DslWarning

    return DslWarning(f"param '{decl.name}' is never read", decl.span)


def _mentions(fn: ast.TensorDef, name: str) -> bool:
    found = False

    def go(e: ast.IExpr) -> None:
        nonlocal found
        if isinstance(e, ast.IAccess):
            found |= e.tensor == name
            for i in e.indices:
                go(i)
        elif isinstance(e, ast.ICall):
            for a in e.args:
                go(a)
        elif isinstance(e, ast.IUnary):
            go(e.operand)
        elif isinstance(e, (ast.IBinary,)):
            go(e.left)
            go(e.right)
        elif isinstance(e, ast.ICond):
            go(e.cond)
            go(e.then)
            go(e.other)
        elif isinstance(e, ast.IReduce):
            go(e.body)

    for local in fn.locals:
        go(local.value)
    go(fn.result)
    return found
