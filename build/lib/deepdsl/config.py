"""Every environment knob in one place, read once."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Config:
    debug: bool = False  # DEEPDSL_DEBUG=1: show the Python traceback of an internal error


def from_env() -> Config:
    return Config(debug=os.environ.get("DEEPDSL_DEBUG", "") not in ("", "0"))
