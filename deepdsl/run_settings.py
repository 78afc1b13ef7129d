"""The run-time settings of a program: the numeric options of `deepdsl run` and the Java program's flags, each
checked in its range (parse_setting), and the optimizer's hyperparameters they replace (with_settings)."""

from __future__ import annotations

import dataclasses
import math
import re

from deepdsl.errors import DslProgramError
from deepdsl.frontend.builtins import FLOAT32_MAX  # a setting the kernels read as a float32 stays finite there
from deepdsl.frontend.program import Program, Schedule
from deepdsl.frontend.train import MAX_ITERATIONS

# The numeric options of `deepdsl run` and the flags of the Java program (CommandLine.java's RANGES: the same ranges,
# syntax and messages): flag -> (low, high, high excluded, whole number). --threads is the Java program's only.
SETTING_RANGES: dict[str, tuple[float, float, bool, bool]] = {
    "--iters": (0, MAX_ITERATIONS, False, True),
    "--threads": (1, 1024, False, True),
    "--lr": (0, FLOAT32_MAX, False, False),
    "--momentum": (0, 1, True, False),
    "--weight-decay": (0, FLOAT32_MAX, False, False),
    "--beta1": (0, 1, True, False),
    "--beta2": (0, 1, True, False),
    "--eps": (0, FLOAT32_MAX, False, False),
    "--clip": (0, FLOAT32_MAX, False, False),
    "--alpha": (0, 1, True, False),  # RMSprop's smoothing constant
}
OPTIMIZER_FLAGS = ("--lr", "--momentum", "--weight-decay", "--beta1", "--beta2", "--eps", "--clip", "--alpha")
_NUMBER = re.compile(r"[+-]?([0-9]+[.]?[0-9]*|[.][0-9]+)([eE][+-]?[0-9]+)?")
_WHOLE = re.compile(r"[+-]?[0-9]{1,18}")


def _fmt(x: float) -> str:
    return str(int(x)) if x == int(x) and abs(x) < 1e15 else f"{x:.2g}"


def parse_setting(flag: str, raw: str) -> float | int:
    """The value of a numeric option `flag` (a key of SETTING_RANGES) given as `raw`: a decimal number (a whole
    one for --iters and --threads), finite, in its range. ValueError with what it takes otherwise."""
    low, high, open_high, whole = SETTING_RANGES[flag]
    text = raw.strip()
    value: float | int | None = None
    if whole and _WHOLE.fullmatch(text):
        value = int(text)
    elif not whole and _NUMBER.fullmatch(text):
        value = float(text)
    if value is None or not math.isfinite(value) or value < low or (value >= high if open_high else value > high):
        takes = f"{'a whole number' if whole else 'a number'} in [{_fmt(low)}, {_fmt(high)}{')' if open_high else ']'}"
        raise ValueError(f"{flag} takes {takes}, not {raw!r}")
    return value


def with_settings(program: Program, settings: dict[str, float]) -> Program:
    """`program` with its optimizer's hyperparameters replaced, as the Java program's flags set its settings
    (`settings`: lr, momentum, weight_decay, beta1, beta2, eps, clip, alpha; checked with parse_setting): `lr` under a
    schedule is the schedule's base rate. A setting the optimizer does not have (as the Java class has none:
    sgd's momentum or clip where it is 0) is a DslProgramError."""
    if not settings:
        return program
    cfg = program.train
    name, args = cfg.optimizer
    values = dict(args)
    have = [k for k, v in args if f"--{k.replace('_', '-')}" in SETTING_RANGES and not (k in ("momentum", "clip")
            and v == 0)]  # fmt: skip
    lr = cfg.lr
    for key, value in settings.items():
        if key not in have:
            raise DslProgramError(
                f"the optimizer {name} of {program.graph.name} has no setting '{key}' (it has {', '.join(have)})"
                + ("; a 0 in the train block leaves it out: give it there" if key in ("momentum", "clip") else "")
            )
        if key == "lr" and lr is not None:
            lr = _with_base(lr, float(value))
        else:
            values[key] = float(value)
    train = dataclasses.replace(cfg, optimizer=(name, tuple(values.items())), lr=lr)
    return dataclasses.replace(program, train=train)


def _with_base(s: Schedule, base: float) -> Schedule:
    """The schedule `s` from another base rate (Schedule.java's withBase)."""
    if s.base is None:
        return dataclasses.replace(s, value=base)
    return dataclasses.replace(s, base=_with_base(s.base, base))
