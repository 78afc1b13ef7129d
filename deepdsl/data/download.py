"""`deepdsl data mnist DIR` and `deepdsl data cifar10 DIR`: the canonical files, checked and written atomically.

Each data set is a list of files at a base URL, each with its size and its published SHA-256 (the sums
TensorFlow Datasets and torchvision check; the sizes are the files'). A file is streamed into a temporary file
beside its target (deepdsl/files.py) while its digest is computed, and renamed over the target only when the
digest matches: a mismatch, a file larger than it should be or a broken connection leaves nothing behind. A
file already there with the right digest is not fetched again. CIFAR-10 comes as one archive; its six batch
files (and the two small text files beside them) are then unpacked under ``DIR/cifar-10-batches-bin/``, by
name, each written atomically: no other member and no path from the archive is ever used.

The base URL can be replaced (`--url`, or DEEPDSL_DATA_URL in the environment) for a mirror or a test server;
the checksums stay those of the canonical files. Library code: progress goes to a callback.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import tarfile
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import DslProgramError
from ..files import atomic_output

__all__ = ["DATASETS", "Dataset", "Remote", "download", "get_it"]

CHUNK = 1 << 20
TIMEOUT_SECONDS = 60

Progress = Callable[[str, int, int], None]  # (file name, bytes so far, bytes in all)


@dataclass(frozen=True)
class Remote:
    """One file of a data set: its name (at the base URL and in DIR), size in bytes and SHA-256."""

    name: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Dataset:
    name: str
    base_url: str
    files: tuple[Remote, ...]
    unpack: tuple[str, ...] = ()  # archive members (under `folder`) to write beside the archive
    folder: str = ""


DATASETS = {
    # TensorFlow's mirror of Yann LeCun's files (his site refuses most downloads now); the same bytes
    "mnist": Dataset(
        "mnist",
        "https://storage.googleapis.com/cvdf-datasets/mnist/",
        (
            Remote("train-images-idx3-ubyte.gz", 9_912_422,
                   "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609"),
            Remote("train-labels-idx1-ubyte.gz", 28_881,
                   "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c"),
            Remote("t10k-images-idx3-ubyte.gz", 1_648_877,
                   "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6"),
            Remote("t10k-labels-idx1-ubyte.gz", 4_542,
                   "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6"),
        ),
    ),
    # Alex Krizhevsky's page: the binary version, which cifar10("DIR") reads
    "cifar10": Dataset(
        "cifar10",
        "https://www.cs.toronto.edu/~kriz/",
        (
            Remote("cifar-10-binary.tar.gz", 170_052_171,
                   "c4a38c50a1bc5f3a1c5537f2155ab9d68f9f25eb1ed8d9ddda3db29a59bca1dd"),
        ),
        unpack=(*(f"data_batch_{k}.bin" for k in range(1, 6)), "test_batch.bin", "batches.meta.txt", "readme.html"),
        folder="cifar-10-batches-bin",
    ),
}  # fmt: skip


def get_it(name: str, directory: str) -> str:
    """What a data error says when the files are not there: the command that gets them, or synthetic data."""
    return f"get them with `deepdsl data {name} {shlex.quote(directory)}`, or train on `--data synthetic`"


def download(
    name: str, directory: str, base_url: str | None = None, progress: Progress | None = None,
    dataset: Dataset | None = None,
) -> list[str]:  # fmt: skip
    """Fetch data set `name` (or `dataset`, a table of one's own) into `directory` (made if missing); returns
    the paths written or found already correct. DslProgramError on any failure, naming the file and the URL."""
    ds = dataset if dataset is not None else DATASETS[name]
    base = base_url or ds.base_url
    if not base.endswith("/"):
        base += "/"
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as e:
        raise DslProgramError(f"cannot make the folder '{directory}': {e.strerror or e}") from None
    done = []
    for remote in ds.files:
        path = os.path.join(directory, remote.name)
        if not _matches(path, remote):
            _fetch(base + remote.name, path, remote, progress)
        done.append(path)
    if ds.unpack:
        done += _unpack(done[0], os.path.join(directory, ds.folder), ds.folder, ds.unpack)
    return done


def _matches(path: str, remote: Remote) -> bool:
    """`path` is a regular file with the size and digest of `remote` (so it need not be fetched again)."""
    if not os.path.isfile(path) or os.path.islink(path) or os.path.getsize(path) != remote.size:
        return False
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest() == remote.sha256


def _fetch(url: str, path: str, remote: Remote, progress: Progress | None) -> None:
    digest = hashlib.sha256()
    got = 0
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_SECONDS) as response:  # noqa: S310 — http(s) only
            with atomic_output(path) as out:
                if progress:
                    progress(remote.name, 0, remote.size)
                while block := response.read(CHUNK):
                    got += len(block)
                    if got > remote.size:
                        raise DslProgramError(
                            f"{url} sends more than the {remote.size:,} bytes {remote.name} has; nothing was written"
                        )
                    digest.update(block)
                    out.write(block)
                    if progress:
                        progress(remote.name, got, remote.size)
                if digest.hexdigest() != remote.sha256:  # raised inside: the temporary file is removed
                    raise DslProgramError(
                        f"checksum mismatch for {remote.name} from {url}: SHA-256 {digest.hexdigest()} ({got:,} "
                        f"bytes), expected {remote.sha256} ({remote.size:,} bytes); nothing was written"
                    )
    except urllib.error.URLError as e:
        reason = f"HTTP {e.code} {e.reason}" if isinstance(e, urllib.error.HTTPError) else e.reason
        raise DslProgramError(f"cannot download {remote.name} from {url}: {reason}") from None
    except OSError as e:  # a timeout, a broken connection, a folder one cannot write
        raise DslProgramError(f"cannot download {remote.name} from {url} to '{path}': {e.strerror or e}") from None


def _unpack(archive: str, folder: str, prefix: str, members: tuple[str, ...]) -> list[str]:
    """The named regular members `prefix/NAME` of the (checked) archive, each written to `folder/NAME`."""
    os.makedirs(folder, exist_ok=True)
    written = []
    try:
        with tarfile.open(archive, "r:gz") as tar:
            for name in members:
                try:
                    info = tar.getmember(f"{prefix}/{name}")
                except KeyError:
                    raise DslProgramError(f"'{archive}' has no member {prefix}/{name}") from None
                source = tar.extractfile(info) if info.isreg() else None
                if source is None:
                    raise DslProgramError(f"'{archive}': {prefix}/{name} is not a regular file")
                path = os.path.join(folder, name)
                with source, atomic_output(path) as out:
                    for block in iter(lambda: source.read(CHUNK), b""):  # noqa: B023 — used at once
                        out.write(block)
                written.append(path)
    except (OSError, tarfile.TarError) as e:
        raise DslProgramError(f"cannot unpack '{archive}': {e}") from None
    return written
