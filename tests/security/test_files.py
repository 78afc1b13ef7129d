"""No corrupt or hostile file is loaded, and no save or compile destroys what is not its own (issue 15).

Both runtimes get the same crafted files: the Python side directly (deepdsl.npzfile, deepdsl.data.mnist,
deepdsl.checkpoint), the Java side through the I/O driver tests/backends/java/IoCheck.java, all its cases in one
JVM run with a small heap (so reading what a header merely claims would fail there). Reading: a flipped byte
(CRC-32), an entry name given twice, bytes after the archive's end and inside an entry, an entry of 4 GiB or more,
headers claiming 1e9 and 1e11 elements, a gzip MNIST file that inflates far beyond its header's size, and a step
counter of 2^62. Writing: a FIFO, directory or device at the target, a symbolic link, the old file's mode and the
umask, a temporary file left by a killed process; `compile` with links planted in its output folder.

Issue 36: the parser-table cache (a pickle) is never loaded from a file others could write, another uid's file, a
link (also one flipped in after the checks), a linked folder, and a FIFO there hangs nothing; every command that
writes a file (run --save, the train block's save, predict, memcheck --plot, import -o/--params, export, compile,
and the Java program's --save/--predict) refuses a link and a read-only file unless --replace-readonly, checks the
temporary name's length before it trains, and `import` writes the network and its weights both or neither.
"""

from __future__ import annotations

import errno
import gzip
import io
import os
import pickle
import stat
import subprocess
import sys
import tracemalloc
import warnings
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path

import lark
import numpy as np
import pytest
from helpers import JAVAC
from security_env import PROGRAMS, ROOT, build_programs, needs_javac, run_java

from deepdsl.checkpoint import load_npz, save_npz
from deepdsl.data import load_data
from deepdsl.errors import DslProgramError
from deepdsl.files import TEMP_SUFFIX
from deepdsl.frontend import parser
from deepdsl.npzfile import read_npz

RUNTIME = ROOT / "deepdsl" / "runtime"
DRIVER = ROOT / "tests" / "backends" / "java" / "IoCheck.java"
W = np.arange(100, dtype=np.float32)


def npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, array, allow_pickle=False)
    return buf.getvalue()


