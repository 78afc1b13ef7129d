"""Lark parse tree -> `ast` nodes. Builds nodes and spans only; it checks nothing but reserved words and the lengths
of names, integers and strings."""

from __future__ import annotations

from typing import Any

from lark import Token, v_args
from lark.visitors import Transformer_NonRecursive

from deepdsl.errors import DslProgramError, DslSyntaxError, Span
from deepdsl.frontend import ast

# the grammar's NAME terminal excludes these; kept here for messages
RESERVED = frozenset(
    "network const input label layer def tensor param loss predict train include for in if then else "
    "return and or not true false o".split()
)

MAX_NAME = 128  # characters of a name: it becomes a Java identifier, and the network's a file name
MAX_STRING = 4096  # characters of a string (a file path): PATH_MAX


def _is_item(x: object) -> bool:
    return x is not None and not (hasattr(x, "data") and getattr(x, "children", None) == [])


@v_args(meta=True)
class ToAst(Transformer_NonRecursive):
    def __init__(self, file: str):
        super().__init__(visit_tokens=False)
        self.file = file

    # ---- spans and names ----
    def span(self, meta: Any) -> Span:
        if getattr(meta, "empty", True):
            return Span(self.file, 1, 1, 1, 2)
        return Span(self.file, meta.line, meta.column, meta.end_line, meta.end_column)

    def tspan(self, tok: Token) -> Span:
        return Span(self.file, tok.line or 1, tok.column or 1, tok.end_line or 1, tok.end_column or 2)

    def binder(self, tok: Token) -> str:
        if len(tok) > MAX_NAME:  # a Java field, class or file name: javac and file systems cap their lengths
            raise DslSyntaxError(f"a name of {len(tok):,} characters; at most {MAX_NAME}", self.tspan(tok))
        return str(tok)

    def int_value(self, tok: Token) -> int:
        digits = str(tok).lstrip("0")
        if len(digits) > 19:  # past 2^62 (the elaborator's limit); Python itself refuses past 4,300 digits
            raise DslProgramError(f"an integer of {len(digits):,} digits is too large (at most 2^62 - 1)",
                                  self.tspan(tok))  # fmt: skip
        return int(digits or "0")

    def string(self, tok: Token) -> str:
        text = str(tok)[1:-1]
        if "\x00" in text:
            raise DslSyntaxError("a string may not hold a NUL character", self.tspan(tok))
        if len(text) > MAX_STRING:
            raise DslSyntaxError(f"a string of {len(text):,} characters; at most {MAX_STRING:,}", self.tspan(tok))
        return text

    # ---- file and items ----
    def start(self, meta: Any, ch: list) -> ast.Module:
        header = ch[0] if ch and isinstance(ch[0], tuple) else None
        items = tuple(c for c in ch[1 if header else 0 :] if isinstance(c, ast.Item))
        return ast.Module(
            self.span(meta), self.file, header[0] if header else None, header[1] if header else None, items
        )

    def header(self, meta: Any, ch: list) -> tuple[str, Span]:
        return (self.binder(ch[0]), self.tspan(ch[0]))

    def item(self, meta: Any, ch: list) -> None:  # a stray ';'
        return None

    stmt = item
    ilocal = item

    def const_item(self, meta: Any, ch: list) -> ast.Const:
        return ast.Const(self.span(meta), self.binder(ch[0]), ch[1])

    def input_item(self, meta: Any, ch: list) -> ast.Input:
        return ast.Input(self.span(meta), self.binder(ch[0]), ch[1])

    def token_input_item(self, meta: Any, ch: list) -> ast.TokenInput:
        return ast.TokenInput(self.span(meta), self.binder(ch[0]), ch[1], ch[2])

    def label_item(self, meta: Any, ch: list) -> ast.Label:
        return ast.Label(self.span(meta), self.binder(ch[0]), ch[1], ch[2])

    def layer_item(self, meta: Any, ch: list) -> ast.Layer:
        return ast.Layer(self.span(meta), self.binder(ch[0]), ch[1])

    def bind_item(self, meta: Any, ch: list) -> ast.Bind:
        return ast.Bind(self.span(meta), self.binder(ch[0]), ch[1])

    def def_item(self, meta: Any, ch: list) -> ast.Def:
        return ast.Def(self.span(meta), self.binder(ch[0]), ch[1] or (), ch[2])

    def def_expr(self, meta: Any, ch: list) -> ast.Block:
        return ast.Block(self.span(meta), (), ch[0])

    def params(self, meta: Any, ch: list) -> tuple[ast.Param, ...]:
        return tuple(ch)

    def param(self, meta: Any, ch: list) -> ast.Param:
        return ast.Param(self.span(meta), self.binder(ch[0]), ch[1])

    def loss_item(self, meta: Any, ch: list) -> ast.Loss:
        return ast.Loss(self.span(meta), ch[0])

    def predict_item(self, meta: Any, ch: list) -> ast.Predict:
        return ast.Predict(self.span(meta), ch[0])

    def train_item(self, meta: Any, ch: list) -> ast.Train:
        return ast.Train(self.span(meta), tuple(ch))

    def train_entry(self, meta: Any, ch: list) -> ast.TrainEntry:
        return ast.TrainEntry(self.span(meta), str(ch[0]), ch[1], self.tspan(ch[0]))

    def include_item(self, meta: Any, ch: list) -> ast.Include:
        return ast.Include(self.span(meta), self.string(ch[0]))

    def shape(self, meta: Any, ch: list) -> tuple[ast.Expr, ...]:
        return tuple(ch)

    # ---- blocks ----
    def block(self, meta: Any, ch: list) -> ast.Block:
        return ast.Block(self.span(meta), tuple(c for c in ch[:-1] if _is_item(c)), ch[-1])

    def assign_stmt(self, meta: Any, ch: list) -> ast.Assign:
        return ast.Assign(self.span(meta), self.binder(ch[0]), ch[1])

    def for_stmt(self, meta: Any, ch: list) -> ast.For:
        body = tuple(c for c in ch[3:] if _is_item(c))
        return ast.For(self.span(meta), self.binder(ch[0]), ch[1], ch[2], body)

    def if_stmt(self, meta: Any, ch: list) -> ast.If:
        other = ch[-1]
        if other is None:
            other = ()
        elif isinstance(other, ast.If):
            other = (other,)
        then = tuple(c for c in ch[1:-1] if _is_item(c))
        return ast.If(self.span(meta), ch[0], then, other)

    def if_else_block(self, meta: Any, ch: list) -> tuple[ast.Stmt, ...]:
        return tuple(c for c in ch if _is_item(c))

    # ---- expressions ----
    def ifexpr(self, meta: Any, ch: list) -> ast.IfExpr:
        return ast.IfExpr(self.span(meta), ch[0], ch[1], ch[2])

    def or_op(self, meta: Any, ch: list) -> ast.Binary:
        return ast.Binary(self.span(meta), "or", ch[0], ch[1])

    def and_op(self, meta: Any, ch: list) -> ast.Binary:
        return ast.Binary(self.span(meta), "and", ch[0], ch[1])

    def not_op(self, meta: Any, ch: list) -> ast.Unary:
        return ast.Unary(self.span(meta), "not", ch[0])

    def compare(self, meta: Any, ch: list) -> ast.Binary:
        return ast.Binary(self.span(meta), str(ch[1]), ch[0], ch[2])

    binop = compare

    def compose(self, meta: Any, ch: list) -> ast.Compose:
        return ast.Compose(self.span(meta), ch[0], ch[1])

    def neg(self, meta: Any, ch: list) -> ast.Unary:
        return ast.Unary(self.span(meta), "-", ch[0])

    def pow(self, meta: Any, ch: list) -> ast.Binary:
        return ast.Binary(self.span(meta), "^", ch[0], ch[1])

    def call(self, meta: Any, ch: list) -> ast.Call:
        return ast.Call(self.span(meta), ch[0], ch[1] or ())

    def args(self, meta: Any, ch: list) -> tuple[ast.Arg, ...]:
        return tuple(c if isinstance(c, ast.Arg) else ast.Arg(c.span, None, c) for c in ch)

    def kwarg(self, meta: Any, ch: list) -> ast.Arg:
        return ast.Arg(self.span(meta), self.binder(ch[0]), ch[1])

    def int_lit(self, meta: Any, ch: list) -> ast.IntLit:
        return ast.IntLit(self.span(meta), self.int_value(ch[0]))

    def float_lit(self, meta: Any, ch: list) -> ast.FloatLit:
        return ast.FloatLit(self.span(meta), float(ch[0]))

    def str_lit(self, meta: Any, ch: list) -> ast.StrLit:
        return ast.StrLit(self.span(meta), self.string(ch[0]))

    def true_lit(self, meta: Any, ch: list) -> ast.BoolLit:
        return ast.BoolLit(self.span(meta), True)

    def false_lit(self, meta: Any, ch: list) -> ast.BoolLit:
        return ast.BoolLit(self.span(meta), False)

    def name(self, meta: Any, ch: list) -> ast.Name:
        return ast.Name(self.span(meta), self.binder(ch[0]))

    def tuple_lit(self, meta: Any, ch: list) -> ast.TupleLit:
        return ast.TupleLit(self.span(meta), tuple(ch))

    # ---- tensor functions ----
    def tensor_item(self, meta: Any, ch: list) -> ast.TensorDef:
        inputs = tuple(c for c in ch if isinstance(c, ast.TParam))
        outputs = tuple(c for c in ch if isinstance(c, ast.IndexRange))
        params, locals_, result = ch[-1]
        return ast.TensorDef(self.span(meta), self.binder(ch[0]), inputs, outputs, params, locals_, result)

    def tensor_expr(self, meta: Any, ch: list) -> tuple:
        return ((), (), ch[0])

    def iblock(self, meta: Any, ch: list) -> tuple:
        body = [c for c in ch[:-1] if _is_item(c)]
        params = tuple(c for c in body if isinstance(c, ast.ParamDecl))
        locals_ = tuple(c for c in body if isinstance(c, ast.LocalDef))
        return (params, locals_, ch[-1])

    def tparam(self, meta: Any, ch: list) -> ast.TParam:
        return ast.TParam(self.span(meta), self.binder(ch[0]), tuple(ch[1:]))

    def size_name(self, meta: Any, ch: list) -> tuple[Span, str]:
        return (self.tspan(ch[0]), self.binder(ch[0]))

    def size_int(self, meta: Any, ch: list) -> tuple[Span, int]:
        return (self.tspan(ch[0]), self.int_value(ch[0]))

    def oindex(self, meta: Any, ch: list) -> ast.IndexRange:
        return ast.IndexRange(self.span(meta), self.binder(ch[0]), ch[1])

    rindex = oindex

    def param_decl(self, meta: Any, ch: list) -> ast.ParamDecl:
        return ast.ParamDecl(self.span(meta), self.binder(ch[0]), tuple(ch[1:-1]), ch[-1])

    def local_def(self, meta: Any, ch: list) -> ast.LocalDef:
        return ast.LocalDef(self.span(meta), self.binder(ch[0]), tuple(ch[1:-1]), ch[-1])

    def ireduce(self, meta: Any, ch: list) -> ast.IReduce:
        return ast.IReduce(self.span(meta), str(ch[0]), tuple(ch[1:-1]), ch[-1])

    def icond(self, meta: Any, ch: list) -> ast.ICond:
        return ast.ICond(self.span(meta), ch[0], ch[1], ch[2])

    def ior(self, meta: Any, ch: list) -> ast.IBinary:
        return ast.IBinary(self.span(meta), "or", ch[0], ch[1])

    def iand(self, meta: Any, ch: list) -> ast.IBinary:
        return ast.IBinary(self.span(meta), "and", ch[0], ch[1])

    def inot(self, meta: Any, ch: list) -> ast.IUnary:
        return ast.IUnary(self.span(meta), "not", ch[0])

    def icmp(self, meta: Any, ch: list) -> ast.IBinary:
        return ast.IBinary(self.span(meta), str(ch[1]), ch[0], ch[2])

    ibinop = icmp

    def ineg(self, meta: Any, ch: list) -> ast.IUnary:
        return ast.IUnary(self.span(meta), "-", ch[0])

    def ipow(self, meta: Any, ch: list) -> ast.IBinary:
        return ast.IBinary(self.span(meta), "^", ch[0], ch[1])

    def iint(self, meta: Any, ch: list) -> ast.INum:
        return ast.INum(self.span(meta), self.int_value(ch[0]), True)

    def ifloat(self, meta: Any, ch: list) -> ast.INum:
        return ast.INum(self.span(meta), float(ch[0]), False)

    def iname(self, meta: Any, ch: list) -> ast.IName:
        return ast.IName(self.span(meta), self.binder(ch[0]))

    def iaccess(self, meta: Any, ch: list) -> ast.IAccess:
        return ast.IAccess(self.span(meta), self.binder(ch[0]), tuple(ch[1:]))

    def icall(self, meta: Any, ch: list) -> ast.ICall:
        return ast.ICall(self.span(meta), str(ch[0]), tuple(ch[1:]))
