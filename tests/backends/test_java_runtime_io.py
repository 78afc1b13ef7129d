"""The Java runtime's I/O and randomness (Rng, Init, Npz, Data) against the Python side, bit for bit.

Every case registers its inputs and a command for the driver tests/backends/java/IoCheck.java; the
module fixture compiles the runtime once, runs all commands in one JVM, and each test then checks
its own outputs against the Python reference (deepdsl.initializers, deepdsl.ops.random,
deepdsl.checkpoint, deepdsl.data).
"""

from __future__ import annotations

import gzip
import io
import shutil
import subprocess
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from helpers import JAVAC

from deepdsl.checkpoint import load_npz, save_npz
from deepdsl.data import load_data, parse_data_flag
from deepdsl.errors import DslProgramError
from deepdsl.initializers import (
    MASK64,
    fnv1a64,
    init_array,
    normal_array,
    splitmix64_array,
    stream_seed,
    uniform_array,
)
from deepdsl.ir.registry import lookup

pytestmark = [
    pytest.mark.java,
    pytest.mark.skipif(
        shutil.which("javac") is None or shutil.which("java") is None,
        reason="javac and java (JDK 17+) are not on PATH",
    ),
]

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = ROOT / "deepdsl" / "runtime"
DRIVER = Path(__file__).resolve().parent / "java" / "IoCheck.java"
OWN_SOURCES = (
    "Buf",
    "Rng",
    "Init",
    "Npz",
    "Npy",
    "ZipReader",
    "Data",
    "DataFiles",
    "TextData",
    "CsvData",
    "ImageFolder",
)


class Batch:
    """The commands of one JVM run; `add` returns the output path of a new case."""

    def __init__(self, work: Path):
        self.work = work
        self.lines: list[str] = []

    def path(self, name: str) -> Path:
        return self.work / name

    def add(self, command: str, *args: object) -> Path:
        out = self.work / f"case{len(self.lines)}.out"
        fields = [command, str(out), *(_field(a) for a in args)]
        assert not any("\t" in f or "\n" in f for f in fields)
        self.lines.append("\t".join(fields))
        return out


def _field(value: object) -> str:
    if isinstance(value, (tuple, list)):
        return ",".join(_field(v) for v in value)
    if isinstance(value, float):
        return repr(value)
    if value is None:
        return ""
    return str(value)


def result(out: Path) -> Path:
    """`out`, failing with the driver's message if the case threw."""
    err = Path(f"{out}.err")
    if err.exists():
        pytest.fail(f"the Java side failed: {err.read_text()}")
    return out


def error(out: Path) -> str:
    """The driver's message for a case that must throw."""
    err = Path(f"{out}.err")
    assert err.exists(), "the Java side succeeded where it must fail"
    return err.read_text()


def floats(out: Path) -> np.ndarray:
    return np.fromfile(result(out), dtype="<f4")


CASES: dict[str, Callable[[Batch], Callable[[], None]]] = {}


def case(build: Callable[[Batch], Callable[[], None]]) -> Callable[[Batch], Callable[[], None]]:
    """Register a case: `build(batch)` writes inputs, adds commands, and returns the check to run after."""
    CASES[build.__name__] = build
    return build


def compile_runtime(classes: Path) -> None:
    """The sources tested here, which must compile warning-free, and the driver: only these, since IoCheck needs
    nothing else and the rest of deepdsl/runtime (its CUDA sources) does not compile without the JCuda jars. javac
    runs in the temporary folder, not the repository: a javac that fails writes javac.DATE.args into its working
    directory."""
    own = [str(RUNTIME / f"{name}.java") for name in OWN_SOURCES] + [str(DRIVER)]
    subprocess.run([*JAVAC, "-Xlint:all", "-Werror", "-d", str(classes), *own], cwd=classes.parent, check=True)


@pytest.fixture(scope="module")
def checks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Callable[[], None]]:
    work = tmp_path_factory.mktemp("java_io")
    classes = work / "classes"
    compile_runtime(classes)
    batch = Batch(work)
    prepared = {name: build(batch) for name, build in CASES.items()}
    commands = work / "commands.tsv"
    commands.write_text("\n".join(batch.lines) + "\n", encoding="utf-8")
    subprocess.run(["java", "-cp", str(classes), "IoCheck", str(commands)], cwd=work, check=True, timeout=120)
    return prepared


# ---- Rng ----