def claiming(shape: tuple[int, ...], data: bytes = b"\0" * 16) -> bytes:
    """A .npy entry whose header claims `shape` of float32 but which holds only `data`."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f4", "fortran_order": False, "shape": shape})
    return buf.getvalue() + data


def archive(path: Path, entries: list[tuple[str, bytes]]) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns about a duplicate name, which is the point
        with zipfile.ZipFile(path, "w") as zf:
            for name, data in entries:
                zf.writestr(name, data)
    return path


def flipped(path: Path) -> Path:
    """A checkpoint holding fc1.W, one byte of its data flipped (the loss was 7.1e35 when Java loaded it)."""
    save_npz(path, {"fc1.W": W, "fc1.b": np.zeros(3, np.float32)})
    raw = bytearray(path.read_bytes())
    at = raw.index(W.tobytes()) + 201
    raw[at] ^= 0x40
    path.write_bytes(bytes(raw))
    return path


def trailing(path: Path) -> Path:
    save_npz(path, {"fc1.W": W})
    with open(path, "ab") as f:
        f.write(b"more bytes after the end record")
    return path


def huge_entry(path: Path) -> Path:
    """An archive whose central directory says its one entry holds 4 GiB + 64 bytes (it holds 464)."""
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("fc1.W.npy", npy(W))
        zf.filelist[0].file_size = zf.filelist[0].compress_size = 2**32 + 64
    return path


# name: (make the file in a folder, the phrase both runtimes' errors must hold)
NPZ_CASES: dict[str, tuple[Callable[[Path], Path], str]] = {
    "crc": (lambda d: flipped(d / "crc.npz"), "CRC-32"),
    "twice": (lambda d: archive(d / "twice.npz", [("w.npy", npy(W)), ("w.npy", npy(W[:3]))]), "appears twice"),
    "after_end": (lambda d: trailing(d / "after.npz"), "bytes of other data after the archive's end"),
    "inside_entry": (lambda d: archive(d / "in.npz", [("w.npy", npy(W) + b"\0" * 8)]), "more data than its header"),
    "4GiB": (lambda d: huge_entry(d / "big.npz"), "entries of 4 GiB or more are not read"),
    "claims_1e11": (lambda d: archive(d / "e11.npz", [("w.npy", claiming((100000, 1000000)))]), "more than one array"),
    "claims_1e9": (lambda d: archive(d / "e9.npz", [("w.npy", claiming((1000, 1000000)))]), "truncated"),
}


def mnist_bomb(folder: Path, inflated: int = 256 * 2**20) -> Path:
    """An MNIST folder whose image file's header promises 2 images of 28x28 (1568 bytes) but whose gzip stream,
    about 256 KB, inflates to 256 MiB."""
    folder.mkdir()
    z = zlib.compressobj(9, zlib.DEFLATED, 31)  # gzip container
    head = (2051).to_bytes(4, "big") + (2).to_bytes(4, "big") + (28).to_bytes(4, "big") * 2 + b"\1" * 1568
    parts = [z.compress(head)]
    zeros = b"\0" * 2**20
    parts += [z.compress(zeros) for _ in range(inflated // 2**20)]
    (folder / "train-images-idx3-ubyte.gz").write_bytes(b"".join(parts) + z.flush())
    (folder / "train-labels-idx1-ubyte").write_bytes((2049).to_bytes(4, "big") + (2).to_bytes(4, "big") + b"\1\2")
    return folder


def mnist_promising_too_much(folder: Path) -> Path:
    folder.mkdir()
    head = (2051).to_bytes(4, "big") + (2**30).to_bytes(4, "big") + (28).to_bytes(4, "big") * 2
    (folder / "train-images-idx3-ubyte.gz").write_bytes(gzip.compress(head + b"\0" * 100))
    (folder / "train-labels-idx1-ubyte").write_bytes((2049).to_bytes(4, "big") + (2).to_bytes(4, "big") + b"\1\2")
    return folder


MNIST_CASES = {
    "bomb": (mnist_bomb, "has more data after the 2 images of 28x28 its header describes"),
    "promise": (mnist_promising_too_much, "more than deepdsl reads"),
}


# ---- reading, Python ----


@pytest.mark.parametrize("case", list(NPZ_CASES))
def test_python_refuses_a_damaged_or_lying_archive(tmp_path: Path, case: str) -> None:
    make, phrase = NPZ_CASES[case]
    path = make(tmp_path)
    tracemalloc.start()
    try:
        with pytest.raises(DslProgramError, match="cannot read parameter file") as e:
            load_npz(path, {"fc1.W": ((100,), np.float32), "fc1.b": ((3,), np.float32), "w": ((100,), np.float32)})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert phrase in str(e.value)
    assert peak < 8 * 2**20  # nothing the header merely claims was allocated


def test_python_reads_what_it_refuses_no_more(tmp_path: Path) -> None:
    """The checks refuse only what they should: an intact archive of every accepted kind reads back."""
    arrays = {"a": W, "b": np.arange(6, dtype=">i2").reshape(2, 3), "c": np.asfortranarray(np.ones((2, 3))), "d": W[0]}
    np.savez(tmp_path / "ok.npz", **arrays)
    got = read_npz(str(tmp_path / "ok.npz"), "npz file")
    assert list(got) == list(arrays) and all(np.array_equal(got[k], v) for k, v in arrays.items())
    assert got["a"].flags.writeable and got["c"].flags.c_contiguous
    np.savez_compressed(tmp_path / "z.npz", x=W)
    assert np.array_equal(read_npz(str(tmp_path / "z.npz"), "npz file")["x"], W)


@pytest.mark.parametrize("case", list(MNIST_CASES))
def test_python_stops_decompressing_at_the_size_the_header_promises(tmp_path: Path, case: str) -> None:
    make, phrase = MNIST_CASES[case]
    folder = make(tmp_path / "mnist")
    tracemalloc.start()
    try:
        with pytest.raises(DslProgramError, match=phrase):
            load_data("mnist", {"dir": str(folder)}, (1, 28, 28), 10, 1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20  # not the 256 MiB the file inflates to


# ---- reading, Java (one JVM) ----


@pytest.fixture(scope="module")
def java_io(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """Every case run by IoCheck in one JVM of 96 MB heap: case -> (its output, the folder it wrote into)."""
    work = tmp_path_factory.mktemp("java_files")
    classes = work / "classes"
    own = [
        RUNTIME / f"{n}.java"
        for n in ("Buf", "Rng", "Init", "Npz", "Npy", "ZipReader", "Data", "DataFiles", "TextData")
    ]
    subprocess.run([*JAVAC, "-nowarn", "-d", str(classes), *map(str, own), str(DRIVER)], check=True, timeout=600)
    lines, cases = [], {}

    def add(case: str, *fields: object) -> None:
        folder = work / case
        folder.mkdir(exist_ok=True)
        out = folder / "case.out"
        lines.append("\t".join([str(fields[0]), str(out), *map(str, fields[1:])]))
        cases[case] = (out, folder)

    for case, (make, _) in NPZ_CASES.items():
        (work / case).mkdir()
        add(case, "npzcopy", make(work / case), work / case / "copy.npz")
    for case, (make, _) in MNIST_CASES.items():
        (work / case).mkdir()
        add(case, "data", f"mnist:{make(work / case / 'mnist')}", "1,28,28", 10, 1, 2, "", 0, 0)
    for case, prepare in SAVE_CASES.items():
        (work / case).mkdir()
        prepare(work / case)
        add(case, "npzmake", work / case / "p.npz")
    (work / "commands.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    old = os.umask(0o027)
    try:
        subprocess.run(["java", "-Xmx96m", "-cp", str(classes), "IoCheck", str(work / "commands.tsv")], check=True,
                       timeout=120)  # fmt: skip
    finally:
        os.umask(old)
    return cases


def java_error(out: Path) -> str:
    err = Path(f"{out}.err")
    assert err.exists(), "the Java side succeeded where it must fail"
    return err.read_text()


@pytest.mark.java
@needs_javac
@pytest.mark.parametrize("case", [*NPZ_CASES, *MNIST_CASES])
def test_java_refuses_what_python_refuses(java_io: dict[str, tuple[Path, Path]], case: str) -> None:
    phrase = {**NPZ_CASES, **MNIST_CASES}[case][1]
    message = java_error(java_io[case][0])
    assert message.startswith("IOException: ") and phrase in message, message


# ---- a step counter of 2^62 ----


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_programs(tmp_path_factory)


@pytest.mark.java
@needs_javac
def test_both_runtimes_refuse_a_step_counter_of_2_to_the_62(programs: Path, cli, tmp_path: Path) -> None:
    file = programs / PROGRAMS["NewlinePoc"][0]
    saved = tmp_path / "p.npz"
    r = cli("run", str(file), "--iters", "0", "--data", "synthetic", "--save", str(saved))
    assert r.exit_code == 0, r.output
    arrays = read_npz(str(saved), "parameter file")
    assert int(arrays["opt/iteration"]) == 0
    save_npz(saved, {**arrays, "opt/iteration": np.array(2**62, np.int64)})
    phrase = f"'opt/iteration' is {2**62}, but a step counter lies in [0, 4294967295]"
    r = cli("run", str(file), "--iters", "1", "--data", "synthetic", "--load", str(saved))
    assert r.exit_code == 1 and phrase in r.output, r.output
    j = run_java(programs, "NewlinePoc", "--iters", "1", "--data", "synthetic", "--load", str(saved))
    assert j.returncode == 1 and phrase in j.stderr, j.stderr


# ---- --save ----


def fifo(folder: Path) -> None:
    os.mkfifo(folder / "p.npz")


def directory(folder: Path) -> None:
    (folder / "p.npz").mkdir()


def link(folder: Path) -> None:
    save_npz(folder / "target.npz", {"old": W})
    os.chmod(folder / "target.npz", 0o640)
    (folder / "p.npz").symlink_to("target.npz")


def read_only(folder: Path) -> None:
    save_npz(folder / "p.npz", {"old": W})
    os.chmod(folder / "p.npz", 0o444)


def mode_0604(folder: Path) -> None:
    save_npz(folder / "p.npz", {"old": W})
    os.chmod(folder / "p.npz", 0o604)


def stale(folder: Path) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    for pid, token in ((dead.pid, "0badf00d"), (1, "00c0ffee")):  # a process that is gone, and init
        (folder / f".p.npz.{pid}.{token}{TEMP_SUFFIX}").write_bytes(b"half a file")
    (folder / f".other.npz.{dead.pid}.0badf00d{TEMP_SUFFIX}").write_bytes(b"not ours to remove")


SAVE_CASES: dict[str, Callable[[Path], None]] = {
    "fifo": fifo,
    "directory": directory,
    "link": link,
    "read-only": read_only,
    "mode": mode_0604,
    "new": lambda folder: None,
    "stale": stale,
}


def check_save(folder: Path, case: str, error: str | None, umask: int) -> None:
    """What a save into `folder` prepared by SAVE_CASES[case] must leave (`error`: its message, if it failed)."""
    target = folder / "p.npz"
    if case in ("fifo", "directory"):
        said = ("is a FIFO", "is a special file (a device, FIFO or socket)") if case == "fifo" else ("is a directory",)
        assert error is not None and any(s in error for s in said), error
        assert "only a regular file is replaced" in error
        assert (stat.S_ISFIFO if case == "fifo" else stat.S_ISDIR)(os.lstat(target).st_mode)
        return
    if case in ("link", "read-only"):  # refused, saying why; the link, the file it names, the file: all as they were
        said = "is a symbolic link" if case == "link" else "is read-only (mode 0444); --replace-readonly replaces it"
        assert error is not None and str(target) in error and said in error, error
        assert target.is_symlink() == (case == "link")
        assert "old" in read_npz(str(target), "parameter file")
        assert stat.S_IMODE(os.stat(target).st_mode) == (0o640 if case == "link" else 0o444)
        assert not [p for p in folder.iterdir() if p.name.endswith(TEMP_SUFFIX)]
        return
    assert error is None, error
    assert "old" not in read_npz(str(target), "parameter file")
    assert stat.S_IMODE(os.lstat(target).st_mode) == {"mode": 0o604}.get(case, 0o666 & ~umask)
    left = sorted(p.name for p in folder.iterdir() if p.name.endswith(TEMP_SUFFIX))
    if case == "stale":  # the dead process's temporary file is gone; the live one's and another file's stay
        assert left == sorted([f".p.npz.1.00c0ffee{TEMP_SUFFIX}", next(n for n in left if n.startswith(".other"))])
    else:
        assert left == []


@pytest.mark.parametrize("case", list(SAVE_CASES))
def test_python_save_replaces_only_a_regular_file_and_keeps_its_mode(tmp_path: Path, case: str) -> None:
    SAVE_CASES[case](tmp_path)
    old = os.umask(0o027)
    try:
        save_npz(tmp_path / "p.npz", {"new": W})
        error = None
    except DslProgramError as e:
        error = str(e)
    finally:
        os.umask(old)
    check_save(tmp_path, case, error, 0o027)


@pytest.mark.java
@needs_javac
@pytest.mark.parametrize("case", list(SAVE_CASES))
def test_java_save_replaces_only_a_regular_file_and_keeps_its_mode(java_io: dict, case: str) -> None:
    out, folder = java_io[case]
    err = Path(f"{out}.err")
    check_save(folder, case, err.read_text() if err.exists() else None, 0o027)


def test_a_device_node_is_never_replaced(tmp_path: Path) -> None:
    device = tmp_path / "p.npz"
    try:
        os.mknod(device, stat.S_IFCHR | 0o600, os.makedev(1, 3))  # what /dev/null is
    except PermissionError:
        pytest.skip("making a device node needs CAP_MKNOD")
    with pytest.raises(DslProgramError, match="is a character device; only a regular file is replaced"):
        save_npz(device, {"new": W})
    assert stat.S_ISCHR(os.lstat(device).st_mode)


# ---- compile ----

NET = """network Tiny
input x : [4, 3]
label y : [4] classes 2
layer fc = full(2)
loss = softmax_cross_entropy(fc(x), y)
"""


def test_compile_refuses_a_planted_link_and_replaces_each_file_whole(tmp_path: Path, cli) -> None:
    (tmp_path / "tiny.ddsl").write_text(NET)
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (out / "Tiny.java").symlink_to(victim)  # a planted link
    kept = tmp_path / "kept.cu"
    kept.write_text("an older copy")
    os.link(kept, out / "Tiny.cu")  # a hard link: an in-place write would change both names
    r = cli("compile", str(tmp_path / "tiny.ddsl"), "-o", str(out))
    assert r.exit_code == 1 and "Tiny.java' is a symbolic link" in r.output, r.output  # refused, none written
    assert (out / "Tiny.java").is_symlink()
    assert not [p for p in out.rglob("*") if p.is_file() and not p.is_symlink() and p.name != "Tiny.cu"]
    (out / "Tiny.java").unlink()
    r = cli("compile", str(tmp_path / "tiny.ddsl"), "-o", str(out))
    assert r.exit_code == 0, r.output
    assert victim.read_text() == "precious" and kept.read_text() == "an older copy"
    assert "class Tiny" in (out / "Tiny.java").read_text() and "Tiny" in (out / "Tiny.cu").read_text()
    assert not [p for p in out.rglob("*") if p.name.endswith(TEMP_SUFFIX)]


@pytest.mark.parametrize("where", [["-o", "out"], ["--maven", "out"]])
def test_compile_refuses_a_planted_link_to_a_folder(tmp_path: Path, cli, where: list[str]) -> None:
    (tmp_path / "tiny.ddsl").write_text(NET)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    planted = out / ("deepdsl" if where[0] == "-o" else "src")
    planted.symlink_to(elsewhere)
    r = cli("compile", str(tmp_path / "tiny.ddsl"), where[0], str(tmp_path / where[1]))
    assert r.exit_code == 1
    assert "is a symbolic link; deepdsl writes only into real folders" in r.output
    assert list(elsewhere.iterdir()) == []


# ---- the parser-table cache: a pickle, so loaded only when no one else could have written it (issue 36) ----

GRAMMAR = parser.grammar_path().read_text()
SOURCE = NET.replace("Tiny", "T")


class _Payload:
    """A pickle that, when loaded, writes `marker`: proof that a cache file was unpickled."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple:
        return (exec, (f"open({self.marker!r}, 'w').write('ran')",))


