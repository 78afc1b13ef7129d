"""`deepdsl data`: downloads from a local HTTP server (a thread serving small files this test writes), checked
against SHA-256, atomic, with a progress bar on stderr; CIFAR-10's archive unpacked by name."""

from __future__ import annotations

import functools
import gzip
import hashlib
import io
import tarfile
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
from test_data import idx_images, idx_labels

from deepdsl.data import load_data
from deepdsl.data.download import DATASETS, Dataset, Remote, download
from deepdsl.errors import DslProgramError
from deepdsl.files import TEMP_SUFFIX


class Server:
    """An HTTP server on 127.0.0.1 serving `root`, counting the requests for each path."""

    def __init__(self, root: Path) -> None:
        self.requests: list[str] = []
        server = self

        class Handler(SimpleHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 — the http.server name
                server.requests.append(self.path)
                super().do_GET()

            def log_message(self, *args: object) -> None:  # quiet
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(root)))
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Server, Path]]:
    root = tmp_path / "www"
    root.mkdir()
    server = Server(root)
    yield server, root
    server.close()


def remote(root: Path, name: str, data: bytes) -> Remote:
    (root / name).write_bytes(data)
    return Remote(name, len(data), hashlib.sha256(data).hexdigest())


def small_mnist(root: Path) -> Dataset:
    rng = np.random.default_rng(3)
    files = []
    for prefix, n in (("train", 8), ("t10k", 4)):
        files.append(remote(root, f"{prefix}-images-idx3-ubyte.gz",
                            gzip.compress(idx_images(rng.integers(0, 256, (n, 28, 28))), mtime=0)))  # fmt: skip
        files.append(remote(root, f"{prefix}-labels-idx1-ubyte.gz", gzip.compress(idx_labels(np.arange(n) % 10))))
    return Dataset("mnist", "https://unused.example/", tuple(files))


def test_mnist_downloads_checks_and_loads(served, tmp_path: Path) -> None:  # noqa: ANN001
    server, root = served
    table = small_mnist(root)
    seen: list[tuple[str, int, int]] = []
    folder = tmp_path / "data" / "mnist"
    paths = download("mnist", str(folder), server.url, lambda *p: seen.append(p), dataset=table)
    assert sorted(Path(p).name for p in paths) == sorted(r.name for r in table.files)
    for r in table.files:
        assert hashlib.sha256((folder / r.name).read_bytes()).hexdigest() == r.sha256
        assert (r.name, r.size, r.size) in seen and (r.name, 0, r.size) in seen
    data = load_data("mnist", {"dir": str(folder)}, (1, 28, 28), 10, 1)
    assert data.x_train.shape == (8, 1, 28, 28) and data.x_test is not None and len(data.x_test) == 4
    # again: every file is there and right, so nothing is fetched
    before = len(server.requests)
    download("mnist", str(folder), server.url, dataset=table)
    assert len(server.requests) == before
    # a file that went bad is fetched again
    (folder / table.files[0].name).write_bytes(b"damaged")
    download("mnist", str(folder), server.url, dataset=table)
    assert server.requests[before:] == [f"/{table.files[0].name}"]
    assert hashlib.sha256((folder / table.files[0].name).read_bytes()).hexdigest() == table.files[0].sha256


def test_a_checksum_mismatch_is_refused_and_leaves_nothing(served, tmp_path: Path, cli, monkeypatch) -> None:  # noqa: ANN001
    """The served files are not the canonical ones: the first is refused, with the digests, and nothing of it
    stays (no file, no temporary file); the progress bar was on stderr."""
    server, root = served
    small_mnist(root)
    first = DATASETS["mnist"].files[0]
    (root / first.name).write_bytes(bytes(first.size))  # the right size, other bytes
    folder = tmp_path / "mnist"
    r = cli("data", "mnist", str(folder), "--url", server.url)
    assert r.exit_code == 1, r.output
    assert f"checksum mismatch for {first.name} from {server.url}{first.name}" in r.stderr
    assert f"expected {first.sha256}" in r.stderr and "nothing was written" in r.stderr
    assert "%" in r.stderr and "[" in r.stderr and r.stdout == ""  # the progress bar, on stderr
    assert not folder.exists()  # the folder the command made is gone with the file
    # the URL from the environment, the same refusal; a folder that was there stays, empty
    folder.mkdir()
    monkeypatch.setenv("DEEPDSL_DATA_URL", server.url)
    r = cli("data", "mnist", str(folder))
    assert r.exit_code == 1 and "checksum mismatch" in r.stderr and server.url in r.stderr
    assert not [p for p in folder.iterdir() if p.name.endswith(TEMP_SUFFIX)]


def test_more_bytes_than_the_file_has_are_refused(served, tmp_path: Path) -> None:  # noqa: ANN001
    server, root = served
    big = remote(root, "f.bin", b"x" * 5000)
    table = Dataset("t", server.url, (Remote(big.name, 100, big.sha256),))
    with pytest.raises(DslProgramError, match="announces '5000' bytes, but f.bin has 100"):
        download("t", str(tmp_path / "out"), dataset=table)
    assert not (tmp_path / "out").exists()  # (a server that announces no length: tests/security)
    with pytest.raises(DslProgramError, match=r"cannot download missing.bin from .*HTTP 404"):
        download("t", str(tmp_path / "out"), dataset=Dataset("t", server.url, (Remote("missing.bin", 1, "0" * 64),)))


def test_cifar10_archive_is_unpacked_by_name(served, tmp_path: Path, cli) -> None:  # noqa: ANN001
    server, root = served
    rng = np.random.default_rng(5)
    names = DATASETS["cifar10"].unpack
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name in (*names, "../evil.bin"):
            data = b"text"  # three records (label, 3072 pixels) in each batch file
            if name.endswith(".bin"):
                data = b"".join(bytes([k]) + rng.integers(0, 256, 3072, dtype=np.uint8).tobytes() for k in range(3))
            info = tarfile.TarInfo(f"cifar-10-batches-bin/{name}" if not name.startswith("..") else name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    archive = remote(root, "cifar-10-binary.tar.gz", buffer.getvalue())
    table = Dataset("cifar10", server.url, (archive,), DATASETS["cifar10"].unpack, "cifar-10-batches-bin")
    folder = tmp_path / "cifar"
    download("cifar10", str(folder), dataset=table)
    assert sorted(p.name for p in (folder / "cifar-10-batches-bin").iterdir()) == sorted(names)
    assert not (tmp_path / "evil.bin").exists()
    data = load_data("cifar10", {"dir": str(folder)}, (3, 32, 32), 10, 1)
    assert data.x_train.shape == (15, 3, 32, 32) and data.x_test is not None and len(data.x_test) == 3


def test_missing_data_says_how_to_get_it(tmp_path: Path) -> None:
    for kind, shape in (("mnist", (1, 28, 28)), ("cifar10", (3, 32, 32))):
        for folder in (tmp_path / "no where", tmp_path):  # missing, and there without the files
            with pytest.raises(DslProgramError) as err:
                load_data(kind, {"dir": str(folder)}, shape, 10, 1)
            quoted = f"'{folder}'" if " " in str(folder) else str(folder)
            assert f"get them with `deepdsl data {kind} {quoted}`, or train on `--data synthetic`" in str(err.value)