@case
def fnv_hashes(b: Batch) -> Callable[[], None]:
    texts = ["", "cv1.W", "ünï.W", "shuffle/3", "a" * 100]
    outs = [b.add("fnv", t) for t in texts]

    def check() -> None:
        assert [int(result(o).read_text(), 16) for o in outs] == [fnv1a64(t) for t in texts]
        assert fnv1a64("cv1.W") == 0x719C94BF31634354

    return check


@case
def streams(b: Batch) -> Callable[[], None]:
    seeds = [stream_seed("cv1.W", 1), 0, MASK64, 0x8000000000000000]
    count = 1000
    outs = [b.add("stream", s, count) for s in seeds]

    def check() -> None:
        for seed, out in zip(seeds, outs):
            data = result(out).read_bytes()
            raw, at = (np.frombuffer(data, "<u8", count, k * 8 * count) for k in (0, 3))
            uniform, normal = (np.frombuffer(data, "<f8", count, k * 8 * count) for k in (1, 2))
            assert np.array_equal(raw, splitmix64_array(seed, count))
            assert np.array_equal(at, raw)
            assert np.array_equal(uniform, uniform_array(seed, count))
            # log and cos may differ in the last float64 bit between libraries (initializers.py docstring)
            np.testing.assert_array_max_ulp(normal, normal_array(seed, count), maxulp=2)
        first = np.frombuffer(result(outs[0]).read_bytes(), "<u8", 3)
        assert [int(v) for v in first] == [0xC0D9C6BE86FB3ECD, 0xC39AB565BAC66E63, 0x6FBD1FE4D5E6B470]

    return check


@case
def dropout_masks(b: Batch) -> Callable[[], None]:
    cases = [
        ((4, 100), 0, 0.5, 1, "drop1"),
        ((3, 5, 7), 5, 0.1, MASK64 - 2, "fc6.dropout"),
        ((1000,), 2**40, 0.7, 42, "d"),
        ((10,), 3, 0.0, 1, "d"),
        ((2, 50), 7, 0.3, 9, "d2"),
        # The first uniform of this mask is exactly float32(0.7) = 11744051 / 2^24, just below 0.7: dropped.
        ((3,), 9252733, 0.7, 1, "drop1"),
    ]
    outs = [b.add("mask", shape, step, p, seed, site) for shape, step, p, seed, site in cases]

    def check() -> None:
        for (shape, step, p, seed, site), out in zip(cases, outs):
            want = lookup("dropout_mask").numpy((np.int64(step),), {"shape": shape, "p": p, "seed": seed, "site": site})
            assert floats(out).tobytes() == want.tobytes(), (shape, step, p, seed, site)
        assert floats(outs[-1])[0] == 0.0

    return check


# ---- Init ----

INITS = [
    ("cv1.W", (6, 1, 5, 5), "he", (), 25, 150, 1),
    ("cv2.W", (64, 3, 11, 11), "he", (), 363, 0, 7),
    ("fc2.W", (10, 84), "xavier", (), 84, 10, -1),
    ("ünï.W", (3, 4), "xavier", (), 4, 3, 2**63 + 5),
    ("g.W", (100, 7), "gaussian", (0.01,), 0, 0, 0),
    ("u.W", (5,), "uniform", (0.05,), 0, 0, 12345),
    ("bn.gamma", (16,), "constant", (1.0,), 0, 0, 1),
    ("bn.beta", (), "constant", (0.1,), 0, 0, 1),
    ("z.W", (0, 3), "he", (), 3, 0, 1),
]


@case
def init_kinds(b: Batch) -> Callable[[], None]:
    outs = [
        b.add("init", name, shape, kind, args, fan_in, fan_out, seed & MASK64)
        for name, shape, kind, args, fan_in, fan_out, seed in INITS
    ]
    bad = [
        (b.add("init", "x.W", (2,), "kaiming", (), 1, 1, 1), "unknown initialiser 'kaiming'"),
        (b.add("init", "x.W", (2,), "gaussian", (), 1, 1, 1), "takes 1 argument(s), got 0"),
        (b.add("init", "x.W", (2,), "he", (), 0, 1, 1), "needs a positive fan_in"),
    ]

    def check() -> None:
        for spec, out in zip(INITS, outs):
            want = init_array(*spec)
            assert floats(out).tobytes() == want.tobytes(), spec[:3]
        assert floats(outs[0])[:3].tolist() == np.array([0.0418091, 0.18186393, 0.4434315], np.float32).tolist()
        for out, phrase in bad:
            assert phrase in error(out)

    return check


