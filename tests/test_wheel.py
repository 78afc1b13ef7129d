"""The wheel ships the grammar and the Java runtime: build it, install it into a fresh folder, and parse from
there."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
from helpers import ROOT


@pytest.mark.slow  # 4 s (the default suite's four minutes)
def test_grammar_loads_from_an_installed_wheel(tmp_path) -> None:  # noqa: ANN001
    # build from a copy, so setuptools' build/ folder never lands in the checkout
    src, dist, target = tmp_path / "src", tmp_path / "dist", tmp_path / "site"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for name in ("deepdsl", "grammar"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(src)], check=True)
    (wheel,) = dist.glob("deepdsl-*.whl")
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True)  # fmt: skip
    assert (target / "deepdsl" / "grammar" / "ddsl.lark").is_file()
    probe = (
        "import sys, importlib, pkgutil; sys.path.insert(0, sys.argv[1]);"
        "import deepdsl;"
        "[importlib.import_module(m.name) for m in pkgutil.walk_packages(deepdsl.__path__, 'deepdsl.')"
        " if not m.name.endswith('__main__')];"
        "from deepdsl.frontend.parser import grammar_path, parse_text;"
        "assert str(grammar_path()).startswith(sys.argv[1]), grammar_path();"
        "print(parse_text('network A\\nconst N = 1\\n').network)"
    )
    # every module of the source tree is in the wheel (a package missing from pyproject.toml fails here)
    modules = {str(p.relative_to(ROOT)) for p in (ROOT / "deepdsl").rglob("*.py")}
    shipped = {str(p.relative_to(target)) for p in (target / "deepdsl").rglob("*.py")}
    assert modules <= shipped, sorted(modules - shipped)
    # and the Java runtime that `deepdsl compile` writes beside the class
    java = {p.name for p in (ROOT / "deepdsl" / "runtime").glob("*.java")}
    assert java and java <= {p.name for p in (target / "deepdsl" / "runtime").glob("*.java")}
    r = subprocess.run([sys.executable, "-c", probe, str(target)], cwd=tmp_path, capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin"}, check=False)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "A"
