"""The recurrent built-ins `lstm` and `gru` (PyTorch's single-layer, batch-first nn.LSTM / nn.GRU).

Both are unrolled over the (static) sequence length when the file is compiled, and written with ops every backend
already has, so no backend needs a kernel of its own:

- the input projection of all T steps is one GEMM: x [N, T, D] viewed as [N*T, D] times W_ihᵀ, plus b_ih;
- each step takes its rows of that projection (`slice` along T, in blocks of about √T steps past 16 steps: see
  _StepRows; then a view [N, G]), and from step 1 on multiplies the previous hidden state by W_hhᵀ (one
  [N, H] x [H, G] GEMM, G = 4H or 3H), plus b_hh;
- the gates are one `indexed` statement per new state (LSTM: the cell state c, then h; GRU: h), which reads the
  gate pre-activations at their offsets within the G columns, so no gate is sliced out into a tensor of its own
  and the element-wise work of a step sits in those statements. LSTM adds the x-part and the h-part into one
  [N, 4H] tensor first (so the gradient of the sum is computed once); GRU reads them apart, since r scales the
  h-part of its n gate alone. Their gradients are derived symbolically like a tensor function's.

The parameters are PyTorch's, so a state dict loads unchanged: NAME.W_ih [G, D], NAME.W_hh [G, H], NAME.b_ih,
NAME.b_hh [G], gate order i, f, g, o (LSTM) and r, z, n (GRU), all initialised U(-1/sqrt(H), 1/sqrt(H)).
The initial states are zero: step 0 has no W_hh product (its h-part is b_hh alone).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from deepdsl.errors import DslShapeError, Span
from deepdsl.frontend.builtins import Args, ArgSpec, builtin
from deepdsl.frontend.values import Spec, TensorVal
from deepdsl.ir.indexexpr import IE, Affine, Apply, Const, Read

if TYPE_CHECKING:
    from deepdsl.frontend.elaborate import Elaborator

_GATES = {"lstm": 4, "gru": 3}
_OUT = (("n", 0), ("j", 0))  # the index variables of a step's [N, H] results (sizes filled in per call)


def _ap(fn: str, *args: IE) -> IE:
    return Apply(fn, tuple(args))


def _at(k: int, offset: int = 0) -> IE:
    """Input k, [N, G] (or [N, H]), read at row n and column j + offset."""
    return Read(k, (Affine.var("n"), Affine((("j", 1),), offset)))


def _bias_at(k: int, offset: int) -> IE:
    """Input k, a bias [G], read at column j + offset (the h-part of step 0, whose hidden state is zero)."""
    return Read(k, (Affine((("j", 1),), offset),))


class _Step:
    """The inputs of one step's `indexed` statements and how their bodies read the gate pre-activations."""

    def __init__(self, xt: TensorVal, hh: TensorVal | None, b_hh: TensorVal | None) -> None:
        self.inputs: list[TensorVal] = [xt]
        self.hh: int | None = None
        self.bias: int | None = None
        if hh is not None:
            self.hh = self.add(hh)
        elif b_hh is not None:
            self.bias = self.add(b_hh)

    def add(self, t: TensorVal) -> int:
        self.inputs.append(t)
        return len(self.inputs) - 1

    def x_part(self, offset: int) -> IE:
        return _at(0, offset)

    def h_part(self, offset: int) -> IE | None:
        """W_hh h + b_hh at column j + offset; None when it is zero (step 0 without a bias)."""
        if self.hh is not None:
            return _at(self.hh, offset)
        if self.bias is not None:
            return _bias_at(self.bias, offset)
        return None

    def pre(self, offset: int) -> IE:
        """The whole pre-activation x-part + h-part of the gate starting at column `offset`."""
        h = self.h_part(offset)
        return self.x_part(offset) if h is None else _ap("+", self.x_part(offset), h)


