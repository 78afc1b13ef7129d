"""Shape-rule helpers shared by the op families."""

from __future__ import annotations

from typing import Any

from deepdsl.ir.types import INT_MAX, DType, ShapeError, TensorType


def unary_same(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
    return types[0]


def binary_same(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> TensorType:
    a, b = types
    if a.shape != b.shape:
        raise ShapeError(f"element-wise operation on different shapes {a} and {b}")
    return a


def need_rank(t: TensorType, ranks: tuple[int, ...], what: str, hint: str = "") -> None:
    if t.rank not in ranks:
        want = " or ".join(f"{r}-D" for r in ranks)
        raise ShapeError(f"{what} expects a {want} input{hint}, got {t}")


def need_float(t: TensorType, what: str) -> None:
    if t.dtype is not DType.F32:
        raise ShapeError(f"{what} expects float data, got {t} (integer class labels)")


def pair(v: Any) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else tuple(v)  # type: ignore[return-value]


def window_out(size: int, k: int, s: int, p: int, what: str) -> int:
    if size + 2 * p > INT_MAX:  # the programs compute (size + 2 pad - k) / stride + 1 in ints
        raise ShapeError(f"{what}: an input of size {size} padded by {p:,} on both sides is {size + 2 * p:,} long; at "
                         f"most {INT_MAX:,} (2^31 - 1) fit the generated programs' ints")  # fmt: skip
    out = (size + 2 * p - k) // s + 1
    if out <= 0 or size + 2 * p < k:
        raise ShapeError(
            f"{what}: a window of {k} with padding {p} does not fit an input of size {size} (output would be {out})"
        )
    return out


def emit_like(b: Any, s: Any, op: str, *xs: Any, **attrs: Any) -> Any:
    """Emit a gradient statement carrying the span and layer of the forward statement `s`."""
    return b.emit(op, *xs, span=s.span, layer=s.layer, **attrs)
