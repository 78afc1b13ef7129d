"""The package's layers (pyproject.toml, [tool.importlinter]) checked by import-linter's `lint-imports`: the code as
it is keeps them, and a copy of the package with imports that break them is reported, one message per break."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from helpers import ROOT

LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"  # installed with the `test` extra


def lint_imports(package_parent: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`lint-imports` with the project's contracts, over the installed package or the `deepdsl` in `package_parent`."""
    env = dict(os.environ, COLUMNS="200")  # one line per message
    if package_parent is not None:  # found before the installed one
        env["PYTHONPATH"] = os.pathsep.join([str(package_parent), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo", str(ROOT / "pyproject.toml")],
        capture_output=True, text=True, cwd=package_parent or ROOT, env=env, timeout=120,
    )  # fmt: skip


def test_the_package_keeps_its_layers() -> None:
    r = lint_imports()
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Contracts: 2 kept, 0 broken." in r.stdout


def test_imports_that_break_the_layers_are_reported(tmp_path: Path) -> None:
    copy = tmp_path / "deepdsl"
    shutil.copytree(ROOT / "deepdsl", copy, ignore=shutil.ignore_patterns("__pycache__", "runtime"))
    with open(copy / "backends" / "numpy_runner.py", "a") as f:
        f.write("\nfrom deepdsl.trainer import Trainer  # noqa: E402 — a backend reaching up to the trainer\n")
    with open(copy / "backends" / "java" / "names.py", "a") as f:
        f.write("\nfrom deepdsl.passes import run_pipeline  # noqa: E402 — lower, but not a backend's to call\n")
    (copy / "helpers.py").write_text('"""A new top-level module without a layer."""\n')
    r = lint_imports(tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "deepdsl.backends is not allowed to import deepdsl.trainer" in out
    assert "deepdsl.backends.numpy_runner -> deepdsl.trainer" in out
    assert "deepdsl.backends is not allowed to import deepdsl.passes" in out
    assert "deepdsl.backends.java.names -> deepdsl.passes" in out
    assert "deepdsl.helpers" in out  # exhaustive: every top-level module has a layer
    assert "Contracts: 0 kept, 2 broken." in out
