"""The image-folder and CSV sources (`data/images.py`, `data/table.py`): what they read, how columns and folders
bind to a network's inputs and labels, and their errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from deepdsl.data import load_data, parse_data_flag
from deepdsl.data.named import Field, load_samples
from deepdsl.errors import DslProgramError

X3 = Field("x", "input", (3, 4, 5))
X1 = Field("x", "input", (1, 4, 5))
Y = Field("y", "label", (), 4)


def pil():  # noqa: ANN201
    return pytest.importorskip("PIL.Image", reason="the images extra (Pillow) is not installed")


def write_png(path: Path, pixels: np.ndarray) -> None:
    """pixels [H, W, 3] (RGB) or [H, W] (grayscale), uint8."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pil().fromarray(pixels.astype(np.uint8)).save(path)


def image_folder(root: Path, classes: dict[str, int], gray: bool = False, seed: int = 0) -> dict[str, list]:
    rng = np.random.default_rng(seed)
    made: dict[str, list] = {}
    for name, count in classes.items():
        for k in range(count):
            shape = (4, 5) if gray else (4, 5, 3)
            px = rng.integers(0, 256, size=shape, dtype=np.uint8)
            write_png(root / name / f"img{k}.png", px)
            made.setdefault(name, []).append(px)
    return made


def test_parse_flags() -> None:
    assert parse_data_flag("images:pics") == ("images", {"dir": "pics"})
    assert parse_data_flag("csv:t.csv") == ("csv", {"file": "t.csv"})
    with pytest.raises(DslProgramError, match="--data csv needs a file"):
        parse_data_flag("csv")


def test_class_folders_sorted_become_ids(tmp_path: Path) -> None:
    made = image_folder(tmp_path, {"zebra": 2, "cat": 1, "dog": 2})
    s = load_samples("images", {"dir": str(tmp_path)}, (X3, Y), seed=1)
    assert s.size == 5 and s.test is None
    np.testing.assert_array_equal(s.train["y"], [0, 1, 1, 2, 2])  # cat, dog, dog, zebra, zebra
    want = np.stack([made["cat"][0], *made["dog"], *made["zebra"]]).transpose(0, 3, 1, 2).astype(np.float32) / 255
    np.testing.assert_array_equal(s.train["x"], want)
    assert s.train["x"].dtype == np.float32


def test_train_and_test_subfolders(tmp_path: Path) -> None:
    image_folder(tmp_path / "train", {"a": 2, "b": 2})
    image_folder(tmp_path / "test", {"b": 1}, seed=3)
    s = load_samples("images", {"dir": str(tmp_path)}, (X3, Y), seed=1)
    assert s.size == 4 and s.test_size == 1
    assert s.test is not None
    np.testing.assert_array_equal(s.test["y"], [1])  # b's id in the training folders


def test_grayscale_for_one_channel_and_replicated_for_three(tmp_path: Path) -> None:
    made = image_folder(tmp_path, {"a": 1}, gray=True)
    one = load_samples("images", {"dir": str(tmp_path)}, (X1, Y), seed=1)
    np.testing.assert_array_equal(one.train["x"][0, 0], made["a"][0].astype(np.float32) / 255)
    three = load_samples("images", {"dir": str(tmp_path)}, (X3, Y), seed=1)
    np.testing.assert_array_equal(three.train["x"][0], np.repeat(one.train["x"][0], 3, axis=0))


def test_load_data_reads_images_too(tmp_path: Path) -> None:
    image_folder(tmp_path, {"a": 1, "b": 1})
    ds = load_data("images", {"dir": str(tmp_path)}, (3, 4, 5), 4, seed=1)
    assert ds.x_train.shape == (2, 3, 4, 5) and list(ds.y_train) == [0, 1]


