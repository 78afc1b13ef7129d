"""What the security tests share: three small networks whose source text attacks the Java emitter (the issue's
two proofs of concept and a newline in a file name), compiled by one javac run, and how to run them. (Not a
conftest.py: the test modules import it by name, as they import tests/helpers.py.)"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import JAVAC

ROOT = Path(__file__).resolve().parents[2]
needs_javac = pytest.mark.skipif(shutil.which("javac") is None or shutil.which("java") is None, reason="no JDK")

PAYLOAD = "System.out.println(\\u0022INJECTED\\u0022);"
POC_DATA = (
    f"d.npz\\u0022); static {{ {PAYLOAD} }} static final Settings S2 = new Settings(\\u0022x\\u0022).data(\\u0022"
)
POC_INCLUDE = f"lib\\u000a{PAYLOAD}\\u000a\\u002f\\u002f.ddsl"  # one file name: the `//` is \\u002f\\u002f
TINY = """network {cls}
input x : [4, 3]
label y : [4] classes 2
{include}
layer fc = full(2)
loss = softmax_cross_entropy({apply}, y)
predict = fc(x)
train {{
  data = npz("{data}")
  iterations = 2
}}
"""
PROGRAMS = {  # class: (source file name, include or None, data path)
    "DataPoc": ("data.ddsl", None, POC_DATA),
    "IncludePoc": ("include.ddsl", POC_INCLUDE, "d.npz"),
    "NewlinePoc": ("new\nline.ddsl", None, "tab\there\\t and \\\\ back"),
}


_BUILT: dict[str, Path] = {}


def build_programs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The programs of PROGRAMS compiled to Java and by one javac run (once a session: both test modules use it)."""
    if "folder" in _BUILT:
        return _BUILT["folder"]
    from click.testing import CliRunner

    from deepdsl.cli import cli

    folder = tmp_path_factory.mktemp("poc")
    for cls, (file, include, data) in PROGRAMS.items():
        if include is not None:
            (folder / include).write_text("def twice(t) = relu(relu(t))\n")
        text = TINY.format(cls=cls, include=f'include "{include}"' if include else "",
                           apply="twice(fc(x))" if include else "fc(x)", data=data)  # fmt: skip
        (folder / file).write_text(text)
        r = CliRunner().invoke(cli, ["compile", str(folder / file), "-o", str(folder / "src")])
        assert r.exit_code == 0, r.output
    src = folder / "src"
    classes = [str(src / f"{cls}.java") for cls in PROGRAMS]  # the runtime classes they use come by -sourcepath
    r = subprocess.run([*JAVAC, "-nowarn", "-d", str(folder / "build"), "-sourcepath", str(src), *classes],
                       capture_output=True, text=True, timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stderr[-4000:]
    _BUILT["folder"] = folder
    return folder


def run_java(folder: Path, cls: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["java", "-cp", str(folder / "build"), cls, "--device", "cpu", *args], cwd=folder,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
