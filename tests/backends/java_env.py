"""What the Java backend's tests share: the JCuda jars, javac and java, and writing programs to compile."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT

JCUDA = ROOT / ".ci" / "jcuda"
JAVA_MARKS = [
    pytest.mark.java,
    pytest.mark.skipif(
        shutil.which("javac") is None or shutil.which("java") is None, reason="javac and java (JDK 17) are not on PATH"
    ),  # fmt: skip
]


def jcuda_jars() -> Path:
    """The folder of the jars of .ci/jcuda/pom.xml (JCuda, and OpenBLAS and CUDA through JavaCPP):
    $DEEPDSL_JCUDA_JARS, else .ci/jcuda/lib (fetched with Maven when any is missing)."""
    folder = Path(os.environ.get("DEEPDSL_JCUDA_JARS", JCUDA / "lib"))
    if not all(list(folder.glob(f"{jar}-*.jar")) for jar in ("jcuda", "openblas", "cuda")):
        if shutil.which("mvn") is not None:
            subprocess.run(["mvn", "-B", "-q", "-f", str(JCUDA / "pom.xml"), "dependency:copy-dependencies",
                            f"-DoutputDirectory={folder.resolve()}"], check=True)  # fmt: skip
        elif not list(folder.glob("jcuda-*.jar")):
            pytest.skip(f"no JCuda jars in {folder} and no mvn to fetch them (bash .ci/run fetches them)")
    return folder


def openblas_classpath() -> str:
    """The class path entry of the OpenBLAS jars (JavaCPP's presets and their natives), for `java -cp`."""
    folder = jcuda_jars()
    if not list(folder.glob("openblas-*.jar")):
        pytest.skip(f"no OpenBLAS jars in {folder} and no mvn to fetch them (bash .ci/run fetches them)")
    return f"{folder}/*"


def javac(folder: Path, sources: list[Path], build: Path) -> None:
    """Compile `sources` into `build` against the JCuda jars; a compile error fails the test with javac's text.
    javac runs in `folder` (a temporary one), since a javac that fails writes javac.DATE.args into its cwd."""
    cp = f"{jcuda_jars()}/*"
    r = subprocess.run(["javac", "-encoding", "UTF-8", "-nowarn", "-cp", cp, "-d", str(build), *map(str, sources)],
                       cwd=folder, capture_output=True, text=True, check=False)  # fmt: skip
    assert r.returncode == 0, r.stderr[-6000:]


def java(build: Path, main: str, *args: str, cwd: Path | None = None, jcuda: bool = False,
         timeout: int = 300) -> subprocess.CompletedProcess:  # fmt: skip
    """Run `main` from `build` (with the jars of .ci/jcuda, JCuda's and OpenBLAS's, on the class path only when
    asked), in `cwd` (default: `build`,
    never the repository: a crashing JVM writes hs_err_pid*.log into its working directory)."""
    cp = f"{build}:{jcuda_jars()}/*" if jcuda else str(build)
    return subprocess.run(["java", "-cp", cp, main, *args], cwd=cwd or build, capture_output=True, text=True,
                          timeout=timeout, check=False)  # fmt: skip


def java_json(build: Path, main: str, *args: str, cwd: Path | None = None) -> dict:
    r = java(build, main, *args, "--json", cwd=cwd)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)
