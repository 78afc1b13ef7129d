"""deepdsl: a compiler for deep networks written in the .ddsl language.

The public API is re-exported here, loaded on first use (PEP 562): importing the package itself loads no NumPy, so
that the command line (`__main__.py`) can size NumPy's BLAS threads before NumPy starts them."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from deepdsl.version import __version__

if TYPE_CHECKING:
    from deepdsl.api import Build, Compilation, build, compile_file, compile_source
    from deepdsl.errors import DslError
    from deepdsl.frontend.program import Program

__all__ = ["Build", "Compilation", "DslError", "Program", "__version__", "build", "compile_file", "compile_source"]

_HOME = {
    **dict.fromkeys(("Build", "Compilation", "build", "compile_file", "compile_source"), "deepdsl.api"),
    "DslError": "deepdsl.errors",
    "Program": "deepdsl.frontend.program",
}


def __getattr__(name: str) -> Any:
    if name in _HOME:
        return getattr(importlib.import_module(_HOME[name]), name)
    raise AttributeError(f"module 'deepdsl' has no attribute {name!r}")
