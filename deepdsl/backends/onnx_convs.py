"""The convolution family for `deepdsl export` (issues 33 and 34): frontend/convs.py's lowerings (an explicit pad,
a transposed convolution's output rows, a ceil-mode pooling's divisor correction) recognised in an inference
program and written back as ONNX's attributes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from deepdsl.backends.onnx_writer import Writer
from deepdsl.ir import Graph, Stmt

# ---- the convolution family (issues 33 and 34): frontend/convs.py's lowerings written back as ONNX's attributes ----
#
# conv_transpose (conv2d_backward_data in an inference program) is ConvTranspose, its output padding the rows its
# output has past the convolution's reach (and an explicit zero pad after it); an explicit pad before a Conv,
# MaxPool (-inf) or AveragePool (zeros, which count_include_pad counts) is that node's pads, asymmetric where they
# are; a pooling's ceil mode is the padding at the end it amounts to, and avg_pool's divisor correction for a window
# hanging past that padding a Mul by a constant. The exported model computes what deepdsl computes (ceil_mode=0,
# the windows spelled out by the pads).

CONV_FAMILY = ("conv2d_backward_data",)


@dataclass(frozen=True)
class Folds:
    skip: frozenset[str]  # explicit pads folded into the node next to them
    into: Mapping[str, tuple[str, tuple[int, int, int, int]]]  # reader -> (its ONNX input, (top, left, bottom, right))
    output_padding: Mapping[str, tuple[str, tuple[int, int]]]  # conv2d_backward_data -> (the pad's output, its rows)


def dilations(a: Mapping[str, Any]) -> dict[str, list[int]]:
    return {"dilations": [int(d) for d in a["dilation"]]} if "dilation" in a else {}


def folded_pads(s: Stmt, folds: Folds | None) -> list[int]:
    ph, pw = s.a["pad"]
    t, lft, b, r = folds.into[s.out.name][1] if folds is not None and s.out.name in folds.into else (0, 0, 0, 0)
    return [ph + t, pw + lft, ph + b, pw + r]


def _explicit_pad(s: Stmt) -> tuple[tuple[int, int, int, int], float] | None:
    """((top, left, bottom, right), fill) of a statement that is frontend/convs.py's pad_explicitly: x [N, C, H, W]
    placed at (top, left) in zeros, or in -inf (a select of the inside); else None."""
    from deepdsl.ir.indexexpr import Apply, Const, Read, Var

    if s.op != "indexed" or len(s.inputs) != 1 or len(s.a["out"]) != 4 or len(s.inputs[0].type.shape) != 4:
        return None
    body, fill = s.a["body"], 0.0
    if isinstance(body, Apply) and body.fn == "select" and body.args[2] == Const(float("-inf")):
        body, fill = body.args[1], float("-inf")
    names = [v for v, _ in s.a["out"]]
    plain = isinstance(body, Read) and all(ix.terms == ((v, 1),) for ix, v in zip(body.index, names))
    if not plain or body.input != 0:
        return None
    shifts = [-ix.const for ix in body.index]
    (_, _, h, w), (_, _, oh, ow) = s.inputs[0].type.shape, s.out.type.shape
    t, lft = shifts[2], shifts[3]
    pads = (t, lft, oh - h - t, ow - w - lft)
    if shifts[:2] != [0, 0] or min(pads) < 0:
        return None
    if fill != 0:  # the select's test must be the inside of x, as convs.pad_explicitly writes it
        hv, wv = names[2], names[3]
        inside = Apply("and", (
            Apply("and", (Apply(">=", (Var(hv), Const(t))), Apply("<", (Var(hv), Const(t + h))))),
            Apply("and", (Apply(">=", (Var(wv), Const(lft))), Apply("<", (Var(wv), Const(lft + w))))),
        ))  # fmt: skip
        if s.a["body"].args[0] != inside:
            return None
    return pads, fill


def conv_folds(g: Graph, users: Mapping[str, list[Stmt]], outputs: set[str]) -> Folds:
    skip: set[str] = set()
    into: dict[str, tuple[str, tuple[int, int, int, int]]] = {}
    output_padding: dict[str, tuple[str, tuple[int, int]]] = {}
    made = {s.out.name: s for s in g.stmts}
    for s in g.stmts:
        found = _explicit_pad(s)
        readers = users.get(s.out.name, [])
        if found is None or s.out.name in outputs or len(readers) != 1:
            continue
        pads, fill = found
        r = readers[0]
        if r.inputs[0].name == s.out.name and (
            r.op in ("conv2d", "avg_pool2d") and fill == 0 or r.op == "max_pool2d" and fill != 0
        ):
            skip.add(s.out.name)
            into[r.out.name] = (s.inputs[0].name, pads)
            continue
        src = made.get(s.inputs[0].name)
        if (src is not None and src.op == "conv2d_backward_data" and fill == 0 and pads[:2] == (0, 0)
                and len(users[src.out.name]) == 1 and src.out.name not in outputs):  # fmt: skip
            skip.add(s.out.name)
            output_padding[src.out.name] = (s.out.name, (pads[2], pads[3]))
    return Folds(frozenset(skip), into, output_padding)


def divisor_correction(s: Stmt) -> np.ndarray | None:
    """The factors [1, 1, OH, OW] of a statement x[n, c, h, w] * f(h, w) (avg_pool's divisor correction in ceil
    mode, frontend/convs.py), f reading nothing; else None."""
    from deepdsl.ir.indexexpr import Apply, Read, reads
    from deepdsl.ops.indexed import evaluate

    if s.op != "indexed" or len(s.inputs) != 1 or len(s.a["out"]) != 4:
        return None
    body, names = s.a["body"], [v for v, _ in s.a["out"]]
    if not (isinstance(body, Apply) and body.fn == "*" and isinstance(body.args[0], Read)):
        return None
    x, factor = body.args
    if x.input != 0 or any(ix.terms != ((v, 1),) or ix.const for ix, v in zip(x.index, names)) or reads(factor):
        return None
    if s.inputs[0].type.shape != s.out.type.shape:
        return None
    grid = tuple((v, n if k >= 2 else 1) for k, (v, n) in enumerate(s.a["out"]))
    values = np.asarray(evaluate(factor, grid, (), np.float32), np.float32)
    return np.broadcast_to(values, tuple(n for _, n in grid)).copy()


def emit_conv_family(w: Writer, s: Stmt, xs: list[str], out: str, extra: list[str], folds: Folds | None) -> None:
    a = s.a
    if s.op == "indexed":  # avg_pool's divisor correction
        factors = divisor_correction(s)
        w.node("Mul", [xs[0], w.const(s.layer or "avg_pool", factors)], out, s)  # type: ignore[arg-type]
        return
    # conv2d_backward_data: ConvTranspose with the same weight layout [C, out / groups, kh, kw]
    g = s.inputs[0].type.shape
    _, _, kh, kw = s.inputs[1].type.shape
    (sh, sw), (ph, pw) = a["stride"], a["pad"]
    dh, dw = a.get("dilation", (1, 1))
    natural = ((g[2] - 1) * sh - 2 * ph + dh * (kh - 1) + 1, (g[3] - 1) * sw - 2 * pw + dw * (kw - 1) + 1)
    op = [a["in_shape"][2] - natural[0], a["in_shape"][3] - natural[1]]
    if folds is not None and s.out.name in folds.output_padding:
        out, more = folds.output_padding[s.out.name]
        op = [op[0] + more[0], op[1] + more[1]]
    w.node("ConvTranspose", [*xs, *extra], out, s, kernel_shape=[kh, kw], strides=[sh, sw], pads=[ph, pw, ph, pw],
           dilations=[dh, dw], group=a["groups"], output_padding=op)  # fmt: skip
