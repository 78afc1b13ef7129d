"""The Java runtime's image folders, CSV files and augmentation against the Python side: the same arrays bit for bit
(PNG images, CSV text), the same augmented batches, the same error messages (driver: java/DataCheck.java)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
from helpers import JAVAC
from java_env import JAVA_MARKS

from deepdsl.data.augment import augment
from deepdsl.data.named import Field, load_samples
from deepdsl.errors import DslProgramError

pytestmark = JAVA_MARKS

ROOT = Path(__file__).resolve().parents[2]
SOURCES = (
    "Buf",
    "Rng",
    "Npz",
    "Npy",
    "ZipReader",
    "Data",
    "DataFiles",
    "TextData",
    "CsvData",
    "ImageFolder",
    "Augment",
)


@pytest.fixture(scope="module")
def classes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("java_data")
    sources = [str(ROOT / "deepdsl" / "runtime" / f"{s}.java") for s in SOURCES]
    sources.append(str(Path(__file__).parent / "java" / "DataCheck.java"))
    subprocess.run([*JAVAC, "-Xlint:all", "-Werror", "-d", str(work / "classes"), *sources], cwd=work, check=True)
    return work / "classes"


def spec(fields: tuple[Field, ...]) -> str:
    return ";".join(
        f"{f.name}:{'l' if f.kind == 'label' else 'i'}:{f.classes or 0}:{','.join(map(str, f.shape))}" for f in fields
    )


def java_data(classes: Path, out: Path, flag: str, fields: tuple[Field, ...], seed: int = 1, steps: tuple = (),
              iters: int = 0, n: int = 1) -> subprocess.CompletedProcess:  # fmt: skip
    out.mkdir(exist_ok=True)
    text = "-"
    if steps:
        parts = [next(f.name for f in fields if len(f.shape) == 3)]
        for kind, args in steps:
            a = dict(args)
            if kind == "crop":
                parts.append(f"crop:{a['pad'][0]}:{a['pad'][1]}")
            elif kind == "flip":
                parts.append(f"flip:{a['p']!r}")
            else:
                m, s = (",".join(repr(float(np.float32(v))) for v in a[k]) for k in ("mean", "std"))
                parts.append(f"normalize:{m}:{s}")
        text = ";".join(parts)
    return subprocess.run(
        ["java", "-cp", str(classes), "DataCheck", flag, spec(fields), str(seed), text, str(iters), str(n), str(out)],
        cwd=out, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def arrays(path: Path, fields: tuple[Field, ...], m: int) -> dict[str, np.ndarray]:
    flat = np.fromfile(path, dtype="<f4")
    out, at = {}, 0
    for f in fields:
        size = m * int(np.prod(f.shape))
        out[f.name] = flat[at : at + size].reshape((m, *f.shape))
        at += size
    assert at == len(flat)
    return out


def same(java: dict[str, np.ndarray], python: dict[str, np.ndarray]) -> None:
    for name, a in python.items():
        want = a.astype(np.float32)
        assert java[name].tobytes() == want.tobytes(), name  # bit for bit


def pngs(root: Path, gray: bool = False, seed: int = 0) -> None:
    image = pytest.importorskip("PIL.Image", reason="the images extra (Pillow) is not installed")
    rng = np.random.default_rng(seed)
    for split, classes in (("train", {"cat": 3, "dog": 2, "emu": 3}), ("test", {"dog": 2, "cat": 1})):
        for name, count in classes.items():
            (root / split / name).mkdir(parents=True, exist_ok=True)
            for k in range(count):
                px = rng.integers(0, 256, size=(6, 7) if gray else (6, 7, 3), dtype=np.uint8)
                im = image.fromarray(px)
                if k == 1 and not gray:
                    im = im.convert("RGBA")  # an alpha channel, dropped by both
                if k == 2 and not gray:
                    im = im.convert("P")  # a palette
                im.save(root / split / name / f"{k}.png")


X = Field("x", "input", (3, 6, 7))
Y = Field("y", "label", (), 5)
STEPS = (
    ("crop", (("size", (6, 7)), ("pad", (2, 3)))),
    ("flip", (("p", 0.5),)),
    ("normalize", (("mean", (0.49, 0.48, 0.45)), ("std", (0.25, 0.24, 0.26)))),
)


@pytest.mark.parametrize("gray", [False, True])
def test_png_folders_read_the_same(classes: Path, tmp_path: Path, gray: bool) -> None:
    pngs(tmp_path / "pics", gray)
    fields = (Field("x", "input", (1 if gray else 3, 6, 7)), Y)
    py = load_samples("images", {"dir": str(tmp_path / "pics")}, fields, seed=1)
    r = java_data(classes, tmp_path / "out", f"images:{tmp_path / 'pics'}", fields)
    assert r.returncode == 0, r.stderr
    assert py.test is not None and py.size == 8 and py.test_size == 3
    same(arrays(tmp_path / "out" / "train.f32", fields, py.size), py.train)
    same(arrays(tmp_path / "out" / "test.f32", fields, py.test_size), py.test)


def test_augmented_batches_are_the_same(classes: Path, tmp_path: Path) -> None:
    pngs(tmp_path / "pics")
    fields = (X, Y)
    py = load_samples("images", {"dir": str(tmp_path / "pics")}, fields, seed=1)
    n, iters, seed = 3, 5, 7
    r = java_data(classes, tmp_path / "out", f"images:{tmp_path / 'pics'}", fields, seed, STEPS, iters, n)
    assert r.returncode == 0, r.stderr
    flipped = cropped = 0
    for i in range(iters):
        batch = py.batch(i, n)
        plain = batch["x"]
        batch["x"] = augment(plain, STEPS, i * n, seed, train=True)
        same(arrays(tmp_path / "out" / f"batch{i}.f32", fields, n), batch)
        unnormalised = augment(plain, STEPS[:2], i * n, seed, train=True)
        cropped += int(not np.array_equal(unnormalised, plain))
        flipped += int(np.array_equal(unnormalised, plain[..., ::-1]))
    assert cropped == iters  # the draws do something (pads of 2 and 3: a shift in almost every sample)
    test = py.test_batch(0, n)
    test["x"] = augment(test["x"], STEPS, 0, seed, train=False)
    same(arrays(tmp_path / "out" / "testbatch.f32", fields, n), test)
    mean = np.float32([0.49, 0.48, 0.45]).reshape(3, 1, 1)
    std = np.float32([0.25, 0.24, 0.26]).reshape(3, 1, 1)
    np.testing.assert_array_equal(test["x"], (py.test_batch(0, n)["x"] - mean) / std)  # no crop, no flip


def test_csv_reads_the_same(classes: Path, tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    fields = (Field("x", "input", (2, 2)), Field("t", "input", ()), Field("y", "label", (), 4))
    rows = ["y,x3,t,x0,x1,x2"]
    texts = ["0.1", "1e-7", "-3.4028234e38", "123456789.123456789", ".5", "7.", "+2E3", "0.30000000000000004", "1"]
    for k in range(12):
        cells = [str(k % 4), *(texts[int(j)] for j in rng.integers(0, len(texts), 5))]
        rows.append(" , ".join(cells) if k % 3 == 0 else ",".join(cells))
    (tmp_path / "d.csv").write_text("\n".join(rows) + "\n\n")
    (tmp_path / "d_test.csv").write_text("\ufeffx0,x1,x2,x3,t,y\r\n1,2,3,4,5,3\r\n")
    py = load_samples("csv", {"file": str(tmp_path / "d.csv")}, fields, seed=1)
    r = java_data(classes, tmp_path / "out", f"csv:{tmp_path / 'd.csv'}", fields)
    assert r.returncode == 0, r.stderr
    assert py.test is not None
    same(arrays(tmp_path / "out" / "train.f32", fields, 12), py.train)
    same(arrays(tmp_path / "out" / "test.f32", fields, 1), py.test)


@pytest.mark.parametrize(
    "content",
    [
        "x0,x1,x2,x3,t,y\n1,2,3\n",
        "x0,x1,x2,x3,t,y\n1,2,3,4,abc,0\n",
        "x0,x1,x2,x3,t,y\n1,2,3,4,1e39,0\n",
        "x0,x1,x2,x3,t,y\n1,2,3,4,5,9\n",
        "x0,x1,x2,x3,t,y\n1,2,3,4,5,1.0\n",
        "x0,x1,x2,t,y\n1,2,3,5,1\n",
        "x0,x1,x2,x3,t,y,zz\n1,2,3,4,5,1,1\n",
        "x0,x1,x2,x3,t,y\n",
        "  \n\n",
        "x0,x1,x2,x3,t,y\n1,2,3,4,5,0000000000000000000001\n",
        "x0,x1,x2,x3,t,y\n1,2,3,4,5," + "9" * 40 + "\n",
    ],
)
def test_csv_errors_are_worded_the_same(classes: Path, tmp_path: Path, content: str) -> None:
    fields = (Field("x", "input", (2, 2)), Field("t", "input", ()), Field("y", "label", (), 4))
    (tmp_path / "d.csv").write_text(content)
    with pytest.raises(DslProgramError) as e:
        load_samples("csv", {"file": str(tmp_path / "d.csv")}, fields, seed=1)
    r = java_data(classes, tmp_path / "out", f"csv:{tmp_path / 'd.csv'}", fields)
    assert r.returncode == 1 and r.stderr.strip() == f"error: {e.value.message}"


def test_image_errors_are_worded_the_same(classes: Path, tmp_path: Path) -> None:
    image = pytest.importorskip("PIL.Image", reason="the images extra (Pillow) is not installed")
    fields = (Field("x", "input", (1, 6, 7)), Y)
    cases = {
        "big": lambda p: image.fromarray(np.zeros((7, 7), np.uint8)).save(p / "a" / "0.png"),
        "colour": lambda p: image.fromarray(np.zeros((6, 7, 3), np.uint8)).save(p / "a" / "0.png"),
        "text": lambda p: (p / "a" / "n.txt").write_text("hi"),
        "empty": lambda p: None,
    }
    for name, make in cases.items():
        root = tmp_path / name
        (root / "a").mkdir(parents=True)
        make(root)
        with pytest.raises(DslProgramError) as e:
            load_samples("images", {"dir": str(root)}, fields, seed=1)
        r = java_data(classes, tmp_path / f"out_{name}", f"images:{root}", fields)
        assert r.returncode == 1 and r.stderr.strip() == f"error: {e.value.message}", name


def test_damaged_images_are_errors_in_java(classes: Path, tmp_path: Path) -> None:
    """A truncated PNG, a file that is no image and a header promising a huge image: exit 1, the file named."""
    image = pytest.importorskip("PIL.Image", reason="the images extra (Pillow) is not installed")
    fields = (X, Y)
    png = tmp_path / "ok.png"
    image.fromarray(np.random.default_rng(0).integers(0, 256, (6, 7, 3), dtype=np.uint8)).save(png)
    huge = bytearray(png.read_bytes())
    huge[16:24] = (100000).to_bytes(4, "big") + (100000).to_bytes(4, "big")  # IHDR width and height (CRC now wrong)
    for name, content in (("cut", png.read_bytes()[:100]), ("noise", b"\x89PNG garbage"), ("huge", bytes(huge))):
        (tmp_path / name / "a").mkdir(parents=True)
        (tmp_path / name / "a" / "0.png").write_bytes(content)
        with pytest.raises(DslProgramError) as e:
            load_samples("images", {"dir": str(tmp_path / name)}, fields, seed=1)
        r = java_data(classes, tmp_path / f"out_{name}", f"images:{tmp_path / name}", fields)
        assert r.returncode == 1 and "0.png'" in r.stderr and r.stderr.startswith("error: image '"), r.stderr
        assert "0.png'" in e.value.message


def test_jpeg_folders_read_alike(classes: Path, tmp_path: Path) -> None:
    """JPEG files (colour and grayscale) read in both runtimes: two decoders, so within a few levels, not exact."""
    image = pytest.importorskip("PIL.Image", reason="the images extra (Pillow) is not installed")
    rng = np.random.default_rng(5)
    for k, cls in enumerate(("a", "b", "c")):
        (tmp_path / "jpg" / cls).mkdir(parents=True)
        smooth = np.kron(rng.integers(0, 256, (3, 4, 3)), np.ones((2, 2, 1))).astype(np.uint8)[:6, :7]
        im = image.fromarray(smooth) if k != 1 else image.fromarray(smooth[:, :, 0]).convert("L")
        im.save(tmp_path / "jpg" / cls / f"{k}.JPG", quality=95)
    fields = (X, Y)
    py = load_samples("images", {"dir": str(tmp_path / "jpg")}, fields, seed=1)
    r = java_data(classes, tmp_path / "out", f"images:{tmp_path / 'jpg'}", fields)
    assert r.returncode == 0, r.stderr
    got = arrays(tmp_path / "out" / "train.f32", fields, 3)
    np.testing.assert_array_equal(got["y"], py.train["y"])
    assert np.max(np.abs(got["x"] - py.train["x"])) <= 4 / 255
    np.testing.assert_array_equal(py.train["x"][1, 0], py.train["x"][1, 2])  # a grayscale JPEG in all 3 channels
