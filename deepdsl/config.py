"""Every environment knob in one place, read once."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Config:
    debug: bool = False  # DEEPDSL_DEBUG=1: show the Python traceback of an internal error
    verify: bool = False  # DEEPDSL_VERIFY=1: check every graph and plan the driver makes (as --verify does)
    data_url: str | None = None  # DEEPDSL_DATA_URL: where `deepdsl data` downloads from instead (a mirror)


def from_env() -> Config:
    def on(name: str) -> bool:
        return os.environ.get(name, "") not in ("", "0")

    return Config(
        debug=on("DEEPDSL_DEBUG"), verify=on("DEEPDSL_VERIFY"), data_url=os.environ.get("DEEPDSL_DATA_URL") or None
    )
