"""deepdsl: a compiler for deep networks written in the .ddsl language."""

from deepdsl.api import Build, Compilation, build, compile_file, compile_source
from deepdsl.errors import DslError
from deepdsl.frontend.program import Program
from deepdsl.version import __version__

__all__ = ["Build", "Compilation", "DslError", "Program", "__version__", "build", "compile_file", "compile_source"]
