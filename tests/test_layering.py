"""The package's layering, read from the source with `ast`: no module imports a private name (`_name`) of another
module, a private module (`ops/_helpers.py`) is imported only from inside its own package, and `deepdsl.ir`, the
bottom layer, imports nothing of the package but itself, `errors` and `config`.

Every import counts, also one inside a function (a lazy import is still a dependency).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "deepdsl"
IR_MAY_IMPORT = ("deepdsl.ir", "deepdsl.errors", "deepdsl.config")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_of(module: str, is_package: bool) -> str:
    """The package a module's relative imports start from: itself for an `__init__`, else its parent."""
    return module if is_package else module.rpartition(".")[0]


def imports(tree: ast.AST, module: str, is_package: bool) -> list[tuple[str, str | None, int]]:
    """(imported module, imported name or None for `import X`, line) of every import in `tree`."""
    found: list[tuple[str, str | None, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, None, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package_of(module, is_package).split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            found += [(base, a.name, node.lineno) for a in node.names]
    return found


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def violations(source: str, module: str, is_package: bool = False, modules: frozenset[str] = frozenset()) -> list[str]:
    """What `source`, the text of `module`, breaks of the rules above; `modules` names every module of the package
    (so that `from deepdsl.ops import _helpers` is seen to import a module, not a name)."""
    out: list[str] = []
    home = package_of(module, is_package)
    for target, name, line in imports(ast.parse(source), module, is_package):
        full = f"{target}.{name}" if name and f"{target}.{name}" in modules else target
        parts = full.split(".")
        for k, part in enumerate(parts):  # a private module is its package's own
            owner = ".".join(parts[:k])
            if private(part) and not inside(home, owner):
                out.append(f"{module}:{line}: imports the private module {'.'.join(parts[: k + 1])}")
                break
        if name is not None and full == target and private(name) and target != module:
            out.append(f"{module}:{line}: imports the private name {name} of {target}")
        if inside(module, "deepdsl.ir") and inside(full, "deepdsl") and not any(inside(full, p) for p in IR_MAY_IMPORT):
            out.append(f"{module}:{line}: deepdsl.ir imports {full}, a layer above it")
    return out


def package_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def test_no_module_breaks_the_layering() -> None:
    modules = package_modules()
    names = frozenset(modules)
    found = [
        v
        for name, path in modules.items()
        for v in violations(path.read_text(), name, path.name == "__init__.py", names)
    ]
    assert found == []


def test_the_walk_sees_every_module() -> None:
    modules = package_modules()
    assert {"deepdsl.ir.analysis", "deepdsl.passes.fuse", "deepdsl.backends.cuda.kernels"} <= set(modules)


@pytest.mark.parametrize(
    ("module", "source", "expected"),
    [
        ("deepdsl.passes.inline", "from deepdsl.passes.fuse import _inline\n", "imports the private name _inline"),
        ("deepdsl.memory.plan", "def f():\n    from deepdsl.passes.fuse import _form\n", "private name _form"),
        ("deepdsl.ir.groups", "from deepdsl.ops.elementwise import add\n", "deepdsl.ir imports deepdsl.ops"),
        ("deepdsl.ir.groups", "def f():\n    import deepdsl.memory.plan\n", "imports deepdsl.memory.plan"),
        ("deepdsl.ir.groups", "from ..backends import cuda\n", "deepdsl.ir imports deepdsl.backends"),
        ("deepdsl.backends.java.emitter", "from deepdsl.ops._index_forms import read\n", "private module"),
        ("deepdsl.backends.cuda.kernels", "from deepdsl.ops import _index_forms\n", "module deepdsl.ops._index_forms"),
        ("deepdsl.backends.cuda.ops", "from .kernels import _grid\n", "private name _grid of deepdsl.backends.cuda"),
    ],
)
def test_the_checker_rejects_a_broken_module(module: str, source: str, expected: str) -> None:
    modules = frozenset({"deepdsl.ops._index_forms", "deepdsl.backends.cuda.kernels"})
    found = violations(source, module, modules=modules)
    assert len(found) == 1 and expected in found[0], found


@pytest.mark.parametrize(
    ("module", "source"),
    [
        ("deepdsl.ops.conv", "from deepdsl.ops._helpers import emit_like\n"),  # a package's own private module
        ("deepdsl.ops", "from deepdsl.ops import _helpers\n"),
        ("deepdsl.backends.java.emitter", "from deepdsl import __version__\n"),  # a dunder is not private
        ("deepdsl.ir.analysis", "from deepdsl.ir.indexexpr import Reduce\nfrom deepdsl.errors import Span\n"),
        ("deepdsl.passes.fuse", "from deepdsl.ir.analysis import index_form\n"),
    ],
)
def test_the_checker_accepts_a_sound_module(module: str, source: str) -> None:
    modules = frozenset({"deepdsl.ops._helpers"})
    assert violations(source, module, is_package=module == "deepdsl.ops", modules=modules) == []


@pytest.mark.parametrize("module", ["deepdsl.backends.cuda", "deepdsl.backends.java", "deepdsl.trainer"])
def test_a_module_that_attaches_to_the_registry_imports_alone(module: str) -> None:
    """The package loads its API lazily, so a module imported first in a process must itself load the ops whose
    registry entries it reads or fills (the CUDA backend attaches its kernels to them)."""
    r = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=120,
                       check=False)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
