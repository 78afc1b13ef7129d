"""What the security tests share: three small networks whose source text attacks the Java emitter (the issue's
two proofs of concept and a newline in a file name), and how to run them."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

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


def run_java(folder: Path, cls: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["java", "-cp", str(folder / "build"), cls, "--device", "cpu", *args], cwd=folder,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