# ---- Npz ----


def _zip64_extra_in_local_header(path: Path) -> bool:
    data = path.read_bytes()
    name_len, extra_len = int.from_bytes(data[26:28], "little"), int.from_bytes(data[28:30], "little")
    extra = data[30 + name_len : 30 + name_len + extra_len]
    return extra_len >= 4 and int.from_bytes(extra[:2], "little") == 1


def _npz_with_versions(path: Path, arrays: dict[str, tuple[np.ndarray, tuple[int, int]]]) -> None:
    with zipfile.ZipFile(path, "w") as zf:
        for name, (value, version) in arrays.items():
            buf = io.BytesIO()
            np.lib.format.write_array(buf, value, version=version)
            zf.writestr(name + ".npy", buf.getvalue())


def _canonical(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float32 if a.dtype.kind == "f" else np.int64, order="C")


@case
def npz_python_to_java_to_python(b: Batch) -> Callable[[], None]:
    rng = np.random.default_rng(0)
    saved = {
        "cv1.W": rng.standard_normal((6, 1, 5, 5)).astype(np.float32),
        "cv1.b": rng.standard_normal(6).astype(np.float32),
        "bn1.running_var": np.ones(6, np.float32),
        "opt/cv1.W/momentum": rng.standard_normal((6, 1, 5, 5)).astype(np.float32),
        "opt/step": np.array(17, np.int64),
        "ids": np.array([-(2**63), -1, 0, 1, 2**63 - 1], np.int64),
        "opt/iteration": np.array(3, np.int64),
    }
    src, dst = b.path("ckpt.npz"), b.path("ckpt_java.npz")
    save_npz(src, saved)
    copied = b.add("npzcopy", src, dst)
    # np.savez, np.savez_compressed and .npy versions 2.0 and 3.0, with types the reader converts
    varied = {
        "f64": rng.standard_normal((3, 4)),
        "i32": np.array([[-5, 7], [2**31 - 1, -(2**31)]], np.int32),
        "u8": np.arange(250, 256, dtype=np.uint8),
        "u64": np.array([0, 2**63 - 1], np.uint64),
        "f16": np.array([1.5, -0.0, 65504, 6e-8, np.inf], np.float16),
        "fortran": np.asfortranarray(rng.standard_normal((3, 4, 2)).astype(np.float32)),
        "big": np.arange(6, dtype=">f4").reshape(2, 3),
        "scalar": np.float32(2.5),
    }
    plain, compressed, versions = b.path("np.npz"), b.path("npc.npz"), b.path("v23.npz")
    np.savez(plain, **varied)
    np.savez_compressed(compressed, **varied)
    _npz_with_versions(versions, {"v2": (varied["f64"], (2, 0)), "v3/ünï": (varied["i32"], (3, 0))})
    copies = {p: (b.add("npzcopy", p, b.path(f"{p.stem}_java.npz")), b.path(f"{p.stem}_java.npz"))
              for p in (plain, compressed, versions)}  # fmt: skip

    def check() -> None:
        assert _zip64_extra_in_local_header(src)  # what save_npz writes, as np.savez does
        result(copied)
        with np.load(dst) as z:
            assert z.files == list(saved)
            for name, value in saved.items():
                assert z[name].dtype == value.dtype and z[name].tobytes() == value.tobytes(), name
        loaded = load_npz(dst, {k: (v.shape, v.dtype) for k, v in saved.items()})
        assert all(loaded[k].tobytes() == v.tobytes() for k, v in saved.items())
        with zipfile.ZipFile(dst) as zf:
            assert [i.filename for i in zf.infolist()] == [k + ".npy" for k in saved]
            assert {i.compress_type for i in zf.infolist()} == {zipfile.ZIP_STORED}
        for src_path, (case_out, out) in copies.items():
            result(case_out)
            with np.load(src_path) as want, np.load(out) as got:
                assert got.files == want.files
                for name in want.files:
                    w = _canonical(want[name])
                    assert got[name].dtype == w.dtype and got[name].shape == w.shape, name
                    assert got[name].tobytes() == w.tobytes(), name

    return check