def private_cache(tmp_path: Path) -> Path:
    folder = tmp_path / "cache"
    folder.mkdir(mode=0o700)
    os.chmod(folder, 0o700)
    return folder


def plant(tmp_path: Path, how: str) -> tuple[Path, Path]:
    """A cache folder whose tables file was planted as `how` holding a payload; (the tables path, the marker)."""
    marker = tmp_path / "payload-ran"
    evil = pickle.dumps(_Payload(marker))
    tables = private_cache(tmp_path) / "grammar.lark"
    if how in ("mode 0666", "mode 0620", "another uid"):
        tables.write_bytes(evil)
        os.chmod(tables, {"mode 0666": 0o666, "mode 0620": 0o620}.get(how, 0o644))
        if how == "another uid":
            if os.geteuid() != 0:
                pytest.skip("giving a file to another uid needs root")
            os.chown(tables, 12345, 12345)
    elif how == "link":  # a link to a file that is ours and private in every other respect
        (tmp_path / "elsewhere.lark").write_bytes(evil)
        os.chmod(tmp_path / "elsewhere.lark", 0o600)
        tables.symlink_to(tmp_path / "elsewhere.lark")
    elif how == "folder link":  # the cache folder a link to a private folder holding the payload
        real = tmp_path / "real"
        real.mkdir(mode=0o700)
        (real / "grammar.lark").write_bytes(evil)
        os.chmod(real / "grammar.lark", 0o600)
        tables.parent.rmdir()
        tables.parent.symlink_to(real)
    return tables, marker


