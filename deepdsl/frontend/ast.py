"""The syntax tree of a .ddsl file: frozen dataclasses, each with its source span first.

Two expression families: `Expr` is the ordinary language (ints, tensors, functions, calls, `o`);
`IExpr` is the scalar language inside `tensor` function bodies (indices, accesses, reductions).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass

from deepdsl.errors import Span

# ---- ordinary expressions -------------------------------------------------------------------


@dataclass(frozen=True)
class Expr:
    span: Span


@dataclass(frozen=True)
class IntLit(Expr):
    value: int


@dataclass(frozen=True)
class FloatLit(Expr):
    value: float


@dataclass(frozen=True)
class StrLit(Expr):
    value: str


@dataclass(frozen=True)
class BoolLit(Expr):
    value: bool


@dataclass(frozen=True)
class Name(Expr):
    name: str


@dataclass(frozen=True)
class TupleLit(Expr):
    items: tuple[Expr, ...]


@dataclass(frozen=True)
class Unary(Expr):
    op: str  # '-' or 'not'
    operand: Expr


@dataclass(frozen=True)
class Binary(Expr):
    op: str  # + - * / % ^ == != < <= > >= and or
    left: Expr
    right: Expr


@dataclass(frozen=True)
class Compose(Expr):
    outer: Expr  # (outer o inner)(x) = outer(inner(x))
    inner: Expr


@dataclass(frozen=True)
class IfExpr(Expr):
    cond: Expr
    then: Expr
    other: Expr


@dataclass(frozen=True)
class Arg:
    span: Span
    name: str | None  # None for a positional argument
    value: Expr


@dataclass(frozen=True)
class Call(Expr):
    func: Expr
    args: tuple[Arg, ...]


# ---- statements inside def blocks --------------------------------------------------------------


@dataclass(frozen=True)
class Stmt:
    span: Span


@dataclass(frozen=True)
class Assign(Stmt):
    name: str
    value: Expr


@dataclass(frozen=True)
class For(Stmt):
    var: str
    start: Expr
    stop: Expr
    body: tuple[Stmt, ...]


@dataclass(frozen=True)
class If(Stmt):
    cond: Expr
    then: tuple[Stmt, ...]
    other: tuple[Stmt, ...]


@dataclass(frozen=True)
class Block:
    span: Span
    stmts: tuple[Stmt, ...]
    result: Expr


# ---- indexed scalar expressions (tensor functions) ---------------------------------------------


@dataclass(frozen=True)
class IExpr:
    span: Span


@dataclass(frozen=True)
class INum(IExpr):
    value: float
    is_int: bool


@dataclass(frozen=True)
class IName(IExpr):
    name: str  # an index variable, a size name or a const


@dataclass(frozen=True)
class IAccess(IExpr):
    tensor: str
    indices: tuple[IExpr, ...]


@dataclass(frozen=True)
class ICall(IExpr):
    func: str
    args: tuple[IExpr, ...]


@dataclass(frozen=True)
class IUnary(IExpr):
    op: str  # '-' or 'not'
    operand: IExpr


@dataclass(frozen=True)
class IBinary(IExpr):
    op: str
    left: IExpr
    right: IExpr


@dataclass(frozen=True)
class ICond(IExpr):
    cond: IExpr
    then: IExpr
    other: IExpr


@dataclass(frozen=True)
class IndexRange:
    span: Span
    name: str
    size: Expr | None  # an explicit range `i: H - K + 1`, else read off the accesses


@dataclass(frozen=True)
class IReduce(IExpr):
    kind: str  # 'sum' or 'max'
    indices: tuple[IndexRange, ...]
    body: IExpr


@dataclass(frozen=True)
class TParam:
    span: Span
    name: str
    sizes: tuple[tuple[Span, str | int], ...]  # a size name binds locally; an int must match


@dataclass(frozen=True)
class ParamDecl:
    span: Span
    name: str
    dims: tuple[Expr, ...]
    init: Expr


@dataclass(frozen=True)
class LocalDef:
    span: Span
    name: str
    indices: tuple[IndexRange, ...]  # `mu[n, g: G]`: a range given or read off the accesses, as an output's
    value: IExpr


# ---- items ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Item:
    span: Span


@dataclass(frozen=True)
class Const(Item):
    name: str
    value: Expr


@dataclass(frozen=True)
class Input(Item):
    name: str
    shape: tuple[Expr, ...]


@dataclass(frozen=True)
class TokenInput(Item):
    """`input NAME : [dims] int vocab V`: an int64 tensor of token ids in [0, V)."""

    name: str
    shape: tuple[Expr, ...]
    vocab: Expr


@dataclass(frozen=True)
class Label(Item):
    name: str
    shape: tuple[Expr, ...]
    classes: Expr


@dataclass(frozen=True)
class Layer(Item):
    name: str
    value: Expr


@dataclass(frozen=True)
class Bind(Item):
    name: str
    value: Expr


@dataclass(frozen=True)
class Param:
    span: Span
    name: str
    default: Expr | None


@dataclass(frozen=True)
class Def(Item):
    name: str
    params: tuple[Param, ...]
    body: Block


@dataclass(frozen=True)
class TensorDef(Item):
    name: str
    inputs: tuple[TParam, ...]
    outputs: tuple[IndexRange, ...]
    params: tuple[ParamDecl, ...]
    locals: tuple[LocalDef, ...]
    result: IExpr


@dataclass(frozen=True)
class Loss(Item):
    value: Expr


@dataclass(frozen=True)
class Predict(Item):
    value: Expr


@dataclass(frozen=True)
class TrainEntry:
    span: Span
    key: str
    value: Expr
    key_span: Span


@dataclass(frozen=True)
class Train(Item):
    entries: tuple[TrainEntry, ...]


@dataclass(frozen=True)
class Include(Item):
    path: str


@dataclass(frozen=True)
class Module:
    span: Span
    file: str
    network: str | None
    network_span: Span | None
    items: tuple[Item, ...]


# ---- printing (`deepdsl ir --stage ast`) ---------------------------------------------------------


def format_node(node: object, indent: int = 0) -> str:
    """A stable, indented text form: one node per line with its kind, scalar fields and position."""
    pad = "  " * indent
    if isinstance(node, tuple):
        return "\n".join(format_node(n, indent) for n in node)
    if not is_dataclass(node):
        return pad + repr(node)
    scalars, children = [], []
    for f in fields(node):
        if f.name == "span":
            continue
        value = getattr(node, f.name)
        if is_dataclass(value) and not isinstance(value, Span):
            children.append((f.name, value))
        elif isinstance(value, tuple) and value and is_dataclass(value[0]):
            children.append((f.name, value))
        elif isinstance(value, Span):
            continue
        else:
            scalars.append(f"{f.name}={value!r}")
    span = getattr(node, "span", None)
    where = f"  @{span.line}:{span.col}" if isinstance(span, Span) else ""
    lines = [f"{pad}{type(node).__name__}({', '.join(scalars)}){where}"]
    for name, child in children:
        lines.append(f"{pad}  .{name}:")
        lines.append(format_node(child, indent + 2))
    return "\n".join(lines)