@case
def npz_java_to_python(b: Batch) -> Callable[[], None]:
    folder = b.path("made")
    folder.mkdir()
    out = folder / "made.npz"
    made = [b.add("npzmake", out) for _ in range(2)]  # the second write replaces the first
    missing = b.add("npzmake", b.path("no/such/folder/p.npz"))

    def check() -> None:
        for case_out in made:
            result(case_out)
        assert [p.name for p in folder.iterdir()] == ["made.npz"]  # no temp file left behind
        want = {
            "cv1.W": (np.arange(24, dtype=np.float32) * np.float32(0.25) - np.float32(1.5)).reshape(2, 3, 4),
            "cv1.b": np.array([np.finfo(np.float32).smallest_subnormal, -0.0, np.finfo(np.float32).max], np.float32),
            "opt/cv1.W/momentum": np.zeros((2, 3, 4), np.float32),
            "empty": np.zeros((0, 5), np.float32),
            "labels": np.array([-(2**63), -1, 0, 1, 2**63 - 1], np.int64),
            "opt/step": np.array(42, np.int64),
            "opt/lr": np.array(0.01, np.float32),
        }
        with np.load(out) as z:
            assert z.files == list(want)
            for name, value in want.items():
                got = z[name]
                assert got.dtype == value.dtype and got.shape == value.shape and got.tobytes() == value.tobytes()
        loaded = load_npz(out, {k: (v.shape, v.dtype) for k, v in want.items()})
        assert list(loaded) == list(want)
        assert "does not exist" in error(missing)

    return check


@case
def npz_errors(b: Batch) -> Callable[[], None]:
    text = b.path("text.npz")
    text.write_text("not a zip")
    other = b.path("other.npz")
    with zipfile.ZipFile(other, "w") as zf:
        zf.writestr("readme.txt", "hello")
    short = b.path("short.npz")
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.zeros(10, np.float32))
    with zipfile.ZipFile(short, "w") as zf:
        zf.writestr("w.npy", buf.getvalue()[:-8])
    long_ = b.path("long.npz")
    with zipfile.ZipFile(long_, "w") as zf:
        zf.writestr("w.npy", buf.getvalue() + b"\0\0\0\0")
    flags = b.path("bool.npz")
    np.savez(flags, m=np.array([True, False]))
    copy = b.path("copy.npz")
    cases = {
        b.add("npzcopy", b.path("absent.npz"), copy): ("absent.npz", "not found"),
        b.add("npzcopy", text, copy): ("text.npz", "is not an .npz archive"),
        b.add("npzcopy", other, copy): ("'readme.txt'", "not a .npy array"),
        b.add("npzcopy", short, copy): ("'w.npy'", "truncated"),
        b.add("npzcopy", long_, copy): ("'w.npy'", "more data than its header's 10 elements"),
        b.add("npzcopy", flags, copy): ("'m.npy'", "unsupported element type '|b1'"),
    }

    def check() -> None:
        for out, phrases in cases.items():
            message = error(out)
            assert message.startswith("IOException: ")
            assert all(p in message for p in phrases), message
        assert not copy.exists()

    return check


# ---- Data ----

FLAGS = [
    "synthetic",
    "synthetic:7",
    "synthetic:0x1F",
    "synthetic: -5 ",
    "synthetic:1_000",
    "synthetic:0o17",
    "synthetic:0B101",
    "synthetic:00",
    f"synthetic:{2**64 + 5}",
    " cifar10 :some dir",
    "mnist:data/mnist",
    "npz:a:b.npz",
    "synthetic:010",
    "synthetic:1__0",
    "synthetic:",
    "synthetic:abc",
    "npz:",
    "imagenet:x",
]


@case
def data_flags(b: Batch) -> Callable[[], None]:
    outs = [b.add("flag", text) for text in FLAGS]

    def check() -> None:
        for text, out in zip(FLAGS, outs):
            try:
                kind, args = parse_data_flag(text)
            except DslProgramError:
                assert error(out).startswith("IllegalArgumentException: "), text
                continue
            seed = args.get("seed")
            path = args.get("dir", args.get("file", "null"))
            want = f"{kind}|{path}|{'null' if seed is None else seed & MASK64}"
            assert result(out).read_text(encoding="utf-8") == want, text

    return check


def _write_idx(path: Path, magic: int, dims: list[int], body: bytes, gz: bool = False) -> None:
    data = b"".join(d.to_bytes(4, "big") for d in [magic, *dims]) + body
    if gz:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)


