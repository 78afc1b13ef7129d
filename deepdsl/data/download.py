"""`deepdsl data mnist DIR` and `deepdsl data cifar10 DIR`: the canonical files, checked and written atomically.

Each data set is a list of files at a base URL, each with its size and its published SHA-256 (the sums
TensorFlow Datasets and torchvision check; the sizes are the files'). A file is streamed into a temporary file
beside its target (deepdsl/files.py) while its digest is computed, and renamed over the target only when the
digest matches: a mismatch, a file larger than it should be or a broken connection leaves nothing behind. A
file already there with the right digest is not fetched again. CIFAR-10 comes as one archive; its six batch
files (and the two small text files beside them) are then unpacked under ``DIR/cifar-10-batches-bin/``, by
name, each written atomically: no other member and no path from the archive is ever used.

The base URL can be replaced (`--url`, or DEEPDSL_DATA_URL in the environment) for a mirror or a test server;
the checksums stay those of the canonical files; an empty or malformed URL is an error, not the default. A
download gives up (Limits) at an overall deadline, when a file averages less than a least rate, or after a long
silence; redirects are followed to http(s) URLs only, at most MAX_REDIRECTS. Every failure is a DslProgramError
that names the mirror option, and leaves nothing behind: no partial file, and no folder this call made (unless
something else was put in it). Library code: progress goes to a callback.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import os
import shlex
import socket
import tarfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import DslProgramError
from ..files import atomic_output
from ..version import __version__

__all__ = ["DATASETS", "Dataset", "Limits", "Remote", "check_url", "download", "get_it"]

CHUNK = 1 << 20
MAX_REDIRECTS = 5
MIRROR = "from a mirror: `--url URL` (or DEEPDSL_DATA_URL), or copy the files into the folder by hand"


@dataclass(frozen=True)
class Limits:
    """When a download gives up. `deadline`: seconds for the whole command (every file; also bounds a server
    that answers byte by byte, headers included); `min_rate`: bytes a second that each file must average once
    `grace` seconds have passed since its request; `stall`: the longest wait for any byte."""

    deadline: float = 3600.0
    min_rate: float = 16384.0
    grace: float = 30.0
    stall: float = 60.0


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


def check_url(base_url: str) -> None:
    """A base URL `download` can use: http:// or https:// with a host. DslProgramError otherwise (an empty one
    included: it is not the default)."""
    if not base_url.strip():
        raise DslProgramError(
            "--url needs a URL (http:// or https://); leave the option out for the default", hint=MIRROR
        )
    try:
        parts = urllib.parse.urlsplit(base_url)
        parts.port  # noqa: B018 — a port that is no number raises here
    except ValueError as e:
        raise DslProgramError(f"--url {base_url!r} is not a URL: {e}", hint=MIRROR) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise DslProgramError(f"--url {base_url!r} is not an http:// or https:// URL with a host", hint=MIRROR)
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in base_url):
        raise DslProgramError(f"--url {base_url!r} holds a space or a control character", hint=MIRROR)


def download(
    name: str, directory: str, base_url: str | None = None, progress: Progress | None = None,
    dataset: Dataset | None = None, limits: Limits | None = None,
) -> list[str]:  # fmt: skip
    """Fetch data set `name` (or `dataset`, a table of one's own) into `directory` (made if missing); returns
    the paths written or found already correct. DslProgramError on any failure, naming the file and the URL; a
    failure leaves no partial file and removes the folders this call made (when they are still empty)."""
    ds = dataset if dataset is not None else DATASETS[name]
    limits = limits or Limits()
    base = ds.base_url if base_url is None else base_url
    check_url(base)
    if not base.endswith("/"):
        base += "/"
    made = _missing_folders(directory)
    try:
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as e:
            raise DslProgramError(f"cannot make the folder '{directory}': {e.strerror or e}") from None
        deadline = time.monotonic() + limits.deadline
        done = []
        for remote in ds.files:
            path = os.path.join(directory, remote.name)
            if not _matches(path, remote):
                _fetch(base + remote.name, path, remote, progress, limits, deadline)
            done.append(path)
        if ds.unpack:
            folder = os.path.join(directory, ds.folder)
            made += [f for f in _missing_folders(folder) if f not in made]
            done += _unpack(done[0], folder, ds.folder, ds.unpack)
        return done
    except BaseException:
        for folder in reversed(made):  # deepest first; a folder that holds anything stays
            try:
                os.rmdir(folder)
            except OSError:
                pass
        raise


def _missing_folders(directory: str) -> list[str]:
    """The folders `os.makedirs(directory)` would make, outermost first."""
    missing = []
    path = os.path.abspath(directory)
    while not os.path.lexists(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return missing[::-1]


def _matches(path: str, remote: Remote) -> bool:
    """`path` is a regular file with the size and digest of `remote` (so it need not be fetched again)."""
    if not os.path.isfile(path) or os.path.islink(path) or os.path.getsize(path) != remote.size:
        return False
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest() == remote.sha256


class _Watchdog:
    """Shuts a connection's socket down at the deadline, so that no read (of the headers or the body) outlives it."""

    def __init__(self, conn: http.client.HTTPConnection, deadline: float) -> None:
        self.conn = conn
        self.fired = False
        self.timer = threading.Timer(max(0.0, deadline - time.monotonic()), self._fire)
        self.timer.daemon = True
        self.timer.start()

    def _fire(self) -> None:
        self.fired = True
        sock = self.conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cancel(self) -> None:
        self.timer.cancel()


def _open(url: str, limits: Limits, deadline: float) -> tuple[http.client.HTTPResponse, _Watchdog, str]:
    """The response to GET `url` with status 200, following at most MAX_REDIRECTS redirects (to http or https
    only); its watchdog; the URL it came from."""
    for _ in range(MAX_REDIRECTS + 1):
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise _Failure(f"a redirect to {url!r}, which is not an http:// or https:// URL")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _Failure(f"no answer within the deadline of {limits.deadline:g} s")
        conn, target, headers = _connection(parts, min(limits.stall, remaining))
        watchdog = _Watchdog(conn, deadline)
        try:
            conn.request("GET", target, headers=headers)
            response = conn.getresponse()
        except BaseException:
            watchdog.cancel()
            conn.close()
            raise
        if response.status in (301, 302, 303, 307, 308):
            location = response.getheader("Location")
            watchdog.cancel()
            conn.close()
            if not location:
                raise _Failure(f"HTTP {response.status} {response.reason} without a Location")
            url = urllib.parse.urljoin(url, location)
            continue
        if response.status != 200:
            watchdog.cancel()
            conn.close()
            raise _Failure(f"HTTP {response.status} {response.reason}")
        return response, watchdog, url
    raise _Failure(f"more than {MAX_REDIRECTS} redirects (a redirect loop?)")


def _connection(
    parts: urllib.parse.SplitResult, timeout: float
) -> tuple[http.client.HTTPConnection, str, dict[str, str]]:
    """The (unopened) connection for `parts`, the request target and the headers: directly, or through the
    proxy the environment names (http_proxy, https_proxy, no_proxy: as urllib reads them), a CONNECT tunnel for
    https."""
    headers = {"User-Agent": f"deepdsl/{__version__}", "Accept-Encoding": "identity"}
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    https = parts.scheme == "https"
    proxy = urllib.request.getproxies().get(parts.scheme)
    if not proxy or urllib.request.proxy_bypass(parts.hostname or ""):
        kind = http.client.HTTPSConnection if https else http.client.HTTPConnection
        return kind(parts.hostname, parts.port, timeout=timeout), target, headers
    p = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    auth = {}
    if p.username is not None:
        token = base64.b64encode(
            f"{urllib.parse.unquote(p.username)}:{urllib.parse.unquote(p.password or '')}".encode()
        ).decode()
        auth = {"Proxy-Authorization": f"Basic {token}"}
    if https:
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(p.hostname, p.port or 8080, timeout=timeout)
        conn.set_tunnel(parts.hostname or "", parts.port, headers=auth)
        return conn, target, headers
    conn = http.client.HTTPConnection(p.hostname, p.port or 8080, timeout=timeout)
    return conn, urllib.parse.urlunsplit(parts), {**headers, **auth}


class _Failure(Exception):
    """Why a download failed, said once in `_fetch`'s message."""


def _fetch(url: str, path: str, remote: Remote, progress: Progress | None, limits: Limits, deadline: float) -> None:
    digest = hashlib.sha256()
    got = 0
    watchdog = None
    started = time.monotonic()
    try:
        response, watchdog, final = _open(url, limits, deadline)
        with response:
            length = response.getheader("Content-Length")
            if length is not None and length.strip() != str(remote.size):
                raise _Failure(f"it announces {length.strip()!r} bytes, but {remote.name} has {remote.size:,}")
            with atomic_output(path) as out:
                if progress:
                    progress(remote.name, 0, remote.size)
                while True:
                    block = response.read1(CHUNK)
                    now = time.monotonic()
                    if watchdog.fired or now >= deadline:
                        raise _Failure(f"not done within the deadline of {limits.deadline:g} s ({got:,} of "
                                       f"{remote.size:,} bytes)")  # fmt: skip
                    if not block:
                        break
                    got += len(block)
                    if got > remote.size:
                        raise _Failure(f"it sends more than the {remote.size:,} bytes {remote.name} has")
                    digest.update(block)
                    out.write(block)
                    if progress:
                        progress(remote.name, got, remote.size)
                    elapsed = now - started
                    if elapsed > limits.grace and got / elapsed < limits.min_rate:
                        raise _Failure(f"it sends {got / elapsed:,.0f} bytes a second, below the least rate of "
                                       f"{limits.min_rate:,.0f}")  # fmt: skip
                if got != remote.size:
                    raise _Failure(f"the connection ended after {got:,} of the {remote.size:,} bytes")
                if digest.hexdigest() != remote.sha256:  # raised inside: the temporary file is removed
                    raise DslProgramError(
                        f"checksum mismatch for {remote.name} from {final}: SHA-256 {digest.hexdigest()} ({got:,} "
                        f"bytes), expected {remote.sha256} ({remote.size:,} bytes); nothing was written",
                        hint=MIRROR,
                    )
    except _Failure as e:
        raise DslProgramError(
            f"cannot download {remote.name} from {url}: {e}; nothing was written", hint=MIRROR
        ) from None
    except (OSError, http.client.HTTPException, ValueError) as e:  # no connection, a timeout, a malformed answer
        if (watchdog is not None and watchdog.fired) or time.monotonic() >= deadline:
            why = f"not done within the deadline of {limits.deadline:g} s"
        elif isinstance(e, (TimeoutError, socket.timeout)):
            why = f"no data for {limits.stall:g} s"
        elif isinstance(e, OSError) and e.filename is not None:  # the file, not the network
            raise DslProgramError(f"cannot write '{path}': {e.strerror or e}") from None
        else:
            why = (e.strerror if isinstance(e, OSError) and e.strerror else str(e)) or type(e).__name__
        raise DslProgramError(
            f"cannot download {remote.name} from {url}: {why}; nothing was written", hint=MIRROR
        ) from None
    finally:
        if watchdog is not None:
            watchdog.cancel()


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
        raise DslProgramError(f"cannot unpack '{archive}': {e}", hint=MIRROR) from None
    return written