@pytest.mark.parametrize("how", ["mode 0666", "mode 0620", "another uid", "link", "folder link"])
def test_a_cache_file_not_ours_alone_is_never_unpickled(tmp_path: Path, how: str) -> None:
    tables, marker = plant(tmp_path, how)
    p = parser.load_or_build(GRAMMAR, tables)
    assert not marker.exists(), f"the planted pickle ({how}) was loaded and ran"
    assert p.parse(SOURCE).data == "start"  # built anew instead
    if how in ("link", "folder link"):  # the link is not written through either
        planted = tmp_path / ("elsewhere.lark" if how == "link" else "real/grammar.lark")
        assert planted.read_bytes() == pickle.dumps(_Payload(marker))


def test_a_cache_file_flipped_to_a_link_after_the_checks_is_not_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The audit's race: the tables file replaced by a link to another pickle between the checks and the open
    (here right after the first stat of the folder or the file). Checking the opened descriptors closes it."""
    tables, marker = plant(tmp_path, "nothing")
    parser.load_or_build(GRAMMAR, tables)  # good tables, ours alone
    evil = tmp_path / "evil.lark"
    evil.write_bytes(pickle.dumps(_Payload(marker)))
    os.chmod(evil, 0o600)
    real, flipped = os.stat, []

    def flipping(path: object, *args: object, **kwargs: object) -> os.stat_result:
        st = real(path, *args, **kwargs)
        if not flipped and str(path) in (str(tables.parent), tables.name):
            flipped.append(path)
            tables.unlink()
            tables.symlink_to(evil)
        return st

    monkeypatch.setattr(os, "stat", flipping)
    p = parser.load_or_build(GRAMMAR, tables)
    monkeypatch.undo()
    assert flipped and not marker.exists(), "the pickle the link names was loaded"
    assert p.parse(SOURCE).data == "start" and tables.is_symlink()


def test_a_fifo_at_the_cache_path_hangs_no_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = private_cache(tmp_path)
    monkeypatch.setenv("DEEPDSL_CACHE", str(cache))
    tables = parser._tables_file(GRAMMAR)
    assert tables is not None
    os.mkfifo(tables)
    (tmp_path / "t.ddsl").write_text(SOURCE)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DEEPDSL_CACHE": str(cache)}
    try:
        r = subprocess.run([sys.executable, "-m", "deepdsl", "check", str(tmp_path / "t.ddsl")], env=env,
                           capture_output=True, text=True, timeout=30)  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail("`deepdsl check` hung on a FIFO at the parser-table cache path")
    assert r.returncode == 0, r.stderr
    assert stat.S_ISFIFO(os.lstat(tables).st_mode)  # refused, neither read nor replaced


def test_the_tables_are_written_for_the_user_alone_whatever_the_umask(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tables = private_cache(tmp_path) / "grammar.lark"
    old = os.umask(0)
    try:
        parser.load_or_build(GRAMMAR, tables)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.lstat(tables).st_mode) == 0o600

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the tables were built, not loaded")

    monkeypatch.setattr(parser, "Lark", type("NoBuild", (), {"__new__": refuse, "load": lark.Lark.load}))
    assert parser.load_or_build(GRAMMAR, tables).parse(SOURCE).data == "start"  # and the next run loads them


# ---- every write: never through a link, never over a read-only file unless asked (issue 36) ----

PREDICTS = NET + "predict = fc(x)\n"


def writer(tmp_path: Path, cli, command: str) -> tuple[list[str], Path]:  # noqa: ANN001
    """The arguments of a command that writes one file, and that file (nothing there yet)."""
    net = tmp_path / "tiny.ddsl"
    net.write_text(PREDICTS)
    quick = ["--iters", "1", "--data", "synthetic", "--device", "cpu"]
    if command in ("predict", "export", "import -o", "import --params"):
        r = cli("run", str(net), *quick, "--save", str(tmp_path / "trained.npz"))
        assert r.exit_code == 0, r.output
    if command.startswith("import"):
        r = cli("export", str(net), "-o", str(tmp_path / "m.onnx"))
        assert r.exit_code == 0, r.output
    out = tmp_path / "out"
    out.mkdir()
    target = out / {"memcheck --plot": "plot.png", "import -o": "net.ddsl", "export": "m.onnx",
                    "compile": "Tiny.java"}.get(command, "p.npz")  # fmt: skip
    if command == "train block save":
        net.write_text(PREDICTS + f'train {{\n  save = "{target}"\n  iterations = 1\n}}\n')
    args = {
        "run --save": ["run", str(net), *quick, "--save", str(target)],
        "train block save": ["run", str(net), "--data", "synthetic", "--device", "cpu"],
        "predict": ["predict", str(net), "--load", str(tmp_path / "trained.npz"), "--data", "synthetic", "--device",
                    "cpu", "-o", str(target)],
        "memcheck --plot": ["memcheck", str(net), "--plot", str(target)],
        "import -o": ["import", str(tmp_path / "m.onnx"), "-o", str(target), "--params", str(tmp_path / "w.npz")],
        "import --params": ["import", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "i.ddsl"), "--params",
                            str(target)],
        "export": ["export", str(net), "--load", str(tmp_path / "trained.npz"), "-o", str(target)],
        "compile": ["compile", str(net), "-o", str(out)],
    }[command]  # fmt: skip
    return args, target


WRITERS = ["run --save", "train block save", "predict", "memcheck --plot", "import -o", "import --params", "export",
           "compile"]  # fmt: skip


@pytest.mark.parametrize("command", WRITERS)
def test_no_write_goes_through_a_link(tmp_path: Path, cli, command: str) -> None:  # noqa: ANN001
    args, target = writer(tmp_path, cli, command)
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    os.chmod(victim, 0o600)
    target.symlink_to(victim)
    r = cli(*args)
    assert r.exit_code == 1, r.output
    assert str(target) in r.output and "is a symbolic link" in r.output, r.output
    assert "iter 1" not in r.output  # refused before any work
    assert victim.read_bytes() == b"precious" and target.is_symlink()
    if command.startswith("import"):  # the other file of the pair is not written either
        assert not (tmp_path / "i.ddsl").exists() and not (tmp_path / "w.npz").exists()


@pytest.mark.parametrize("command", WRITERS)
def test_a_read_only_file_is_replaced_only_when_asked(tmp_path: Path, cli, command: str) -> None:  # noqa: ANN001
    args, target = writer(tmp_path, cli, command)
    target.write_bytes(b"old")
    os.chmod(target, 0o444)
    r = cli(*args)
    assert r.exit_code == 1, r.output
    assert str(target) in r.output and "is read-only (mode 0444); --replace-readonly replaces it" in r.output
    assert target.read_bytes() == b"old"
    r = cli(*args, "--replace-readonly")
    assert r.exit_code == 0, r.output
    assert target.read_bytes() != b"old" and stat.S_IMODE(os.lstat(target).st_mode) == 0o444  # its mode kept
    assert not [p for p in target.parent.iterdir() if p.name.endswith(TEMP_SUFFIX)]


def test_a_name_too_long_for_its_temporary_file_is_refused_before_training(tmp_path: Path, cli) -> None:  # noqa: ANN001
    """`.NAME.PID.RANDOM.deepdsl-tmp` is longer than NAME: the check before training counts the temporary name, so a
    name that leaves room for it trains and saves, one byte more is refused at once."""
    net = tmp_path / "tiny.ddsl"
    net.write_text(NET)
    room = os.pathconf(tmp_path, "PC_NAME_MAX") - len(f"..{os.getpid()}.01234567{TEMP_SUFFIX}")
    run = ["run", str(net), "--iters", "1", "--data", "synthetic", "--device", "cpu", "--save"]
    r = cli(*run, str(tmp_path / ("p" * (room - 4) + ".npz")))
    assert r.exit_code == 0, r.output
    r = cli(*run, str(tmp_path / ("p" * (room - 3) + ".npz")))
    assert r.exit_code == 1, r.output
    assert "iter 1" not in r.output and "its temporary file would be" in r.output, r.output


def test_import_writes_the_network_only_with_its_weights(tmp_path: Path, cli, monkeypatch) -> None:  # noqa: ANN001
    args, _ = writer(tmp_path, cli, "import --params")
    (tmp_path / "out" / "p.npz").mkdir()  # the weights cannot go there
    r = cli(*args)
    assert r.exit_code == 1 and "is a directory" in r.output, r.output
    assert not (tmp_path / "i.ddsl").exists()

    (tmp_path / "out" / "p.npz").rmdir()

    def full(*a: object, **k: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(np.lib.format, "write_array", full)  # the disk fills while the weights are written
    r = cli(*args)
    assert r.exit_code == 1 and "No space left on device" in r.output, r.output
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [] and not (tmp_path / "i.ddsl").exists()


@pytest.mark.java
@needs_javac
def test_the_java_program_refuses_links_and_read_only_files_unless_asked(programs: Path, tmp_path: Path) -> None:
    """The same rules in the generated program's --save and --predict (Npz.write), checked before it trains."""
    quick = ["--iters", "1", "--data", "synthetic"]
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    (tmp_path / "link.npz").symlink_to(victim)
    j = run_java(programs, "NewlinePoc", *quick, "--save", str(tmp_path / "link.npz"))
    assert j.returncode == 1 and f"'{tmp_path / 'link.npz'}' is a symbolic link" in j.stderr, j.stderr
    assert "iter 1/" not in j.stdout and victim.read_bytes() == b"precious"
    ro = tmp_path / "ro.npz"
    ro.write_bytes(b"old")
    os.chmod(ro, 0o444)
    for args in ([*quick, "--save", str(ro)], ["--predict", str(ro), "--load", str(victim), "--data", "synthetic"]):
        j = run_java(programs, "NewlinePoc", *args)
        assert j.returncode == 1, j.stderr
        assert f"'{ro}' is read-only (mode 0444); --replace-readonly replaces it" in j.stderr, j.stderr
        assert "iter 1/" not in j.stdout and ro.read_bytes() == b"old"
    j = run_java(programs, "NewlinePoc", *quick, "--save", str(ro), "--replace-readonly")
    assert j.returncode == 0, j.stderr
    assert int(read_npz(str(ro), "parameter file")["opt/iteration"]) == 1
    assert stat.S_IMODE(os.lstat(ro).st_mode) == 0o444  # its mode kept
    # `.NAME.PID.RANDOM.deepdsl-tmp`: 23 bytes and the PID's digits more than NAME, counted before training
    pid_max = Path("/proc/sys/kernel/pid_max")
    digits = len(pid_max.read_text().strip()) if pid_max.exists() else 7
    room = 255 - 23 - digits
    j = run_java(programs, "NewlinePoc", *quick, "--save", str(tmp_path / ("p" * (room - 4) + ".npz")))
    assert j.returncode == 0, j.stderr
    j = run_java(programs, "NewlinePoc", *quick, "--save", str(tmp_path / ("p" * 246 + ".npz")))
    assert j.returncode == 1 and "its temporary file would be" in j.stderr, j.stderr
    assert "iter 1/" not in j.stdout
