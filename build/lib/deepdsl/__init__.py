"""deepdsl: a compiler for deep networks written in the .ddsl language."""

from deepdsl.api import Compilation, compile_file, compile_source
from deepdsl.errors import DslError
from deepdsl.frontend.program import Program

__version__ = "0.1.0"

__all__ = ["Compilation", "DslError", "Program", "__version__", "compile_file", "compile_source"]
