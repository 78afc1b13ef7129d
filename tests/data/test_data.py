"""Data sources: the loaders on small files written here, their error messages, and batching."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest

from deepdsl.data import Dataset, load_data, parse_data_flag, shuffle_permutation
from deepdsl.data.named import Field, load_samples
from deepdsl.data.synthetic import make_synthetic
from deepdsl.errors import DslProgramError
from deepdsl.initializers import SplitMix64, stream_seed

# ---------------------------------------------------------------- helpers that write files


def idx_images(pixels: np.ndarray, magic: int = 2051) -> bytes:
    n, rows, cols = pixels.shape
    return struct.pack(">iiii", magic, n, rows, cols) + pixels.astype(np.uint8).tobytes()


def idx_labels(labels: np.ndarray, magic: int = 2049) -> bytes:
    return struct.pack(">ii", magic, len(labels)) + labels.astype(np.uint8).tobytes()


def write(path: Path, data: bytes, gz: bool = False) -> Path:
    if gz:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return path


def mnist_dir(tmp: Path, gz: bool, n: int = 6, test: bool = True, rows: int = 28) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    pix = rng.integers(0, 256, size=(n, rows, rows), dtype=np.uint8)
    lab = np.arange(n) % 10
    write(tmp / "train-images-idx3-ubyte", idx_images(pix), gz)
    write(tmp / "train-labels-idx1-ubyte", idx_labels(lab), gz)
    if test:
        write(tmp / "t10k-images-idx3-ubyte", idx_images(pix[:2]), gz)
        write(tmp / "t10k-labels-idx1-ubyte", idx_labels(lab[:2]), gz)
    return pix, lab


def cifar_records(n: int, first_label: int = 0) -> tuple[bytes, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(first_label)
    pix = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
    lab = (np.arange(n) + first_label) % 10
    rec = np.concatenate([lab[:, None].astype(np.uint8), pix], axis=1)
    return rec.tobytes(), pix, lab


def cifar_dir(tmp: Path, test: bool = True) -> tuple[np.ndarray, np.ndarray]:
    pixs, labs = [], []
    for k in range(1, 6):
        data, pix, lab = cifar_records(2, k)
        (tmp / f"data_batch_{k}.bin").write_bytes(data)
        pixs.append(pix)
        labs.append(lab)
    if test:
        (tmp / "test_batch.bin").write_bytes(cifar_records(3, 7)[0])
    return np.concatenate(pixs), np.concatenate(labs)


# ---------------------------------------------------------------- the --data flag


def test_parse_data_flag():
    assert parse_data_flag("synthetic") == ("synthetic", {})
    assert parse_data_flag("synthetic:7") == ("synthetic", {"seed": 7})
    assert parse_data_flag("mnist:/data/mnist") == ("mnist", {"dir": "/data/mnist"})
    assert parse_data_flag("cifar10:c:/x") == ("cifar10", {"dir": "c:/x"})
    assert parse_data_flag("npz:a.npz") == ("npz", {"file": "a.npz"})
    with pytest.raises(DslProgramError, match="needs a dir: write --data mnist:DIR"):
        parse_data_flag("mnist")
    with pytest.raises(DslProgramError, match="unknown data source 'minst'.*did you mean 'mnist'"):
        parse_data_flag("minst:x")
    with pytest.raises(DslProgramError, match="integer seed"):
        parse_data_flag("synthetic:abc")


def test_load_data_arguments():
    with pytest.raises(DslProgramError, match="unknown data source 'imagenet'"):
        load_data("imagenet", {}, (1, 2), 2, 1)
    with pytest.raises(DslProgramError, match="takes only the argument 'dir'"):
        load_data("mnist", {"file": "x"}, (1, 28, 28), 10, 1)
    with pytest.raises(DslProgramError, match="needs a dir name"):
        load_data("mnist", {}, (1, 28, 28), 10, 1)


# ---------------------------------------------------------------- MNIST


@pytest.mark.parametrize("gz", [False, True])
def test_mnist(tmp_path, gz):
    pix, lab = mnist_dir(tmp_path, gz)
    ds = load_data("mnist", {"dir": str(tmp_path)}, (1, 28, 28), 10, 1)
    assert ds.x_train.shape == (6, 1, 28, 28) and ds.x_train.dtype == np.float32
    assert ds.y_train.dtype == np.int64 and ds.y_train.tolist() == lab.tolist()
    assert np.array_equal(ds.x_train[:, 0], pix.astype(np.float32) / np.float32(255))
    assert float(ds.x_train.max()) <= 1.0
    assert ds.x_test.shape == (2, 1, 28, 28) and ds.y_test.tolist() == lab[:2].tolist()
    # positional argument, and a flat network input (an MLP) takes the samples flattened
    flat = load_data("mnist", {0: str(tmp_path)}, (784,), 10, 1)
    assert flat.x_train.shape == (6, 784)
    assert np.array_equal(flat.x_train, ds.x_train.reshape(6, 784))


def test_mnist_without_test_files(tmp_path):
    mnist_dir(tmp_path, gz=False, test=False)
    ds = load_data("mnist", {"dir": str(tmp_path)}, (1, 28, 28), 10, 1)
    assert ds.x_test is None and ds.y_test is None


def test_mnist_errors(tmp_path):
    d = str(tmp_path)
    with pytest.raises(DslProgramError, match="MNIST directory not found: '.*nowhere'"):
        load_data("mnist", {"dir": str(tmp_path / "nowhere")}, (1, 28, 28), 10, 1)
    with pytest.raises(DslProgramError, match=r"MNIST file not found: looked for '.*train-images-idx3-ubyte' and"):
        load_data("mnist", {"dir": d}, (1, 28, 28), 10, 1)
    pix, lab = mnist_dir(tmp_path, gz=False, test=False)
    # one test file without the other
    write(tmp_path / "t10k-images-idx3-ubyte", idx_images(pix[:2]))
    with pytest.raises(DslProgramError, match="t10k-labels-idx1-ubyte"):
        load_data("mnist", {"dir": d}, (1, 28, 28), 10, 1)
    (tmp_path / "t10k-images-idx3-ubyte").unlink()
    # wrong magic number
    write(tmp_path / "train-labels-idx1-ubyte", idx_labels(lab, magic=2051))
    with pytest.raises(DslProgramError, match=r"train-labels-idx1-ubyte' has magic number 2051.*starts with 2049"):
        load_data("mnist", {"dir": d}, (1, 28, 28), 10, 1)
    write(tmp_path / "train-labels-idx1-ubyte", idx_labels(lab))
    # truncated, plain and gzip
    data = idx_images(pix)
    write(tmp_path / "train-images-idx3-ubyte", data[:-10])
    with pytest.raises(DslProgramError, match=r"train-images-idx3-ubyte' is truncated.*6 images of 28x28"):
        load_data("mnist", {"dir": d}, (1, 28, 28), 10, 1)
    write(tmp_path / "train-images-idx3-ubyte", data[:10])
    with pytest.raises(DslProgramError, match="is truncated: 10 bytes, shorter than its header"):
        load_data("mnist", {"dir": d}, (1, 28, 28), 10, 1)
    (tmp_path / "train-images-idx3-ubyte").unlink()
    (tmp_path / "train-images-idx3-ubyte.gz").write_bytes(gzip.compress(data)[:-20])
    with pytest.raises(DslProgramError, match="cannot decompress MNIST file '.*train-images-idx3-ubyte.gz'"):
        load_data("mnist", {"dir": d}, (1, 28, 28), 10, 1)
    write(tmp_path / "train-images-idx3-ubyte", data)
    # the plain file wins over the damaged .gz; now shapes and labels
    with pytest.raises(
        DslProgramError, match=r"per-sample shape \[1, 28, 28\], but the network's input takes \[3, 28, 28\]"
    ):
        load_data("mnist", {"dir": d}, (3, 28, 28), 10, 1)
    with pytest.raises(DslProgramError, match=r"training label 5 of sample 5 is outside \[0, 5\)"):
        load_data("mnist", {"dir": d}, (1, 28, 28), 5, 1)
    write(tmp_path / "train-labels-idx1-ubyte", idx_labels(lab[:4]))
    with pytest.raises(DslProgramError, match="holds 6 images but .* holds 4 labels"):
        load_data("mnist", {"dir": d}, (1, 28, 28), 10, 1)


# ---------------------------------------------------------------- CIFAR-10


def test_cifar10(tmp_path):
    pix, lab = cifar_dir(tmp_path)
    ds = load_data("cifar10", {"dir": str(tmp_path)}, (3, 32, 32), 10, 1)
    assert ds.x_train.shape == (10, 3, 32, 32) and ds.x_train.dtype == np.float32
    assert ds.y_train.tolist() == lab.tolist()
    assert np.array_equal(ds.x_train.reshape(10, 3072), pix.astype(np.float32) / np.float32(255))
    # red plane first, row-major
    assert ds.x_train[0, 0, 0, 1] == np.float32(pix[0, 1]) / np.float32(255)
    assert ds.x_train[0, 1, 0, 0] == np.float32(pix[0, 1024]) / np.float32(255)
    assert ds.x_test.shape == (3, 3, 32, 32)
    (tmp_path / "test_batch.bin").unlink()
    assert load_data("cifar10", {"dir": str(tmp_path)}, (3, 32, 32), 10, 1).x_test is None


def test_cifar10_nested_folder(tmp_path):
    nested = tmp_path / "cifar-10-batches-bin"
    nested.mkdir()
    cifar_dir(nested)
    assert load_data("cifar10", {"dir": str(tmp_path)}, (3, 32, 32), 10, 1).x_train.shape[0] == 10


def test_cifar10_errors(tmp_path):
    d = str(tmp_path)
    with pytest.raises(DslProgramError, match="CIFAR-10 directory not found"):
        load_data("cifar10", {"dir": str(tmp_path / "nope")}, (3, 32, 32), 10, 1)
    cifar_dir(tmp_path)
    (tmp_path / "data_batch_3.bin").unlink()
    with pytest.raises(DslProgramError, match=r"CIFAR-10 file not found: '.*data_batch_3.bin'"):
        load_data("cifar10", {"dir": d}, (3, 32, 32), 10, 1)
    (tmp_path / "data_batch_3.bin").write_bytes(cifar_records(2)[0][:-100])
    with pytest.raises(DslProgramError, match=r"data_batch_3.bin' is truncated: 6046 bytes .* \(1 whole records"):
        load_data("cifar10", {"dir": d}, (3, 32, 32), 10, 1)
    (tmp_path / "data_batch_3.bin").write_bytes(cifar_records(2)[0])
    with pytest.raises(
        DslProgramError, match=r"per-sample shape \[3, 32, 32\], but the network's input takes \[1, 28, 28\]"
    ):
        load_data("cifar10", {"dir": d}, (1, 28, 28), 10, 1)
    with pytest.raises(DslProgramError, match=r"label \d of sample \d+ is outside \[0, 2\)"):
        load_data("cifar10", {"dir": d}, (3, 32, 32), 2, 1)


# ---------------------------------------------------------------- npz


def test_npz(tmp_path):
    f = tmp_path / "d.npz"
    x = np.random.default_rng(1).random((5, 2, 3))
    np.savez(f, x=x, y=np.array([0, 1, 2, 0, 1], dtype=np.int32), x_test=x[:2], y_test=np.array([1, 1]))
    ds = load_data("npz", {"file": str(f)}, (2, 3), 3, 1)
    assert ds.x_train.dtype == np.float32 and ds.y_train.dtype == np.int64
    assert np.array_equal(ds.x_train, x.astype(np.float32)) and ds.y_test.tolist() == [1, 1]
    np.savez(f, x=x.astype(np.float32), y=np.zeros(5, dtype=np.int64))
    ds = load_data("npz", {"file": str(f)}, (6,), 3, 1)
    assert ds.x_train.shape == (5, 6) and ds.x_test is None


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ({"x": np.zeros((2, 3), np.float32)}, r"has no array 'y' for the network's label y : \[N\] classes 3"),
        ({"x": np.zeros((2, 3), np.uint8), "y": np.zeros(2, int)}, "'x' must hold floats .* found integers"),
        (
            {"x": np.zeros((2, 3)), "y": np.zeros(2)},
            "'y' must hold integer labels for the network's label y .* found floats",
        ),
        ({"x": np.zeros((2, 3)), "y": np.zeros(3, int)}, r"different numbers of samples \('x' 2, 'y' 3\)"),
        (
            {"x": np.zeros((2, 3)), "y": np.zeros((2, 1), int)},
            r"'y' has per-sample shape \[1\], but the network's label y",
        ),
        ({"x": np.zeros((2, 3)), "y": np.zeros(2, int), "x_tst": np.zeros(1)}, "an array 'x_tst' that names no input"),
        ({"x": np.zeros((2, 3)), "y": np.zeros(2, int), "x_test": np.zeros((1, 3))}, "has 'x_test' but no 'y_test'"),
        (
            {"x": np.zeros((2, 4)), "y": np.zeros(2, int)},
            r"per-sample shape \[4\], but the network's input takes \[3\]",
        ),
        ({"x": np.zeros((2, 3)), "y": np.array([0, 3])}, r"'y': label 3 of sample 1 is outside \[0, 3\)"),
        ({"x": np.zeros((2, 3)), "y": np.array([0, -1])}, r"label -1 of sample 1 is outside"),
        (
            {"x": np.zeros((2, 3)), "y": np.zeros(2, int), "x_test": np.zeros((1, 3)), "y_test": np.array([7])},
            r"'y_test': label 7 of sample 0 is outside \[0, 3\)",
        ),
    ],
)
def test_npz_errors(tmp_path, arrays, message):
    f = tmp_path / "d.npz"
    np.savez(f, **arrays)
    with pytest.raises(DslProgramError, match=message):
        load_data("npz", {"file": str(f)}, (3,), 3, 1)


def test_npz_file_errors(tmp_path):
    with pytest.raises(DslProgramError, match="npz data file not found: '.*missing.npz'"):
        load_data("npz", {"file": str(tmp_path / "missing.npz")}, (3,), 3, 1)
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"this is not a zip file at all")
    with pytest.raises(DslProgramError, match="cannot read npz data file"):
        load_data("npz", {"file": str(bad)}, (3,), 3, 1)
    one = tmp_path / "one.npy"
    np.save(one, np.zeros(3))
    with pytest.raises(DslProgramError, match="not an .npz archive"):
        load_data("npz", {"file": str(one)}, (3,), 3, 1)


# ---------------------------------------------------------------- batches


def small_dataset(m: int = 5) -> Dataset:
    x = np.arange(m * 2, dtype=np.float32).reshape(m, 2)
    return Dataset(x, np.arange(m, dtype=np.int64))


def test_batch_order_and_wrap_around():
    ds = small_dataset()
    x, y = ds.batch(0, 2, None)
    assert y.tolist() == [0, 1] and x.tolist() == [[0, 1], [2, 3]]
    assert ds.batch(1, 2, None)[1].tolist() == [2, 3]
    assert ds.batch(2, 2, None)[1].tolist() == [4, 0]
    assert ds.batch(3, 2, None)[1].tolist() == [1, 2]
    assert ds.batch(1, 7, None)[1].tolist() == [2, 3, 4, 0, 1, 2, 3]
    x, _ = ds.batch(0, 1, None)
    x[0, 0] = 99  # a copy, not a view
    assert ds.x_train[0, 0] == 0
    with pytest.raises(DslProgramError, match="batch size must be positive"):
        ds.batch(0, 0, None)


def test_shuffled_batches():
    m = 7
    ds = small_dataset(m)
    epoch0 = np.concatenate([ds.batch(i, 1, 42)[1] for i in range(m)])
    epoch1 = np.concatenate([ds.batch(i, 1, 42)[1] for i in range(m, 2 * m)])
    assert sorted(epoch0.tolist()) == list(range(m)) and sorted(epoch1.tolist()) == list(range(m))
    assert epoch0.tolist() == shuffle_permutation(m, 0, 42).tolist()
    assert epoch1.tolist() == shuffle_permutation(m, 1, 42).tolist()
    # a batch that straddles epochs takes the end of one order and the start of the next
    assert ds.batch(1, 5, 42)[1].tolist() == epoch0[5:].tolist() + epoch1[:3].tolist()
    assert ds.batch(0, 3 * m, 42)[1].tolist()[:m] == epoch0.tolist()
    assert not np.array_equal(shuffle_permutation(50, 0, 42), shuffle_permutation(50, 0, 43))
    assert not np.array_equal(shuffle_permutation(50, 0, 42), np.arange(50))
    x, y = ds.batch(3, 4, 9)
    assert np.array_equal(x, ds.x_train[y])


def test_shuffle_permutation_is_the_documented_fisher_yates():
    m = 9
    g = SplitMix64(stream_seed("shuffle/3", 5))
    perm = list(range(m))
    for j in range(m - 1, 0, -1):
        r = g.next() % (j + 1)
        perm[j], perm[r] = perm[r], perm[j]
    assert shuffle_permutation(m, 3, 5).tolist() == perm
    assert shuffle_permutation(1, 0, 5).tolist() == [0]


def test_dataset_checks_its_arrays():
    with pytest.raises(DslProgramError, match="x float32"):
        Dataset(np.zeros((2, 3)), np.zeros(2, dtype=np.int64))
    with pytest.raises(DslProgramError, match="no samples"):
        Dataset(np.zeros((0, 3), np.float32), np.zeros(0, dtype=np.int64))


# ---------------------------------------------------------------- synthetic


def test_synthetic_is_deterministic_and_in_range(monkeypatch):
    a = load_data("synthetic", {"seed": 1}, (1, 4, 4), 3, 99)
    b = load_data("synthetic", {}, (1, 4, 4), 3, 1)  # the program seed when synthetic() has none
    assert a.x_train.shape == (1024, 1, 4, 4) and a.x_test.shape == (256, 1, 4, 4)
    assert a.x_train.dtype == np.float32 and a.y_train.dtype == np.int64
    assert np.array_equal(a.x_train, b.x_train) and np.array_equal(a.y_test, b.y_test)
    assert -0.5 <= float(a.x_train.min()) and float(a.x_train.max()) < 0.5
    assert set(a.y_train.tolist()) == {0, 1, 2}
    assert np.bincount(a.y_train).min() > 1024 / 3 * 0.7  # close to balanced
    c = load_data("synthetic", {"seed": 2}, (1, 4, 4), 3, 1)
    assert not np.array_equal(a.x_train, c.x_train)
    # the documented recipe, for sample 0, element 0
    y0 = SplitMix64(stream_seed("synthetic/y", 1)).next() % 3
    noise = SplitMix64(stream_seed("synthetic/x", 1)).next() >> 40
    proto = SplitMix64(stream_seed("synthetic/prototype", 1))
    for _ in range(y0 * 16):
        proto.next()
    assert a.y_train[0] == y0
    assert a.x_train[0, 0, 0, 0] == np.float32(((noise >> 1) + (proto.next() >> 41) - 2**23) * 2.0**-24)
    import deepdsl.data.synthetic as synthetic

    assert synthetic.synthetic_sizes(70000) == (256, 64)
    monkeypatch.setattr(synthetic, "_BIG", 10)  # large inputs get fewer samples
    small = make_synthetic((1, 4, 4), 3, 1)
    assert small.x_train.shape == (256, 1, 4, 4) and small.x_test.shape == (64, 1, 4, 4)
    assert np.array_equal(small.x_train, a.x_train[:256])


def test_synthetic_labels_are_learnable():
    ds = make_synthetic((1, 8, 8), 10, 3)
    x, y = ds.x_train.reshape(1024, -1).astype(np.float64) - 0.5, ds.y_train
    w = np.zeros((64, 10))
    b = np.zeros(10)
    onehot = np.eye(10)[y]
    losses = []
    for _ in range(30):  # softmax regression, full-batch gradient descent
        z = x @ w + b
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        losses.append(float(-np.log(p[np.arange(len(y)), y]).mean()))
        w -= 2.0 * x.T @ (p - onehot) / len(x)
        b -= 2.0 * (p - onehot).mean(0)
    assert losses[-1] < 0.2 * losses[0]
    xt = ds.x_test.reshape(256, -1).astype(np.float64) - 0.5
    assert ((x @ w + b).argmax(1) == y).mean() > 0.9
    assert ((xt @ w + b).argmax(1) == ds.y_test).mean() > 0.9  # it generalises; chance is 0.1


# ---- every input and label by name (data/named.py) ----

X = Field("x", "input", (3,))
T = Field("t", "input", (2,))
Y = Field("y", "label", (), 4)


def test_npz_binds_every_input_and_label_by_name(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    arrays = {"x": rng.random((5, 3), np.float32), "t": rng.random((5, 2)), "y": rng.integers(0, 4, 5)}
    np.savez(tmp_path / "d.npz", **arrays, **{f"{k}_test": v[:2] for k, v in arrays.items()})
    s = load_samples("npz", {"file": str(tmp_path / "d.npz")}, (X, T, Y), 1)
    assert s.size == 5 and s.test_size == 2 and s.train["t"].dtype == np.float32
    b = s.batch(1, 4)  # positions 4..7: samples 4, 0, 1, 2 of every array alike
    np.testing.assert_array_equal(b["t"], arrays["t"][[4, 0, 1, 2]].astype(np.float32))
    np.testing.assert_array_equal(b["y"], arrays["y"][[4, 0, 1, 2]])


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ({"x": np.zeros((2, 3), np.float32), "y": np.zeros(2, int)}, "has no array 't' for the network's input t"),
        ({"x": np.zeros((2, 3), np.float32), "t": np.zeros((2, 2), np.float32)}, "has no array 'y'"),
        (
            {
                "x": np.zeros((2, 3), np.float32),
                "t": np.zeros((2, 2), np.float32),
                "y": np.zeros(2, int),
                "z": np.zeros(2),
            },
            "an array 'z' that names no input or label",
        ),  # fmt: skip
        (
            {"x": np.zeros((2, 3), np.float32), "t": np.zeros((3, 2), np.float32), "y": np.zeros(2, int)},
            "different numbers of samples",
        ),  # fmt: skip
        (
            {
                "x": np.zeros((2, 3), np.float32),
                "t": np.zeros((2, 2), np.float32),
                "y": np.zeros(2, int),
                "x_test": np.zeros((1, 3), np.float32),
            },
            "has 'x_test' but no 't_test'",
        ),  # fmt: skip
    ],
)
def test_npz_data_that_lacks_a_field_is_an_error_naming_it(tmp_path: Path, arrays: dict, message: str) -> None:
    np.savez(tmp_path / "d.npz", **arrays)
    with pytest.raises(DslProgramError, match=message):
        load_samples("npz", {"file": str(tmp_path / "d.npz")}, (X, T, Y), 1)


def test_image_sources_have_nothing_for_a_second_input(tmp_path: Path) -> None:
    with pytest.raises(DslProgramError, match="nothing for the network's input t : \\[N, 2\\]"):
        load_samples("mnist", {"dir": str(tmp_path)}, (Field("x", "input", (784,)), T), 1)


def test_synthetic_data_covers_every_input_with_a_learnable_target() -> None:
    s = load_samples("synthetic", {}, (X, T, Y, Field("z", "label", (2,), 3)), 1)
    assert set(s.train) == {"x", "t", "y", "z"} and s.test is not None
    x, t = s.train["x"], s.train["t"]
    assert t.shape == (len(x), 2) and t.dtype == np.float32 and np.std(t) > 0.01
    # a fixed linear function of x: least squares recovers it exactly, on the test samples too
    w, *_ = np.linalg.lstsq(x.astype(np.float64), t.astype(np.float64), rcond=None)
    np.testing.assert_allclose(s.test["x"] @ w, s.test["t"], atol=1e-5)
    np.testing.assert_array_equal(s.train["z"], np.stack([s.train["y"] % 3] * 2, axis=1))
    plain = load_data("synthetic", {}, (3,), 4, 1)  # the first input and label are today's prototypes
    np.testing.assert_array_equal(x, plain.x_train)
    np.testing.assert_array_equal(s.train["y"], plain.y_train)
