"""The built-in losses and metrics of scores or predictions and their targets: `softmax_cross_entropy` and
`cross_entropy` (with `weight=` and `label_smoothing=`), `nll`, `mse`, `l1`, `huber`, `bce_with_logits`, `accuracy`
and `argmax`.

`mse`, `accuracy`, `argmax` and the cross-entropies without options are registry ops; each other loss is one `indexed`
statement (frontend/losses.py: an index expression reduced to a scalar), so its NumPy, Java and CUDA code and its
gradient come from the index form.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

from deepdsl.errors import DslArgumentError, DslShapeError, Span
from deepdsl.frontend import losses
from deepdsl.frontend.builtins import BUILTINS, Apply, Args, ArgSpec, builtin, origin_notes, view
from deepdsl.frontend.values import TensorVal

if TYPE_CHECKING:
    from deepdsl.frontend.elaborate import Elaborator


def _class_loss(op: str) -> None:
    def apply(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
        scores, labels = xs
        if len(scores.shape) >= 4 and len(labels.shape) == 1:  # issue 34: `full` on images keeps [N, C, H]
            raise DslShapeError(
                f"{op}: one label per sample needs [N, K] scores, got {scores.value.type} from {scores.origin}",
                span, notes=origin_notes(labels),
                hint="`full` works on the last axis (as nn.Linear): use `flatten` first to turn [N, C, H, W] into "
                "[N, C*H*W]",
            )  # fmt: skip
        per_position = op == "softmax_cross_entropy" and len(scores.shape) > 2
        if (
            labels.classes is not None
            and (len(scores.shape) == 2 or per_position)
            and scores.shape[-1] != labels.classes
        ):
            raise DslShapeError(
                f"{op}: {scores.origin} gives {scores.shape[-1]} scores per "
                f"{'position' if per_position else 'sample'}, "
                f"but the labels '{labels.origin.split(chr(39))[1]}' have {labels.classes} classes",
                span,
            )
        return el.emit(op, xs, span, path, op)

    builtin(op, inputs=2, layer=False)(apply)


for _name in ("softmax_cross_entropy", "cross_entropy", "accuracy"):
    _class_loss(_name)


@builtin("mse", inputs=2, layer=False)
def mse(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    return el.emit("mse", xs, span, path, "mse")


@builtin("argmax", layer=False)
def argmax(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    return el.emit("argmax", xs, span, path, "argmax")


# ---- losses, class weights and label smoothing (issue 34) ----------------------------------------------------
# Each loss is one `indexed` statement (frontend/losses.py: an index expression reduced to a scalar), so its NumPy,
# Java and CUDA code and its gradient come from the index form.


def _loss_pair(what: str, xs: tuple[TensorVal, ...], span: Span, target_kind: str = "target") -> None:
    pred, target = xs
    for v, role in ((pred, "prediction"), (target, target_kind)):
        if v.value.type.dtype.value != "f32":
            raise DslShapeError(f"{what}: the {role} must be float, got {v.value.type} from {v.origin}", span,
                                notes=origin_notes(pred, target))  # fmt: skip
    if pred.shape != target.shape:
        raise DslShapeError(f"{what}: prediction {pred.value.type} and target {target.value.type} differ in shape",
                            span, notes=origin_notes(pred, target))  # fmt: skip


def _indexed_loss(el: Elaborator, what: str, xs: tuple[TensorVal, ...], body: Any, span: Span, path: str) -> TensorVal:
    out, expr = body
    return el.emit("indexed", xs, span, path, what, out=out, body=expr)


@builtin("l1", inputs=2, layer=False)
def l1(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    _loss_pair("l1", xs, span)
    return _indexed_loss(el, "l1", xs, losses.l1(tuple(xs[0].shape)), span, path)


@builtin("huber", ArgSpec("delta", "float", 1.0, low=1e-30), inputs=2, layer=False)
def huber(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    _loss_pair("huber", xs, span)
    return _indexed_loss(el, "huber", xs, losses.huber(tuple(xs[0].shape), a["delta"]), span, path)


@builtin("bce_with_logits", inputs=2, layer=False)
def bce_with_logits(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    _loss_pair("bce_with_logits", xs, span)
    return _indexed_loss(el, "bce_with_logits", xs, losses.bce_with_logits(tuple(xs[0].shape)), span, path)


def _rows_and_labels(what: str, scores: TensorVal, labels: TensorVal, span: Span, per_position: bool) -> int:
    """Check scores [N, K] (or [N, T, K] with per_position) against int labels [N] ([N, T]); returns K."""
    ranks = (2, 3) if per_position else (2,)
    if scores.value.type.dtype.value != "f32" or len(scores.shape) not in ranks:
        want = "[N, K] (or [N, T, K])" if per_position else "[N, K]"
        raise DslShapeError(f"{what} expects float {want} scores, got {scores.value.type} from {scores.origin}", span)
    if labels.value.type.dtype.value != "i64" or tuple(labels.shape) != tuple(scores.shape[:-1]):
        want = ", ".join(map(str, scores.shape[:-1]))
        raise DslShapeError(f"{what}: labels must be int [{want}] for scores {scores.value.type}, got "
                            f"{labels.value.type} from {labels.origin}", span,
                            notes=origin_notes(scores, labels))  # fmt: skip
    k = scores.shape[-1]
    if labels.classes is not None and labels.classes != k:
        raise DslShapeError(f"{what}: {scores.origin} gives {k} scores, but {labels.origin} has {labels.classes} "
                            "classes", span)  # fmt: skip
    return k


def _weighted_nll(el: Elaborator, what: str, lp: TensorVal, labels: TensorVal, a: Args, span: Span,
                  path: str) -> TensorVal:  # fmt: skip
    """The weighted, smoothed negative log-likelihood of log-probabilities lp [..., K] and labels [...]."""
    k = lp.shape[-1]
    weight = a.get("weight")
    if weight is not None and len(weight) != k:
        raise DslShapeError(f"{what}: weight= gives {len(weight)} class weights, but there are {k} classes", span)
    rows = math.prod(lp.shape[:-1])
    lp2 = view(el, lp, (rows, k), span, path, what)
    y2 = view(el, labels, (rows,), span, path, what)
    body = losses.nll(rows, k, weight, a.get("ignore_index", -100), a.get("label_smoothing", 0.0))
    return _indexed_loss(el, what, (lp2, y2), body, span, path)


_WEIGHT = ArgSpec("weight", "floats", None, low=0.0, keyword=True)


def _accept_ignored(el: Elaborator, labels: TensorVal, ignore: int, span: Span) -> None:
    """Let the data of label `labels` hold `ignore` besides its class ids (a value in [0, K) already is one): the
    label's InputDef records it, and the data checks (Python and the Java program) accept it. One label read with
    two different ignored values is an error."""
    k = next((i for i, d in enumerate(el.b.inputs) if d.value == labels.value and d.kind == "label"), None)
    if k is None or (labels.classes is not None and 0 <= ignore < labels.classes):
        return
    d = el.b.inputs[k]
    if d.ignore is not None and d.ignore != ignore:
        raise DslArgumentError(f"nll: label '{d.value.name}' is read with ignore_index={d.ignore} already; one label "
                               f"has one ignored value, not also {ignore}", span)  # fmt: skip
    el.b.inputs[k] = dataclasses.replace(d, ignore=ignore)


_SMOOTHING = ArgSpec("label_smoothing", "float", 0.0, low=0.0, high=1.0, keyword=True)


@builtin("nll", ArgSpec("ignore_index", "int", -100), _WEIGHT, inputs=2, layer=False)
def nll(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
    lp, labels = xs
    _rows_and_labels("nll", lp, labels, span, per_position=False)
    _accept_ignored(el, labels, a["ignore_index"], span)
    return _weighted_nll(el, "nll", lp, labels, a, span, path)


def _with_options(op: str, plain: Apply) -> Apply:
    """softmax_cross_entropy / cross_entropy with label_smoothing= and weight=: without them the one library op
    they always were; with them log_softmax (or log) and the weighted, smoothed negative log-likelihood."""

    def apply(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
        if a["label_smoothing"] == 0.0 and a["weight"] is None:
            return plain(el, path, xs, {}, span)
        scores, labels = xs
        _rows_and_labels(op, scores, labels, span, per_position=op == "softmax_cross_entropy")
        k = scores.shape[-1]
        rows = view(el, scores, (math.prod(scores.shape[:-1]), k), span, path, op)
        lp = el.emit("log_softmax" if op == "softmax_cross_entropy" else "log", (rows,), span, path, op)
        return _weighted_nll(el, op, lp, labels, a, span, path)

    return apply


for _name in ("softmax_cross_entropy", "cross_entropy"):  # the cross-entropies again, with the options
    builtin(_name, _SMOOTHING, _WEIGHT, inputs=2, layer=False)(_with_options(_name, BUILTINS[_name].apply))