def _recurrent(kind: str):  # noqa: ANN202 - the builtin's apply
    gates = _GATES[kind]

    def apply(el: Elaborator, path: str, xs: tuple[TensorVal, ...], a: Args, span: Span) -> TensorVal:
        (x,) = xs
        if len(x.shape) != 3:
            raise DslShapeError(
                f"{kind} expects a 3-D input [N, T, D] (batch first), got {x.value.type} from {x.origin}", span,
                hint=f"{kind} reads a batch of sequences: [batch, time steps, features]",
            )  # fmt: skip
        if x.value.type.dtype.value != "f32":
            raise DslShapeError(f"{kind} expects float data, got {x.value.type} from {x.origin}", span,
                                hint="token ids go through `embedding` first")  # fmt: skip
        n, steps, d = x.shape
        h_size = a["hidden"]
        g = gates * h_size
        init = Spec("init", "uniform", (("a", 1.0 / math.sqrt(h_size)),))  # PyTorch's U(-1/sqrt(H), 1/sqrt(H))
        w_ih = el.param(path, "W_ih", (g, d), init, span)
        w_hh = el.param(path, "W_hh", (g, h_size), init, span)
        b_ih = el.param(path, "b_ih", (g,), init, span) if a["bias"] else None
        b_hh = el.param(path, "b_hh", (g,), init, span) if a["bias"] else None

        def emit(op: str, ins: tuple[TensorVal, ...], **attrs: object) -> TensorVal:
            return el.emit(op, ins, span, path, kind, **attrs)

        def view(t: TensorVal, shape: tuple[int, ...]) -> TensorVal:
            return t if tuple(t.shape) == shape else emit("reshape", (t,), shape=shape)

        # the input projection of every step at once: one GEMM over the N*T rows
        xp = emit("linear", (view(x, (n * steps, d)), w_ih))
        if b_ih is not None:
            xp = emit("bias_add", (xp, b_ih))
        xp = view(xp, (n, steps, g))
        out = (("n", n), ("j", h_size))
        h: TensorVal | None = None
        c: TensorVal | None = None
        hs: list[TensorVal] = []
        rows = _StepRows(xp, steps, emit)
        for t in range(steps):
            xt = view(rows.step(t), (n, g))
            hh = None
            if h is not None:
                hh = emit("linear", (h, w_hh))
                if b_hh is not None:
                    hh = emit("bias_add", (hh, b_hh))
            if kind == "lstm":  # every gate is σ or tanh of x-part + h-part: add them once, as one tensor
                pre = xt if hh is None else emit("add", (xt, hh))
                if hh is None and b_hh is not None:
                    pre = emit("bias_add", (pre, b_hh))
                h, c = _lstm_step(emit, _Step(pre, None, None), c, h_size, out)
            else:  # GRU's n gate scales the h-part alone by r: the two parts stay apart
                h = _gru_step(emit, _Step(xt, hh, b_hh), h, h_size, out)
            hs.append(h)
        if not a["sequences"]:
            return hs[-1]
        seq = [view(s, (n, 1, h_size)) for s in hs]
        return seq[0] if steps == 1 else emit("concat", tuple(seq), axis=1)

    return apply


class _StepRows:
    """Each step's rows [N, 1, G] of the input projection xp [N, T, G], sliced out along T.

    The gradient of a slice is its gradient padded with zeros to the whole input (`pad_axis`), so T slices of xp
    cost T copies of [N, T, G] in the backward pass, O(T²·N·G). Past BLOCKED steps they are taken in two levels,
    blocks of about √T steps first and the steps out of their block, which costs O(T^1.5·N·G) backward for one
    more copy of xp forward."""

    BLOCKED = 16

    def __init__(self, xp: TensorVal, steps: int, emit: Any) -> None:
        self.xp, self.steps, self.emit = xp, steps, emit
        self.size = math.isqrt(steps - 1) + 1 if steps > self.BLOCKED else steps  # ⌈√T⌉ steps a block
        self.blocks: dict[int, TensorVal] = {}

    def _slice(self, x: TensorVal, start: int, stop: int) -> TensorVal:
        return x if (start, stop) == (0, x.shape[1]) else self.emit("slice", (x,), axis=1, start=start, stop=stop)

    def step(self, t: int) -> TensorVal:
        k, at = divmod(t, self.size)
        if k not in self.blocks:
            self.blocks[k] = self._slice(self.xp, k * self.size, min((k + 1) * self.size, self.steps))
        return self._slice(self.blocks[k], at, at + 1)


def _lstm_step(emit, st: _Step, c: TensorVal | None, hsz: int, out: tuple) -> tuple[TensorVal, TensorVal]:  # noqa: ANN001
    """c' = σ(f)·c + σ(i)·tanh(g), h' = σ(o)·tanh(c'), gates i, f, g, o at columns 0, H, 2H, 3H."""
    i_gate = _ap("sigmoid", st.pre(0))
    g_gate = _ap("tanh", st.pre(2 * hsz))
    new_c = _ap("*", i_gate, g_gate)
    if c is not None:  # the initial cell state is zero
        k = st.add(c)
        new_c = _ap("+", _ap("*", _ap("sigmoid", st.pre(hsz)), _at(k)), new_c)
    c_next = emit("indexed", tuple(st.inputs), out=out, body=new_c)
    k = st.add(c_next)
    h_next = emit("indexed", tuple(st.inputs), out=out, body=_ap("*", _ap("sigmoid", st.pre(3 * hsz)),
                                                                  _ap("tanh", _at(k))))  # fmt: skip
    return h_next, c_next


def _gru_step(emit, st: _Step, h: TensorVal | None, hsz: int, out: tuple) -> TensorVal:  # noqa: ANN001
    """PyTorch's GRU: r = σ(x_r + h_r), z = σ(x_z + h_z), n = tanh(x_n + r·h_n), h' = (1 − z)·n + z·h, where x_· =
    W_i· x + b_i· and h_· = W_h· h + b_h· (so r multiplies b_hn too), gates r, z, n at columns 0, H, 2H."""
    r = _ap("sigmoid", st.pre(0))
    z = _ap("sigmoid", st.pre(hsz))
    hn = st.h_part(2 * hsz)
    inner = st.x_part(2 * hsz) if hn is None else _ap("+", st.x_part(2 * hsz), _ap("*", r, hn))
    n_gate = _ap("tanh", inner)
    body = _ap("*", _ap("-", Const(1.0), z), n_gate)
    if h is not None:  # the initial hidden state is zero
        k = st.add(h)
        body = _ap("+", body, _ap("*", z, _at(k)))
    return emit("indexed", tuple(st.inputs), out=out, body=body)


for _kind in _GATES:
    builtin(
        _kind,
        ArgSpec("hidden", "int", low=1),
        ArgSpec("sequences", "bool", True),
        ArgSpec("bias", "bool", True),
        params=True,
    )(_recurrent(_kind))
