"""`deepdsl data` against a hostile or broken server (issue 36, item 7): a local HTTP server on 127.0.0.1, in a
thread, serves a drip, a truncated body, a lying Content-Length, a 404, a body that is not the file, a redirect
loop, a redirect to ftp:// and a stream that is not HTTP; bad --url values. Each is a clear error within the
deadline (no traceback), names the mirror option and leaves nothing behind (no file, no temporary file, no
folder the command made). Every handler stops by itself within a few seconds."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from deepdsl.data.download import DATASETS, Dataset, Limits, Remote, download
from deepdsl.errors import DslProgramError

BODY = bytes(range(256)) * 4  # the file the table names: 1 KiB
FILE = Remote("f.gz", len(BODY), hashlib.sha256(BODY).hexdigest())
DRIP_SECONDS = 6.0  # the longest any handler runs
PROXIED: list[str] = []  # the URLs the server was asked for as a proxy


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:  # quiet
        pass

    def _head(self, status: int, length: int | None, **headers: str) -> None:
        self.send_response(status)
        if length is not None:
            self.send_header("Content-Length", str(length))
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Connection", "close")
        self.end_headers()

    def do_GET(self) -> None:  # noqa: N802 — the http.server name
        path = self.path
        if path.startswith("http://"):  # asked as a proxy: the absolute URL of another host
            path = "/" + path.split("/", 3)[3]
            PROXIED.append(self.path)
        kind = path.strip("/").split("/")[0]
        end = time.monotonic() + DRIP_SECONDS
        try:
            if kind == "ok":
                self._head(200, len(BODY))
                self.wfile.write(BODY)
            elif kind == "drip":  # the right length, a byte every 50 ms
                self._head(200, len(BODY))
                for b in BODY:
                    if time.monotonic() > end:
                        break
                    self.wfile.write(bytes([b]))
                    self.wfile.flush()
                    time.sleep(0.05)
            elif kind == "headerdrip":  # the status line, then headers a byte at a time
                self.wfile.write(b"HTTP/1.1 200 OK\r\n")
                while time.monotonic() < end:
                    self.wfile.write(b"X")
                    self.wfile.flush()
                    time.sleep(0.05)
            elif kind == "short":  # announces the whole file, sends half
                self._head(200, len(BODY))
                self.wfile.write(BODY[: len(BODY) // 2])
            elif kind == "wronglength":
                self._head(200, len(BODY) + 100)
                self.wfile.write(BODY)
            elif kind == "nolength":  # no Content-Length, more than the file (read until the close)
                self._head(200, None)
                self.wfile.write(BODY * 2)
            elif kind == "missing":
                self._head(404, 0)
            elif kind == "notgzip":  # the right length, other bytes (an HTML error page, say)
                page = (b"<html>not the file</html>" * 100)[: len(BODY)]
                self._head(200, len(page))
                self.wfile.write(page)
            elif kind == "loop":
                self._head(302, 0, Location=self.path)
            elif kind == "toftp":
                self._head(301, 0, Location="ftp://127.0.0.1/f.gz")
            elif kind == "nothttp":
                self.wfile.write(b"hello, this is not HTTP\r\n\r\n")
        except OSError:  # the client gave up: stop
            pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()
    thread.join(5)


def table(base: str) -> Dataset:
    return Dataset("t", base, (FILE,))


def left(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*")) if folder.exists() else []


FAST = Limits(deadline=2.0, min_rate=100.0, grace=0.5, stall=2.0)

CASES = [
    ("drip", "bytes a second, below the least rate"),
    ("short", "the connection ended after 512 of the 1,024 bytes"),
    ("wronglength", "announces '1124' bytes, but f.gz has 1,024"),
    ("nolength", "it sends more than the 1,024 bytes f.gz has"),
    ("missing", "HTTP 404"),
    ("notgzip", "checksum mismatch for f.gz"),
    ("loop", "more than 5 redirects"),
    ("toftp", "not an http:// or https:// URL"),
    ("nothttp", "cannot download f.gz"),
]


@pytest.mark.parametrize(("kind", "says"), CASES)
def test_each_broken_answer_is_a_clear_error_that_leaves_nothing(server: str, tmp_path: Path, kind: str,
                                                                 says: str) -> None:  # fmt: skip
    folder = tmp_path / "new" / "data"
    t0 = time.monotonic()
    with pytest.raises(DslProgramError) as err:
        download("t", str(folder), dataset=table(server + kind + "/"), limits=FAST)
    assert time.monotonic() - t0 < FAST.deadline + 1.5
    assert says in err.value.message, err.value.message
    assert "--url" in (err.value.hint or ""), err.value.hint
    assert not (tmp_path / "new").exists()  # neither folder this call made, nor any file


def test_an_existing_folder_stays_with_what_it_held(server: str, tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(DslProgramError):
        download("t", str(tmp_path), dataset=table(server + "short/"), limits=FAST)
    assert left(tmp_path) == ["keep.txt"]


def test_the_deadline_bounds_a_drip_of_the_headers(server: str, tmp_path: Path) -> None:
    """No byte of the body ever comes; a per-read timeout would wait for ever, the deadline does not."""
    t0 = time.monotonic()
    with pytest.raises(DslProgramError, match="not done within the deadline of 1 s"):
        download("t", str(tmp_path / "d"), dataset=table(server + "headerdrip/"),
                 limits=Limits(deadline=1.0, min_rate=0, grace=0.1, stall=30))  # fmt: skip
    assert time.monotonic() - t0 < 2.5
    assert not (tmp_path / "d").exists()


def test_the_deadline_bounds_a_body_drip_above_the_least_rate(server: str, tmp_path: Path) -> None:
    t0 = time.monotonic()
    with pytest.raises(DslProgramError, match=r"not done within the deadline of 1\.5 s \(\d+ of 1,024 bytes\)"):
        download("t", str(tmp_path / "d"), dataset=table(server + "drip/"),
                 limits=Limits(deadline=1.5, min_rate=1, grace=0.1, stall=30))  # fmt: skip
    assert time.monotonic() - t0 < 3.0


def test_a_good_server_still_works(server: str, tmp_path: Path) -> None:
    paths = download("t", str(tmp_path / "d"), dataset=table(server + "ok/"), limits=FAST)
    assert [Path(p).read_bytes() for p in paths] == [BODY]


def test_the_defaults_bound_a_download() -> None:
    limits = Limits()
    assert 0 < limits.deadline <= 4 * 3600 and limits.min_rate > 0 and limits.stall <= 120
    # CIFAR-10 at the least rate fits in the deadline, so the rate and not the deadline stops a slow server
    assert DATASETS["cifar10"].files[0].size / limits.min_rate < 4 * limits.deadline


@pytest.mark.parametrize("url", ["", "  ", "ftp://example.com/", "http://[", "not a url", "http://", "file:///etc/"])
def test_bad_urls_are_refused_before_anything_is_made(cli, tmp_path: Path, url: str) -> None:  # noqa: ANN001
    folder = tmp_path / "m"
    r = cli("data", "mnist", str(folder), "--url", url)
    assert r.exit_code == 2, (url, r.output)
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    assert "Traceback" not in r.output and "--url" in r.stderr
    assert len(r.stderr.strip().splitlines()) <= 4  # a short message, said once
    assert not folder.exists()


def test_cli_failures_name_the_mirror_and_leave_no_folder(cli, server: str, tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    folder = tmp_path / "m"
    r = cli("data", "mnist", str(folder), "--url", server + "missing/")
    assert r.exit_code == 1, r.output
    assert "HTTP 404" in r.stderr and "--url URL" in r.stderr and "DEEPDSL_DATA_URL" in r.stderr
    assert r.stderr.count("HTTP 404") == 1
    assert not folder.exists()
    # the deadline is an option of the command
    t0 = time.monotonic()
    r = cli("data", "mnist", str(folder), "--url", server + "headerdrip/", "--deadline", "1")
    assert r.exit_code == 1 and "deadline of 1 s" in r.stderr, r.output
    assert time.monotonic() - t0 < 3
    # offline (nothing listens on the port): the mirror named, no folder left
    monkeypatch.setenv("DEEPDSL_DATA_URL", "http://127.0.0.1:9/")
    r = cli("data", "mnist", str(folder))
    assert r.exit_code == 1 and "cannot download" in r.stderr and "--url URL" in r.stderr, r.output
    assert not folder.exists()


def test_a_proxy_from_the_environment_is_used(server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As urllib did: http_proxy (and no_proxy) from the environment; the host need not resolve here."""
    monkeypatch.setenv("http_proxy", server)
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    PROXIED.clear()
    paths = download("t", str(tmp_path / "d"), dataset=table("http://mirror.invalid/ok/"), limits=FAST)
    assert [Path(p).read_bytes() for p in paths] == [BODY]
    assert PROXIED == ["http://mirror.invalid/ok/f.gz"]
