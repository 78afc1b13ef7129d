"""Readers check sizes before they allocate, and the two npz readers read alike (issue 36, items 4, 6 and 10).

One corpus of crafted archives (npz_corpus.py) goes through both npz readers: deepdsl/npzfile/ here, and
deepdsl/runtime/Npz.java through the driver java/NpzRead.java, every archive in one JVM of 256 MB heap (so
allocating what a record merely claims fails the run). For each archive they must agree: both accept it with the
same arrays (names, shapes, values), or both refuse it, in words holding the case's phrase. The archives that
would cost gigabytes read naively are also read by Python in a subprocess whose peak RSS must stay under 256 MB.
The data readers (MNIST, CIFAR-10, text) get files whose headers or sizes are past their limits, in both runtimes.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from helpers import JAVAC
from npz_corpus import CASES, MEMORY_CASES, write_corpus
from security_env import ROOT, needs_javac

from deepdsl.errors import DslProgramError
from deepdsl.npzfile import read_npz

RUNTIME = ROOT / "deepdsl" / "runtime"
HERE = Path(__file__).resolve().parent
LIMIT = 256 * 2**20  # the peak memory a crafted file may cost


@pytest.fixture(scope="session")
def java_reader(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The runtime's readers and the drivers, compiled once a session: the classes folder."""
    classes = tmp_path_factory.mktemp("reader_classes")
    sources = [
        RUNTIME / f"{n}.java"
        for n in ("Buf", "Rng", "Init", "Npz", "Npy", "ZipReader", "Data", "DataFiles", "TextData")
    ]
    sources += [HERE / "java" / "NpzRead.java", HERE / "java" / "DataRead.java"]
    r = subprocess.run([*JAVAC, "-nowarn", "-d", str(classes), *map(str, sources)], capture_output=True, text=True,
                       timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stderr[-4000:]
    return classes


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str]]:
    return write_corpus(tmp_path_factory.mktemp("npz_corpus"))