@pytest.mark.parametrize(
    "setup, fields, message",
    [
        (
            lambda p: write_png(p / "a" / "big.png", np.zeros((6, 5, 3))),
            (X3, Y),
            "is 5x6 (width x height), but the network's input takes 5x4",
        ),
        (
            lambda p: write_png(p / "a" / "rgb.png", np.zeros((4, 5, 3))),
            (X1, Y),
            "is a colour image (RGB), but the network's input x : [N, 1, 4, 5] takes grayscale",
        ),
        (
            lambda p: (p / "a").mkdir() or (p / "a" / "notes.txt").write_text("hi"),
            (X3, Y),
            "'notes.txt' is not a .png, .jpg or .jpeg file",
        ),
        (
            lambda p: (p / "a").mkdir() or (p / "a" / "bad.png").write_bytes(b"not a png"),
            (X3, Y),
            "cannot be read as an image",
        ),
        (lambda p: (p / "a").mkdir(), (X3, Y), "class folder 'a' holds no images"),
        (lambda p: None, (X3, Y), "holds no class folders"),
        (
            lambda p: image_folder(p, {c: 1 for c in "abcde"}),
            (X3, Y),
            "5 class folders, more than the 4 classes of the network's label y",
        ),
        (lambda p: image_folder(p, {"a": 1}), (Field("x", "input", (20,)), Y), "takes images [N, C, H, W]"),
        (lambda p: write_png(p / "stray.png", np.zeros((4, 5, 3))), (X3, Y), "'stray.png' lies outside a class"),
        (
            lambda p: image_folder(p / "train", {"a": 1}) and image_folder(p / "test", {"q": 1}),
            (X3, Y),
            "test folder 'q' is not a class of the training folders",
        ),
    ],
)
def test_image_errors(tmp_path: Path, setup, fields: tuple, message: str) -> None:  # noqa: ANN001
    pil()
    setup(tmp_path)
    with pytest.raises(DslProgramError) as e:
        load_samples("images", {"dir": str(tmp_path)}, fields, seed=1)
    assert message in str(e.value)


def test_a_missing_image_folder_is_named(tmp_path: Path) -> None:
    with pytest.raises(DslProgramError, match="images data folder not found: '.*nope'"):
        load_samples("images", {"dir": str(tmp_path / "nope")}, (X3, Y), seed=1)


def test_missing_pillow_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    image_folder(tmp_path, {"a": 1}) if _has_pil() else (tmp_path / "a").mkdir()
    real = builtins.__import__

    def no_pil(name: str, *args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        if name == "PIL" or name.startswith("PIL."):
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pil)
    with pytest.raises(DslProgramError, match=r"pip install 'deepdsl\[images\]'"):
        load_samples("images", {"dir": str(tmp_path)}, (X3, Y), seed=1)


def _has_pil() -> bool:
    try:
        import PIL  # noqa: F401
    except ImportError:
        return False
    return True


# ---- CSV ----

FEATURES = Field("x", "input", (3,))
TARGET = Field("t", "input", ())
CLASS = Field("y", "label", (), 3)


def test_csv_columns_bind_by_name(tmp_path: Path) -> None:
    (tmp_path / "d.csv").write_text("y, x2 ,x0,x1,t\n2,0.5,1e-3,-4,7\n\n0, .25 , 3., +2, -0.1\n")
    s = load_samples("csv", {"file": str(tmp_path / "d.csv")}, (FEATURES, TARGET, CLASS), seed=1)
    assert s.size == 2 and s.test is None
    np.testing.assert_array_equal(s.train["x"], np.array([[1e-3, -4, 0.5], [3.0, 2, 0.25]], dtype=np.float32))
    np.testing.assert_array_equal(s.train["t"], np.array([7, -0.1], dtype=np.float32))
    np.testing.assert_array_equal(s.train["y"], [2, 0])
    assert s.train["x"].dtype == np.float32 and s.train["y"].dtype == np.int64


def test_csv_test_file_beside_it(tmp_path: Path) -> None:
    (tmp_path / "d.csv").write_text("x0,x1,x2,y\n1,2,3,0\n4,5,6,1\n")
    (tmp_path / "d_test.csv").write_text("\ufeffy,x0,x1,x2\r\n2,7,8,9\r\n")
    s = load_samples("csv", {"file": str(tmp_path / "d.csv")}, (FEATURES, CLASS), seed=1)
    assert s.test is not None
    np.testing.assert_array_equal(s.test["x"], [[7, 8, 9]])
    np.testing.assert_array_equal(s.test["y"], [2])