def _fake_mnist(folder: Path, n: int, n_test: int, seed: int, gz_train: bool = False) -> None:
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    for prefix, count, gz in (("train", n, gz_train), ("t10k", n_test, True)):
        if count:
            pixels = rng.integers(0, 256, count * 30, dtype=np.uint8).tobytes()
            labels = rng.integers(0, 10, count, dtype=np.uint8).tobytes()
            _write_idx(folder / f"{prefix}-images-idx3-ubyte", 2051, [count, 6, 5], pixels, gz)
            _write_idx(folder / f"{prefix}-labels-idx1-ubyte", 2049, [count], labels, gz)


def _fake_cifar(folder: Path, records: list[int], test: int) -> None:
    rng = np.random.default_rng(5)
    folder.mkdir(parents=True)
    names = [f"data_batch_{k}.bin" for k in range(1, 6)] + (["test_batch.bin"] if test else [])
    for name, count in zip(names, [*records, test]):
        rows = rng.integers(0, 256, (count, 3073), dtype=np.uint8)
        rows[:, 0] = rng.integers(0, 10, count)
        (folder / name).write_bytes(rows.tobytes())


def _reference_batches(flag: str, x_shape, classes, seed, n, shuffle, iters, tests) -> tuple[bytes, str]:  # noqa: ANN001
    kind, args = parse_data_flag(flag)
    ds = load_data(kind, args, x_shape, classes, seed)
    parts = []
    for i in iters:
        x, y = ds.batch(i, n, shuffle)
        parts += [x.tobytes(), y.astype(np.float32).tobytes()]
    for t in range(tests):
        x = np.take(ds.x_test, range(t * n, t * n + n), axis=0, mode="wrap")
        y = np.take(ds.y_test, range(t * n, t * n + n), mode="wrap")
        parts += [x.tobytes(), y.astype(np.float32).tobytes()]
    test_size = 0 if ds.x_test is None else len(ds.x_test)
    return b"".join(parts), f"{ds.size} {test_size}"


@case
def data_batches(b: Batch) -> Callable[[], None]:
    _fake_mnist(b.path("mnist"), 23, 9, seed=1)
    _fake_mnist(b.path("mnist_gz"), 17, 0, seed=2, gz_train=True)
    _fake_cifar(b.path("cifar") / "cifar-10-batches-bin", [3, 2, 1, 4, 2], 3)
    rng = np.random.default_rng(3)
    np.savez(
        b.path("data.npz"),
        x=rng.standard_normal((7, 2, 3)),
        y=rng.integers(0, 5, 7).astype(np.int32),
        x_test=rng.standard_normal((4, 2, 3)).astype(np.float32),
        y_test=rng.integers(0, 5, 4),
    )
    # flag, x_shape, classes, seed, n, shuffle seed, iterations, test batches
    cases = [
        ("synthetic", (1, 8, 8), 10, 3, 32, None, [0, 1, 31, 32, 50], 2),
        ("synthetic:0x2A", (20,), 3, 5, 300, 5, [0, 3, 4, 7], 1),
        ("synthetic", (3, 4, 4), 7, 2**63 + 1, 100, 2**63 + 1, [0, 10, 11], 3),
        (f"mnist:{b.path('mnist')}", (1, 6, 5), 10, 1, 8, None, [0, 1, 2, 3, 5], 2),
        (f"mnist:{b.path('mnist')}", (30,), 10, 1, 8, 11, [0, 1, 2, 3, 5], 1),
        (f"mnist:{b.path('mnist_gz')}", (1, 6, 5), 10, 1, 4, 2, [0, 4, 9], 0),
        (f"cifar10:{b.path('cifar')}", (3, 32, 32), 10, 1, 5, 9, [0, 1, 2, 3], 2),
        (f"npz:{b.path('data.npz')}", (2, 3), 5, 1, 16, None, [0, 1, 2], 2),
        (f"npz:{b.path('data.npz')}", (6,), 5, 1, 16, 1, [0, 1, 2], 1),
    ]
    outs = [b.add("data", *(s & MASK64 if isinstance(s, int) and k in (3, 5) else s for k, s in enumerate(c)))
            for c in cases]  # fmt: skip

    def check() -> None:
        for spec, out in zip(cases, outs):
            want, meta = _reference_batches(*spec)
            assert result(out).read_bytes() == want, spec[:2]
            assert Path(f"{out}.meta").read_text() == meta, spec[:2]

    return check


