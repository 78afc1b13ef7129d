"""Every environment knob in one place, read once."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Config:
    debug: bool = False  # DEEPDSL_DEBUG=1: show the Python traceback of an internal error
    verify: bool = False  # DEEPDSL_VERIFY=1: check every graph and plan the driver makes (as --verify does)
    data_url: str | None = None  # DEEPDSL_DATA_URL: where `deepdsl data` downloads from instead (a mirror)
    # DEEPDSL_CACHE: the folder of the parser tables made from the grammar (default $XDG_CACHE_HOME/deepdsl or
    # ~/.cache/deepdsl); DEEPDSL_CACHE=0 builds them anew in every process. The tables are a pickle: they are read
    # only when the folder and the file are the user's alone, checked on the open descriptors (frontend/parser.py)
    cache_dir: str | None = None
    # DEEPDSL_PTX_CACHE=1: NVRTC's PTX kept as files in cache_dir too, by a hash of what made it (cuda/nvrtc.py;
    # scripts/gpu_check.sh sets it, so that its processes compile one network's kernels once)
    ptx_cache: bool = False
    # DEEPDSL_DP_TIMEOUT: seconds a data-parallel rank waits for a bucket's reduction before it names the ranks that
    # did not start it and stops the run (distributed/engines.py); DEEPDSL_DP_FAULT=RANK:STEP:kill|stall: a test's
    # fault injection (that rank dies or stalls at that step); DEEPDSL_DP_FORCE=1: `deepdsl run --device cuda` of one
    # rank goes through the data-parallel pass and NCCL all the same (a one-rank communicator: scripts/gpu_check.sh
    # checks NCCL's path on one GPU with it, as the Java program's -Ddeepdsl.collective=true)
    dp_timeout: float = 300.0
    dp_fault: str | None = None
    dp_force: bool = False


def from_env() -> Config:
    def on(name: str) -> bool:
        return os.environ.get(name, "") not in ("", "0")

    def cache_dir() -> str | None:
        chosen = os.environ.get("DEEPDSL_CACHE")
        if chosen is not None:
            return None if chosen in ("", "0") else chosen
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return os.path.join(base, "deepdsl")

    def seconds(name: str, default: float) -> float:
        raw = os.environ.get(name, "")
        try:
            value = float(raw)
        except ValueError:
            return default
        return value if value > 0 and value < float("inf") else default

    return Config(
        debug=on("DEEPDSL_DEBUG"),
        verify=on("DEEPDSL_VERIFY"),
        data_url=os.environ.get("DEEPDSL_DATA_URL") or None,
        cache_dir=cache_dir(),
        ptx_cache=on("DEEPDSL_PTX_CACHE"),
        dp_timeout=seconds("DEEPDSL_DP_TIMEOUT", 300.0),
        dp_fault=os.environ.get("DEEPDSL_DP_FAULT") or None,
        dp_force=on("DEEPDSL_DP_FORCE"),
    )