@pytest.fixture(scope="module")
def java_results(java_reader: Path, corpus: dict[str, tuple[Path, str]], tmp_path_factory) -> dict[str, str]:  # noqa: ANN001
    """Every archive of the corpus read by Npz.read in one JVM of 256 MB heap: case -> its line."""
    work = tmp_path_factory.mktemp("npz_java")
    (work / "list").write_text("".join(f"{path}\n" for path, _ in corpus.values()), encoding="utf-8")
    r = subprocess.run(["java", "-Xmx256m", "-cp", str(java_reader), "NpzRead", str(work / "list"), str(work / "out")],
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, f"the Java reader did not get through the corpus in 256 MB:\n{r.stderr[-3000:]}"
    lines = (work / "out").read_text(encoding="utf-8").splitlines()
    return dict(zip(corpus, lines, strict=True))


def python_result(path: Path) -> str:
    """What read_npz makes of `path`, in NpzRead's words: OK and each array's name, kind, shape and CRC-32 of its
    values as the runtimes use them (float32 or int64, little-endian), or ERR and the message."""
    try:
        arrays = read_npz(str(path), "npz file")
    except DslProgramError as e:
        return f"ERR\t{e}"
    parts = ["OK"]
    for name, a in arrays.items():
        kind, as_used = ("f", "<f4") if a.dtype.kind == "f" else ("i", "<i8")
        values = np.ascontiguousarray(a, dtype=as_used).tobytes()
        parts.append(f"{name} {kind} [{','.join(map(str, a.shape))}] {zlib.crc32(values):x}")
    return "\t".join(parts)


@pytest.mark.java
@needs_javac
@pytest.mark.parametrize("case", list(CASES))
def test_both_npz_readers_read_each_archive_alike(corpus, java_results, case: str) -> None:  # noqa: ANN001
    path, verdict = corpus[case]
    python, java = python_result(path), java_results[case]
    if verdict == "accept":
        assert python.startswith("OK"), python
        assert java == python, f"Python: {python}\nJava:   {java}"
    else:
        assert python.startswith("ERR") and java.startswith("ERR"), f"Python: {python}\nJava:   {java}"
        assert verdict in python and verdict in java, f"Python: {python}\nJava:   {java}"
        assert str(path) in python and str(path) in java  # the file is named


@pytest.mark.parametrize("case", [c for c, (_, v) in CASES.items() if v != "accept"])
def test_python_refuses_with_a_user_error(corpus, case: str) -> None:  # noqa: ANN001
    """No traceback from any crafted archive: a DslProgramError naming the file (exit 1 at the CLI)."""
    path, verdict = corpus[case]
    with pytest.raises(DslProgramError, match=re.escape(verdict)):
        read_npz(str(path), "npz file")


READ = """
import sys
from deepdsl.errors import DslProgramError
from deepdsl.npzfile import read_npz
try:
    read_npz(sys.argv[1], "npz file")
except DslProgramError as e:
    print(e)
    sys.exit(1)
"""

MEASURE = """
import resource, subprocess, sys
r = subprocess.run(sys.argv[1:], capture_output=True, text=True)
print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024, r.stdout.strip(), r.stderr[-500:])
"""


def peak_rss(*command: str) -> tuple[int, int, str]:
    """Exit status, peak RSS in bytes and output of `command`, run as the only child of a fresh process."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", MEASURE, *command], capture_output=True, text=True, env=env,
                       timeout=300, check=True)  # fmt: skip
    status, peak, output = r.stdout.split(" ", 2)
    return int(status), int(peak), output


@pytest.mark.parametrize("case", MEMORY_CASES)
def test_python_refuses_a_bomb_in_256_mb(corpus, case: str) -> None:  # noqa: ANN001
    path, verdict = corpus[case]
    status, peak, output = peak_rss(sys.executable, "-c", READ, str(path))
    assert status == 1 and verdict in output, output
    assert peak < LIMIT, f"{case}: peak RSS {peak / 2**20:.0f} MiB"


# ---- the data readers: MNIST, CIFAR-10, text ----


def _idx(path: Path, magic: int, counts: tuple[int, ...], data: bytes = b"", gz_zeros: int = 0) -> None:
    """An IDX file of `counts` followed by `data`; with `gz_zeros`, gzip-compressed and followed by that many zeros
    (compressed a MiB at a time)."""
    head = magic.to_bytes(4, "big") + b"".join(n.to_bytes(4, "big") for n in counts)
    if not gz_zeros:
        path.write_bytes(head + data)
        return
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    parts = [z.compress(head + data)]
    parts += [z.compress(b"\0" * 2**20) for _ in range(gz_zeros // 2**20)]
    path.with_name(path.name + ".gz").write_bytes(b"".join(parts) + z.flush())


def _mnist(folder: Path, images: tuple[int, ...], gz_zeros: int = 0) -> str:
    folder.mkdir()
    _idx(folder / "train-images-idx3-ubyte", 2051, images, b"" if gz_zeros else b"\1" * 784, gz_zeros)
    _idx(folder / "train-labels-idx1-ubyte", 2049, (1,), b"\3")
    return f"mnist:{folder}"


def _cifar(folder: Path, first_bytes: int | None = None) -> str:
    folder.mkdir()
    for k in range(1, 6):
        with open(folder / f"data_batch_{k}.bin", "wb") as f:
            f.write(b"\1" * 3073 * 2)
            if k == 1 and first_bytes is not None:
                f.truncate(first_bytes)  # sparse: costs no disk
    return f"cifar10:{folder}"


def _text(path: Path, size: int | None = None) -> str:
    with open(path, "wb") as f:
        f.write(b"hello, world\n" * 20)
        if size is not None:
            f.truncate(size)
    return f"text:{path}"


# case: (make the source in a folder -> its --data flag (and, for text, tokens and vocabulary), verdict)
DATA_CASES = {
    "mnist_ok": (lambda d: _mnist(d / "m", (1, 28, 28)), "OK\t1 0"),
    # the product of the counts is 2^64: it wrapped to 0 in the Java reader's long
    "mnist_counts_overflow": (lambda d: _mnist(d / "m", (2**21, 2**21, 2**22)), "more than deepdsl reads"),
    # 300 MiB promised and really there, in a gzip file of 300 KB
    "mnist_gzip_bomb": (lambda d: _mnist(d / "m", (401_200, 28, 28), gz_zeros=401_200 * 784), "deepdsl inflates"),
    "mnist_promises_more_than_the_file": (lambda d: _mnist(d / "m", (100_000, 28, 28)), "is truncated"),
    "cifar_ok": (lambda d: _cifar(d / "c"), "OK\t10 0"),
    "cifar_3gb": (lambda d: _cifar(d / "c", 3 * 10**9), "more than deepdsl reads"),
    "text_ok": (lambda d: _text(d / "t.txt") + "\t4\t16", "OK\t"),
    "text_3gb": (lambda d: _text(d / "t.txt", 3 * 10**9) + "\t4\t16", "more than deepdsl reads"),
}

READ_DATA = """
import sys
from deepdsl.errors import DslProgramError
from deepdsl.data import load_data
from deepdsl.data.text import text_samples
flag = sys.argv[1].split("\\t")
kind, path = flag[0].split(":", 1)
try:
    if kind == "text":
        (x, _), test = text_samples(path, int(flag[1]), int(flag[2]), "input t")
        print(f"OK\\t{len(x)} {len(test[0]) if test else 0}")
    else:
        ds = load_data(kind, {"dir": path}, (1, 28, 28) if kind == "mnist" else (3, 32, 32), 10, 1)
        print(f"OK\\t{len(ds.x_train)} {0 if ds.x_test is None else len(ds.x_test)}")
except DslProgramError as e:
    print(f"ERR\\t{e}")
    sys.exit(1)
"""


@pytest.fixture(scope="module")
def data_sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("data_sources")
    out = {}
    for case, (make, _) in DATA_CASES.items():
        (folder / case).mkdir()
        out[case] = make(folder / case)
    return out


@pytest.mark.parametrize("case", list(DATA_CASES))
def test_python_data_readers_check_sizes_first(data_sources: dict[str, str], case: str) -> None:
    """Each source read in a subprocess: the verdict, and a peak RSS under 256 MB."""
    verdict = DATA_CASES[case][1]
    status, peak, output = peak_rss(sys.executable, "-c", READ_DATA, data_sources[case])
    assert verdict in output and status == (0 if verdict.startswith("OK") else 1), output
    assert peak < LIMIT, f"{case}: peak RSS {peak / 2**20:.0f} MiB"


@pytest.mark.java
@needs_javac
def test_java_data_readers_check_sizes_first(java_reader: Path, data_sources: dict[str, str], tmp_path: Path) -> None:
    """Every source in one JVM of 256 MB heap: the same verdicts as Python's."""
    (tmp_path / "list").write_text("".join(f"{flag}\n" for flag in data_sources.values()), encoding="utf-8")
    r = subprocess.run(["java", "-Xmx256m", "-cp", str(java_reader), "DataRead", str(tmp_path / "list"),
                        str(tmp_path / "out")], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, f"the Java readers did not get through the sources in 256 MB:\n{r.stderr[-3000:]}"
    lines = (tmp_path / "out").read_text(encoding="utf-8").splitlines()
    for case, line in zip(DATA_CASES, lines, strict=True):
        assert DATA_CASES[case][1] in line, (case, line)
