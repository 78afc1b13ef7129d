"""Writing a file so that nothing but that file can be harmed: `atomic_output(path)` and `write_atomically`.

The data go to a temporary file in the target's folder, `.NAME.PID.RANDOM.deepdsl-tmp` (created exclusively, so
never through a link planted under that name), are synced, and the temporary file is renamed over the target: a
reader sees the old file or the whole new one. What is replaced is only ever a regular file: a directory, FIFO,
device or socket at the path is refused (renaming over a device node as root would replace `/dev/full` with an
archive). A symbolic link at the path is followed for a parameter file (`--save`: the file the link names is
replaced and the link stays, as the shell's `>` would write through it) and replaced as a link for compiler output
(`follow_symlinks=False`: a link planted in an output folder is never written through). The new file keeps the old
file's permission bits, or gets 0666 less the umask when there was none. A temporary file left by a killed
process (its PID no longer running) is removed by the next write of the same file; the Java runtime's
`Npz.write` names and removes them the same way.
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from typing import BinaryIO

__all__ = ["TEMP_SUFFIX", "atomic_output", "check_replaceable", "write_atomically"]

TEMP_SUFFIX = ".deepdsl-tmp"
_KINDS = {stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device",
          stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket"}  # fmt: skip


def _follow(path: str) -> str:
    """Where a chain of symbolic links at `path` ends (the path itself when it is no link)."""
    for _ in range(40):
        if not os.path.islink(path):
            return path
        path = os.path.join(os.path.dirname(path), os.readlink(path))
    raise OSError(errno.ELOOP, "too many levels of symbolic links", path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _remove_stale_temps(folder: str, base: str) -> None:
    pattern = re.compile(rf"\.{re.escape(base)}\.(\d+)\.[0-9a-f]+{re.escape(TEMP_SUFFIX)}")
    try:
        names = os.listdir(folder)
    except OSError:
        return  # cleaning up is a courtesy
    for name in names:
        m = pattern.fullmatch(name)
        if m is None or int(m.group(1)) == os.getpid() or _alive(int(m.group(1))):
            continue
        path = os.path.join(folder, name)
        try:
            if stat.S_ISREG(os.lstat(path).st_mode):
                os.unlink(path)
        except OSError:
            pass


def check_replaceable(path: str | os.PathLike[str], *, follow_symlinks: bool) -> str:
    """What `atomic_output(path)` would replace (the end of a chain of links, with `follow_symlinks`), checked
    before anything is written: OSError, with a `strerror` that says why, for a folder that is missing or not
    writable, or for something at the path that is not a regular file."""
    target = os.fspath(path)
    if follow_symlinks:
        target = _follow(target)
    folder = os.path.dirname(os.path.abspath(target))
    if not os.path.isdir(folder):
        raise OSError(errno.ENOENT, f"folder '{folder}' does not exist", target)
    if not os.access(folder, os.W_OK):
        raise OSError(errno.EACCES, f"folder '{folder}' is not writable", target)
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        return target
    if not stat.S_ISLNK(st.st_mode) and not stat.S_ISREG(st.st_mode):
        kind = _KINDS.get(stat.S_IFMT(st.st_mode), "not a regular file")
        raise OSError(errno.EEXIST, f"'{target}' is {kind}; only a regular file is replaced", target)
    return target


@contextmanager
def atomic_output(path: str | os.PathLike[str], *, follow_symlinks: bool) -> Iterator[BinaryIO]:
    """A binary file to write whose contents replace `path` atomically when the block ends without an error
    (and are thrown away when it raises). Raises OSError, with a `strerror` that says why, for a target that
    is not a regular file."""
    target = os.fspath(path)
    if follow_symlinks:
        target = _follow(target)
    folder, base = os.path.split(os.path.abspath(target))
    mode = None
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISLNK(st.st_mode):
        if not stat.S_ISREG(st.st_mode):
            kind = _KINDS.get(stat.S_IFMT(st.st_mode), "not a regular file")
            raise OSError(errno.EEXIST, f"'{target}' is {kind}; only a regular file is replaced", target)
        mode = stat.S_IMODE(st.st_mode)
    _remove_stale_temps(folder, base)
    tmp = os.path.join(folder, f".{base}.{os.getpid()}.{secrets.token_hex(4)}{TEMP_SUFFIX}")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(tmp, flags, 0o666)  # the umask applies
    try:
        with os.fdopen(fd, "wb") as f:
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_atomically(path: str | os.PathLike[str], data: str | bytes, *, follow_symlinks: bool = False) -> None:
    """`atomic_output` for a whole text (UTF-8) or byte string."""
    with atomic_output(path, follow_symlinks=follow_symlinks) as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)
