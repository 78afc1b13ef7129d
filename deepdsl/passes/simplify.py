"""Algebraic simplification and constant folding, as a table of small rules applied to a fixed point.

Statement level: identities of the scalar ops (`x * 1`, `x + 0`, `--x`, folded scalar chains, `a + -b`),
reshapes of reshapes, and `log(exp x)`. Expression level: the bodies of indexed statements are folded
(`e * 1`, `e + 0`, `0 * e`, constant arithmetic, `c ? a : a`, selects on constant conditions). Each rule
is an identity of real arithmetic; the float32 results may differ in the last bit, within the tests'
tolerance.
"""

from __future__ import annotations

from deepdsl.ir import Graph, Stmt, Value
from deepdsl.ir.indexexpr import IE, Apply, Const, Reduce
from deepdsl.passes.rewrite import Rule, apply_rules


def _scalar_identity(s: Stmt, defs: dict[str, Stmt]) -> Value | None:
    if (s.op == "mul_scalar" and s.a["value"] == 1.0) or (s.op in ("add_scalar",) and s.a["value"] == 0.0):
        return s.inputs[0]
    if s.op == "reshape" and tuple(s.a["shape"]) == s.inputs[0].type.shape:
        return s.inputs[0]
    inner = defs.get(s.inputs[0].name) if s.inputs else None
    if inner is not None and (s.op, inner.op) in (("neg", "neg"), ("log", "exp")):
        return inner.inputs[0]
    return None


def _fold_chains(s: Stmt, defs: dict[str, Stmt]) -> Stmt | None:
    inner = defs.get(s.inputs[0].name) if s.inputs else None
    if inner is None:
        return None
    if s.op == inner.op and s.op in ("mul_scalar", "add_scalar"):
        a, b = inner.a["value"], s.a["value"]
        value = a * b if s.op == "mul_scalar" else a + b
        return s.replace(inputs=inner.inputs, attrs=(("value", value),))
    if s.op == "reshape" and inner.op == "reshape":
        return s.replace(inputs=inner.inputs)
    if s.op == "mul_scalar" and inner.op == "neg":
        return s.replace(inputs=inner.inputs, attrs=(("value", -s.a["value"]),))
    return None


def _negated_operand(s: Stmt, defs: dict[str, Stmt]) -> Stmt | None:
    if s.op not in ("add", "sub"):
        return None
    right = defs.get(s.inputs[1].name)
    if right is not None and right.op == "neg":
        return s.replace(op="sub" if s.op == "add" else "add", inputs=(s.inputs[0], right.inputs[0]))
    return None


def fold(e: IE) -> IE:
    """Constant folding and identities inside an index expression."""
    if isinstance(e, Reduce):
        body = fold(e.body)
        return e if body == e.body else Reduce(e.kind, e.vars, body)
    if not isinstance(e, Apply):
        return e
    args = tuple(fold(a) for a in e.args)
    consts = [a.value for a in args if isinstance(a, Const)]
    fn = e.fn
    if len(consts) == len(args) and fn in _FOLD:
        return Const(float(_FOLD[fn](*consts)))
    zero, one = Const(0.0), Const(1.0)
    if fn == "*":
        if zero in args:
            return zero
        if args[0] == one:
            return args[1]
        if args[1] == one:
            return args[0]
    if fn == "+" and zero in args:
        return args[1] if args[0] == zero else args[0]
    if fn == "-" and args[1] == zero:
        return args[0]
    if fn == "/" and args[1] == one:
        return args[0]
    if fn == "neg" and isinstance(args[0], Apply) and args[0].fn == "neg":
        return args[0].args[0]
    if fn == "select":
        if args[1] == args[2]:
            return args[1]
        if isinstance(args[0], Const):
            return args[1] if args[0].value else args[2]
    return e if args == e.args else Apply(fn, args)


_FOLD = {
    "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b, "neg": lambda a: -a,
    "/": lambda a, b: a / b if b else float("nan"),
    "==": lambda a, b: a == b, "<": lambda a, b: a < b, ">=": lambda a, b: a >= b,
}  # fmt: skip


def _fold_bodies(s: Stmt, defs: dict[str, Stmt]) -> Stmt | None:
    key = "body" if s.op in ("indexed", "fused") else "epilogue" if "epilogue" in s.a else None
    if key is None:
        return None
    folded = fold(s.a[key])
    if folded == s.a[key]:
        return None
    return s.replace(attrs=tuple((k, folded if k == key else v) for k, v in s.attrs))


RULES: list[Rule] = [_scalar_identity, _fold_chains, _negated_operand, _fold_bodies]


def simplify(g: Graph) -> Graph:
    return apply_rules(g, RULES)
