"""What the Java backend's tests share: the JCuda jars, javac and java, and writing programs to compile."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from helpers import JAVAC, ROOT

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


def _javac(folder: Path, sources: list[Path], build: Path, cp: str) -> None:
    r = subprocess.run([*JAVAC, "-encoding", "UTF-8", "-nowarn", "-cp", cp, "-d", str(build), *map(str, sources)],
                       cwd=folder, capture_output=True, text=True, check=False)  # fmt: skip
    assert r.returncode == 0, r.stderr[-6000:]


def _is_runtime(source: Path) -> bool:
    return source.parent.name == "runtime" and source.parent.parent.name == "deepdsl"


def runtime_classes(sources: list[Path]) -> Path:
    """The classes of these runtime sources (deepdsl/runtime/*.java, the repository's or a generated program's
    copy), compiled once for every test run and xdist worker that gives the same text: a folder in the temporary
    directory named for a hash of the sources, the jars and javac, made under a lock and renamed into place
    complete (javac and a JVM cost seconds; the runtime is the same in almost every compile the tests do)."""
    jars = jcuda_jars()
    digest = hashlib.sha256()
    for source in sorted(sources, key=lambda p: p.name):
        digest.update(source.name.encode() + b"\0" + source.read_bytes() + b"\0")
    javac_path = Path(shutil.which("javac") or "javac").resolve()
    digest.update(f"{sorted(p.name for p in jars.glob('*.jar'))} {javac_path}".encode())
    cache = Path(tempfile.gettempdir()) / f"deepdsl-test-runtime-{os.getuid()}"
    done = cache / digest.hexdigest()[:24]
    if done.is_dir():
        return done
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another xdist worker may be compiling the same sources
        if not done.is_dir():
            work = Path(tempfile.mkdtemp(dir=cache))
            try:
                _javac(work, sources, work / "classes", f"{jars}/*")
                (work / "classes").rename(done)
            finally:
                shutil.rmtree(work)
    return done


def javac(folder: Path, sources: list[Path], build: Path) -> None:
    """Compile `sources` into `build` against the JCuda jars; a compile error fails the test with javac's text.
    The runtime sources among them (deepdsl/runtime/*.java) are compiled once a run (runtime_classes) and their
    classes copied into `build`; javac compiles the rest against them. javac runs in `folder` (a temporary one),
    since a javac that fails writes javac.DATE.args into its cwd."""
    runtime = [p for p in sources if _is_runtime(Path(p))]
    own = [p for p in sources if not _is_runtime(Path(p))]
    cp = f"{jcuda_jars()}/*"
    if runtime and own:
        classes = runtime_classes([Path(p) for p in runtime])
        shutil.copytree(classes, build, dirs_exist_ok=True)
        cp = f"{classes}:{cp}"
    _javac(folder, own or runtime, build, cp)


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


JNA = "jna-5.19.1.jar"  # .ci/jcuda/pom.xml's net.java.dev.jna:jna, the Java CPU device's MPI binding


def jna_jar() -> Path:
    """JNA's jar (data-parallel runs of the Java CPU device): in the jars' folder, else Maven's local repository
    (fetched with mvn where missing); skips the test where neither has it."""
    for candidate in (jcuda_jars() / JNA, Path.home() / ".m2/repository/net/java/dev/jna/jna/5.19.1" / JNA):
        if candidate.is_file():
            return candidate
    if shutil.which("mvn") is not None:
        subprocess.run(["mvn", "-B", "-q", "dependency:get", "-Dartifact=net.java.dev.jna:jna:5.19.1"], check=False)
        fetched = Path.home() / ".m2/repository/net/java/dev/jna/jna/5.19.1" / JNA
        if fetched.is_file():
            return fetched
    pytest.skip(f"no {JNA} (mvn -f .ci/jcuda/pom.xml dependency:copy-dependencies fetches it)")


def mpi() -> tuple[str, Path]:
    """The `mpiexec` of the test environment's MPI (PyPI's mpich, the dist extra) and the folder of its libraries;
    skips the test without them."""
    import sys

    mpiexec = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or shutil.which("mpiexec")
    if mpiexec is None:
        pytest.skip("no mpiexec: pip install 'deepdsl[dist]' (mpi4py, mpich)")
    lib = Path(mpiexec).resolve().parent.parent / "lib"
    if not (lib / "libmpi_abi.so.1").exists():
        pytest.skip(f"no libmpi_abi.so.1 beside {mpiexec} (pip install mpich==5.0.2)")
    return mpiexec, lib


def launch_env(**extra: str) -> dict[str, str]:
    """The environment of a launched test run: no launcher's variables of the caller's own, plus `extra`."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "OMPI_", "SLURM_", "DEEPDSL_DP", "MPI_LOCAL", "NCCL_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}  # fmt: skip
    return {**env, **extra}
