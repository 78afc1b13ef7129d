"""Arithmetic during elaboration: compile-time numbers, and tensor arithmetic lowered to IR ops."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from deepdsl.errors import DslProgramError, DslShapeError, DslTypeError, Note
from deepdsl.frontend import ast
from deepdsl.frontend.values import Env, Function, TensorVal, describe

if TYPE_CHECKING:
    from deepdsl.frontend.elaborate import Elaborator


def unary(el: Elaborator, e: ast.Unary, v: Any) -> Any:
    if e.op == "not":
        if not isinstance(v, bool):
            raise DslTypeError(f"`not` needs true or false, got {describe(v)}", e.span)
        return not v
    if isinstance(v, TensorVal):
        return el.emit("neg", (v,), e.span, "", "-")
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return -v
    raise DslTypeError(f"cannot negate {describe(v)}", e.span)


def binary(el: Elaborator, e: ast.Binary, env: Env) -> Any:
    if e.op in ("and", "or"):
        left = el.eval(e.left, env)
        if not isinstance(left, bool):
            raise DslTypeError(f"`{e.op}` needs true or false, got {describe(left)}", e.left.span)
        if (e.op == "and" and not left) or (e.op == "or" and left):
            return left
        right = el.eval(e.right, env)
        if not isinstance(right, bool):
            raise DslTypeError(f"`{e.op}` needs true or false, got {describe(right)}", e.right.span)
        return right
    a, b = el.eval(e.left, env), el.eval(e.right, env)
    if isinstance(a, TensorVal) or isinstance(b, TensorVal):
        return tensor_arith(el, e, a, b)
    if e.op in ("==", "!="):
        if isinstance(a, Function) or isinstance(b, Function):
            raise DslTypeError("functions cannot be compared", e.span)
        return (a == b) == (e.op == "==")
    num = (int, float)
    if not isinstance(a, num) or isinstance(a, bool) or not isinstance(b, num) or isinstance(b, bool):
        raise DslTypeError(f"`{e.op}` needs numbers, got {describe(a)} and {describe(b)}", e.span)
    return number_op(el, e, a, b)


def number_op(el: Elaborator, e: ast.Binary, a: float, b: float) -> Any:
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
    if isinstance(result, float) and not math.isfinite(result):
        raise DslProgramError(f"`{op}` gives {result:g}, not a finite number", e.span)
    return el._int(result, e.span) if isinstance(result, int) and not isinstance(result, bool) else result


def tensor_arith(el: Elaborator, e: ast.Binary, a: Any, b: Any) -> TensorVal:
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
        return el.emit(names[op], (a, b), e.span, "", op)
    t, c = (a, b) if isinstance(a, TensorVal) else (b, a)
    if not isinstance(c, num) or isinstance(c, bool):
        raise DslTypeError(f"`{op}` between a tensor and {describe(c)}", e.span)
    c = float(c)
    left = t is a
    if op == "+":
        return el.emit("add_scalar", (t,), e.span, "", op, value=c)
    if op == "*":
        return el.emit("mul_scalar", (t,), e.span, "", op, value=c)
    if op == "-":
        return (
            el.emit("add_scalar", (t,), e.span, "", op, value=-c)
            if left
            else el.emit("rsub_scalar", (t,), e.span, "", op, value=c)
        )
    if op == "/":
        if left and c == 0:
            raise DslProgramError("division by zero", e.span)
        return (
            el.emit("mul_scalar", (t,), e.span, "", op, value=1.0 / c)
            if left
            else el.emit("rdiv_scalar", (t,), e.span, "", op, value=c)
        )
    if op == "^" and left:
        return el.emit("pow_scalar", (t,), e.span, "", op, value=c)
    raise DslTypeError(f"`{op}` is not defined between {describe(a)} and {describe(b)}", e.span)