@case
def data_errors(b: Batch) -> Callable[[], None]:
    def mnist(name: str, images: tuple[int, list[int], int] = (2051, [4, 6, 5], 120),
              labels: tuple[int, list[int], int] = (2049, [4], 4), label_value: int = 9) -> str:  # fmt: skip
        folder = b.path(name)
        folder.mkdir()
        _write_idx(folder / "train-images-idx3-ubyte", images[0], images[1], bytes(images[2]))
        _write_idx(folder / "train-labels-idx1-ubyte", labels[0], labels[1], bytes([label_value] * labels[2]))
        return f"mnist:{folder}"

    truncated_gz = b.path("bad_gz")
    _fake_mnist(truncated_gz, 3, 0, seed=4, gz_train=True)
    images_gz = truncated_gz / "train-images-idx3-ubyte.gz"
    images_gz.write_bytes(images_gz.read_bytes()[:-6])
    _fake_cifar(b.path("cifar_missing"), [1, 1], 0)
    _fake_cifar(b.path("cifar_short"), [1, 1, 1, 1, 1], 0)
    with open(b.path("cifar_short") / "data_batch_3.bin", "ab") as f:
        f.write(b"\0" * 10)
    np.savez(b.path("extra.npz"), x=np.zeros((2, 3), np.float32), y=np.zeros(2, np.int64), z=np.zeros(1))
    np.savez(b.path("intx.npz"), x=np.zeros((2, 3), np.int64), y=np.zeros(2, np.int64))
    np.savez(b.path("noy.npz"), x=np.zeros((2, 3), np.float32))
    np.savez(b.path("half.npz"), x=np.zeros((2, 3)), y=np.zeros(2, np.int8), x_test=np.zeros((1, 3)))
    np.savez(b.path("testshape.npz"), x=np.zeros((2, 3)), y=np.zeros(2, np.int8), x_test=np.zeros((1, 4)),
             y_test=np.zeros(1, np.int8))  # fmt: skip
    np.savez(b.path("emptyx.npz"), x=np.zeros((0, 3), np.float32), y=np.zeros(0, np.int64))
    # flag, x_shape, classes[, a phrase of the Java message where it words the cause differently]
    cases: list[tuple] = [
        ("mnist:" + str(b.path("no_such_dir")), (1, 6, 5), 10),
        (mnist("ok"), (1, 5, 6), 10),  # wrong per-sample shape
        (mnist("ok2"), (1, 6, 5), 3),  # label 9 outside [0, 3)
        (mnist("short", images=(2051, [4, 6, 5], 100)), (1, 6, 5), 10),
        (mnist("long", labels=(2049, [4], 6)), (1, 6, 5), 10),
        (mnist("magic", images=(2049, [4, 6, 5], 120)), (1, 6, 5), 10),
        (mnist("disagree", labels=(2049, [3], 3)), (1, 6, 5), 10),
        ("mnist:" + str(b.path("cifar_short")), (1, 6, 5), 10),  # no MNIST files there
        ("mnist:" + str(truncated_gz), (1, 6, 5), 10, "cannot decompress MNIST file"),
        ("cifar10:" + str(b.path("cifar_missing")), (3, 32, 32), 10),
        ("cifar10:" + str(b.path("cifar_short")), (3, 32, 32), 10),
        ("npz:" + str(b.path("missing.npz")), (3,), 2),
        ("npz:" + str(b.path("extra.npz")), (3,), 2),
        ("npz:" + str(b.path("intx.npz")), (3,), 2),  # worded alike now
        ("npz:" + str(b.path("noy.npz")), (3,), 2),
        ("npz:" + str(b.path("half.npz")), (3,), 2),
        ("npz:" + str(b.path("testshape.npz")), (3,), 2),
        ("npz:" + str(b.path("emptyx.npz")), (3,), 2),
    ]
    outs = [b.add("data", flag, shape, classes, 1, 2, None, [0], 0) for flag, shape, classes, *_ in cases]

    def check() -> None:
        for (flag, shape, classes, *phrase), out in zip(cases, outs):
            kind, args = parse_data_flag(flag)
            with pytest.raises(DslProgramError) as python:
                load_data(kind, args, shape, classes, 1)
            message = error(out)
            if phrase:
                assert message.startswith("IOException: ") and phrase[0] in message and flag[6:] in message
            else:
                assert message == f"IOException: {python.value.message}", flag

    return check


@pytest.mark.parametrize("name", CASES)
def test_java_runtime_io(checks: dict[str, Callable[[], None]], name: str) -> None:
    checks[name]()
