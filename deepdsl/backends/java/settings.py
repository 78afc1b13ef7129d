"""Hyperparameters as run-time settings: an update op's attribute (learning rate, momentum, Adam's betas, ...) is
read by its kernel from a setting field of the class (`setting("lr", 0.01f)`), so a flag or an edit of one line
changes it without a recompile of the network."""

from __future__ import annotations

import math
from typing import Any

from deepdsl.backends.java.state import Emitter
from deepdsl.ir import Stmt
from deepdsl.ir.indexexpr import Apply, Const, Read, Reduce

# the hyperparameters the update kernels read at run time, as settings of the class: op -> attribute -> setting
# (adam_moment's beta is beta1 for the first moment, beta2 for the second)
SETTINGS: dict[str, dict[str, str]] = {
    "sgd_plain": {"lr": "lr", "weight_decay": "weight_decay"},
    "sgd_momentum": {"momentum": "momentum", "weight_decay": "weight_decay"},
    "sgd_step": {"lr": "lr"},
    "adam_moment": {"beta": "beta"},
    "adam_step": {"lr": "lr", "beta1": "beta1", "beta2": "beta2", "eps": "eps"},
    "clip_scale": {"clip": "clip"},
    # with a schedule the rate is the step's input opt/lr (Network sets it from the schedule before each step)
    "sgd_plain_scheduled": {"weight_decay": "weight_decay"},
    "adam_step_scheduled": {"beta1": "beta1", "beta2": "beta2", "eps": "eps"},
    # AdamW, RMSprop, Nesterov SGD (lr_mult stays a constant of the kernel: `--lr` scales every rate alike)
    "adamw_step": {"lr": "lr", "beta1": "beta1", "beta2": "beta2", "eps": "eps", "weight_decay": "weight_decay"},
    "adamw_step_scheduled": {"beta1": "beta1", "beta2": "beta2", "eps": "eps", "weight_decay": "weight_decay"},
    "rmsprop_square": {"alpha": "alpha", "weight_decay": "weight_decay"},
    "rmsprop_plain": {"lr": "lr", "eps": "eps", "weight_decay": "weight_decay"},
    "rmsprop_plain_scheduled": {"eps": "eps", "weight_decay": "weight_decay"},
    "rmsprop_momentum": {"momentum": "momentum", "eps": "eps", "weight_decay": "weight_decay"},
    "sgd_nesterov": {"lr": "lr", "momentum": "momentum", "weight_decay": "weight_decay"},
    "sgd_nesterov_scheduled": {"momentum": "momentum", "weight_decay": "weight_decay"},
}
MAX_SETTINGS = 16  # Network.java's room for settings
_SENTINEL = float(1 << 20)  # an attribute stands as _SENTINEL + k in a body until the Read of setting k replaces it


def with_settings(e: Emitter, stmts: tuple[Stmt, ...]) -> tuple[tuple[Stmt, ...], list[str]]:
    """`stmts` with each hyperparameter attribute replaced by a sentinel value, and the fields of the settings
    they read, in the order of their sentinels (see `read_settings`)."""
    used: list[str] = []
    out = []
    for st in stmts:
        table = SETTINGS.get(st.op)
        if not table:
            out.append(st)
            continue
        attrs = []
        for k, v in st.attrs:
            if k not in table:
                attrs.append((k, v))
                continue
            name = table[k] if table[k] != "beta" else ("beta1" if st.a.get("power", 1) == 1 else "beta2")
            key = (name, float(v))
            if key not in e.settings:
                if len(e.settings) >= MAX_SETTINGS:
                    raise ValueError(f"more than {MAX_SETTINGS} optimizer settings in one network")
                e.settings[key] = e.namer(f"setting:{name}:{v}", name)
            if e.settings[key] not in used:
                used.append(e.settings[key])
            attrs.append((k, _SENTINEL + used.index(e.settings[key])))
        out.append(st.replace(attrs=tuple(attrs)))
    return tuple(out), used


def read_settings(e: Any, first: int) -> Any:
    """`e` with each setting's sentinel (Emitter.with_settings) read from input `first + k`, a scalar; `1 - beta`
    (Adam's moments) too."""
    if isinstance(e, Const):
        if not math.isfinite(e.value):  # -inf (max pooling's padding) is no setting's sentinel
            return e
        k = e.value - _SENTINEL
        if k == int(k) and 0 <= k < MAX_SETTINGS:
            return Read(first + int(k), ())
        k = 1 - e.value - _SENTINEL
        if k == int(k) and 0 <= k < MAX_SETTINGS:
            return Apply("-", (Const(1.0), Read(first + int(k), ())))
        return e
    if isinstance(e, Apply):
        return Apply(e.fn, tuple(read_settings(a, first) for a in e.args))
    if isinstance(e, Reduce):
        return Reduce(e.kind, e.vars, read_settings(e.body, first))
    return e
