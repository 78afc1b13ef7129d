"""The class names a network may not take, because the generated Java program needs them for something else.

The program `network Name` compiles to is `class Name extends Network` beside the runtime package
`deepdsl.runtime`, whose classes it imports (`Buf`, `Device`, `Kernel`, ...) and whose nested types it inherits
(`Settings`): a class of the same name hides them and javac rejects the program. The same holds for the
`java.lang` classes the program and the runtime use unqualified (`String`, `Math`, `System`, ...). Rejecting the
name in the front end, with a diagnostic at it, is clearer than renaming the class, since the class name is the
file `compile -o DIR/Name.java` writes and the command that runs it.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

RUNTIME = Path(__file__).resolve().parents[1] / "runtime"

# java.lang's classes a generated program or the runtime names, or that a network is likely to be called
JAVA_LANG = frozenset(
    """Object String StringBuilder Math StrictMath System Runtime Thread Runnable Class Record Enum Iterable
    Comparable AutoCloseable Cloneable Number Integer Long Float Double Short Byte Character Boolean Void Throwable
    Exception RuntimeException Error Override Deprecated SuppressWarnings FunctionalInterface SafeVarargs
    ArithmeticException IllegalArgumentException IllegalStateException OutOfMemoryError Process Module Package
    ThreadLocal""".split()
)

_DECLARATION = re.compile(
    r"^\s*(?:(?:public|private|protected|static|final|abstract|sealed|non-sealed)\s+)*"
    r"(?:class|interface|enum|record)\s+([A-Z]\w*)",
    re.M,
)


@cache
def reserved_class_names() -> dict[str, str]:
    """Every class, interface, enum and record the runtime declares (nested ones too) and JAVA_LANG's, each with
    its qualified name (`deepdsl.runtime.Buf`, `deepdsl.runtime.Network.Settings`, `java.lang.String`)."""
    names = {name: f"java.lang.{name}" for name in JAVA_LANG}
    for source in sorted(RUNTIME.glob("*.java")):
        for name in _DECLARATION.findall(source.read_text(encoding="utf-8")):
            nested = "" if name == source.stem else f"{source.stem}."
            names.setdefault(name, f"deepdsl.runtime.{nested}{name}")
    return names


def java_class(network: str) -> str:
    """The class a network name becomes (as the Java backend's `class_name` makes it, first letter upper)."""
    return network[:1].upper() + network[1:]