@pytest.mark.parametrize(
    "content, message",
    [
        ("x0,x1,x2,y\n1,2,3\n", "line 2: 3 values, but the header names 4 columns"),
        ("x0,x1,x2,y\n1,2,3,0,5\n", "line 2: 5 values, but the header names 4 columns"),
        ("x0,x1,x2,y\n1,abc,3,0\n", "line 2, column 'x1': 'abc' is not a number"),
        ("x0,x1,x2,y\n1,nan,3,0\n", "line 2, column 'x1': 'nan' is not a number"),
        ("x0,x1,x2,y\n1,1e39,3,0\n", "line 2, column 'x1': '1e39' is too large for a float32"),
        ("x0,x1,x2,y\n1,2,3,1.5\n", "line 2, column 'y': '1.5' is not an integer"),
        ("x0,x1,x2,y\n1,2,3,3\n", "label 3 on line 2 is outside [0, 3) (the network's label y : [N] classes 3)"),
        ("x0,x1,y\n1,2,0\n", "has no column 'x2' for the network's input x : [N, 3]"),
        ("x0,x1,x2,y,z\n1,2,3,0,1\n", "has a column 'z' that names no input or label of the network"),
        ("x0,x1,x2,y,x0\n1,2,3,0,1\n", "names the column 'x0' twice"),
        ("x0,x1,x2,y\n", "holds no rows"),
        ("", "holds no header"),
        (b"x0,x1,x2,y\n1,2,3,\xff\n", "is not UTF-8 text"),
        ('x0,x1,x2,y\n"1",2,3,0\n', "line 2, column 'x0': '\"1\"' is not a number"),
        ("x0,x1,x2,y\n1,2,3," + "1" * 5000 + "\n", "label " + "1" * 5000 + " on line 2 is outside [0, 3)"),
        ("x0,x1,x2,y\n1,2,3,0000000000000000000001\n", "label 0000000000000000000001 on line 2 is outside"),
        ("x0,x1,x2,y\n1,1e99999999999,3,0\n", "'1e99999999999' is too large for a float32"),
    ],
)
def test_csv_errors(tmp_path: Path, content: str | bytes, message: str) -> None:
    path = tmp_path / "d.csv"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(DslProgramError) as e:
        load_samples("csv", {"file": str(path)}, (FEATURES, CLASS), seed=1)
    assert message in str(e.value) and "d.csv" in str(e.value)


def test_predict_reads_only_the_columns_it_needs(tmp_path: Path) -> None:
    (tmp_path / "d.csv").write_text("x0,x1,x2,y\n1,2,3,0\n")
    s = load_samples("csv", {"file": str(tmp_path / "d.csv")}, (FEATURES,), seed=1, other_arrays=True)
    assert list(s.train) == ["x"]


def test_a_truncated_png_is_an_error(tmp_path: Path) -> None:
    write_png(tmp_path / "a" / "0.png", np.arange(60, dtype=np.uint8).reshape(4, 5, 3))
    data = (tmp_path / "a" / "0.png").read_bytes()
    (tmp_path / "a" / "0.png").write_bytes(data[: len(data) // 2])
    with pytest.raises(DslProgramError, match="0.png' cannot be read as an image"):
        load_samples("images", {"dir": str(tmp_path)}, (X3, Y), seed=1)


def test_csv_size_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from deepdsl.data import table

    monkeypatch.setattr(table, "MAX_BYTES", 64)
    (tmp_path / "d.csv").write_text("x0,x1,x2,y\n" + "1,2,3,0\n" * 20)
    with pytest.raises(DslProgramError, match="is larger than 64 bytes"):
        load_samples("csv", {"file": str(tmp_path / "d.csv")}, (FEATURES, CLASS), seed=1)


def test_a_missing_csv_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(DslProgramError, match="csv data file not found: '.*nope.csv'"):
        load_samples("csv", {"file": str(tmp_path / "nope.csv")}, (FEATURES, CLASS), seed=1)
