"""Writing a file so that nothing but that file can be harmed (`atomic_output`, `write_atomically`), and reading
a file only its user could have written (`private_folder`, `read_private`: the parser-table cache, a pickle).

Every write (a saved parameter file, predictions, a plot, an imported network and its weights, an ONNX export,
compiler output, a downloaded data file, the parser-table cache) follows one rule:

- The target's folder is opened once (the kernel resolves its path, so its protected-symlinks rule applies to any
  link on the way) and everything after happens relative to that open folder, so the folder cannot be swapped
  between the checks and the write.
- The data go to a temporary file in that folder, `.NAME.PID.RANDOM.deepdsl-tmp` (created exclusively and without
  following a link, so never through a link planted under that name), are synced, and the temporary file is
  renamed over the target: a reader sees the old file or the whole new one.
- What is replaced is only ever a regular file. A symbolic link at the target is refused: deepdsl never writes
  through a link it did not make, nor replaces one (remove it, or name the file it points to). A directory, FIFO,
  device or socket is refused too (renaming over a device node as root would replace `/dev/full` with an
  archive).
- A read-only target (no write permission for us in its mode bits: the owner's bit when we own it, the group's
  when we are in its group, else the others'; also for root) is refused unless the caller says to replace it
  (`replace_readonly`, the command line's `--replace-readonly`).
- The new file keeps the old file's permission bits, or gets 0666 less the umask when there was none.
- A name whose temporary name would exceed the folder's limit on a name (NAME_MAX, 255 bytes on most file systems)
  is refused by `check_replaceable`, which a command calls before its work, so it never fails after the work.

A temporary file left by a killed process (its PID no longer running) is removed by the next write of the same
file; the Java runtime's `Npz.write` names, checks and removes them the same way.
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

__all__ = [
    "TEMP_SUFFIX", "atomic_output", "atomic_output_at", "check_replaceable", "private_folder", "read_private",
    "write_atomically",
]  # fmt: skip

TEMP_SUFFIX = ".deepdsl-tmp"
_KINDS = {stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device",
          stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket"}  # fmt: skip
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
READ_ONLY_HINT = "--replace-readonly replaces it"


def _temp_name(base: str) -> str:
    return f".{base}.{os.getpid()}.{secrets.token_hex(4)}{TEMP_SUFFIX}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _remove_stale_temps(dir_fd: int, base: str) -> None:
    pattern = re.compile(rf"\.{re.escape(base)}\.(\d+)\.[0-9a-f]+{re.escape(TEMP_SUFFIX)}")
    try:
        names = os.listdir(dir_fd)
    except OSError:
        return  # cleaning up is a courtesy
    for name in names:
        m = pattern.fullmatch(name)
        if m is None or int(m.group(1)) == os.getpid() or _alive(int(m.group(1))):
            continue
        try:
            if stat.S_ISREG(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                os.unlink(name, dir_fd=dir_fd)
        except OSError:
            pass


def writable_by_us(st: os.stat_result) -> bool:
    """Whether the mode bits of `st` let this process's effective user write it, as the kernel decides for a user
    without privileges (so root too is refused a 0444 file): the owner's bit, else the group's, else the
    others'."""
    if st.st_uid == os.geteuid():
        return bool(st.st_mode & stat.S_IWUSR)
    if st.st_gid == os.getegid() or st.st_gid in os.getgroups():
        return bool(st.st_mode & stat.S_IWGRP)
    return bool(st.st_mode & stat.S_IWOTH)


def _split(path: str | os.PathLike[str]) -> tuple[str, str, str]:
    """(the path as given, its folder, its name); a path that names no file (`dir/`, `..`) is an error."""
    shown = os.fspath(path)
    folder, base = os.path.split(shown)
    if base in ("", ".", ".."):
        raise OSError(errno.EISDIR, f"'{shown}' names a folder, not a file", shown)
    return shown, folder or ".", base


def _open_folder(folder: str, shown: str) -> int:
    try:
        return os.open(folder, os.O_RDONLY | _DIRECTORY | _CLOEXEC)
    except FileNotFoundError:
        raise OSError(errno.ENOENT, f"folder '{folder}' does not exist", shown) from None
    except NotADirectoryError:
        raise OSError(errno.ENOTDIR, f"'{folder}' is not a folder", shown) from None


def _existing(dir_fd: int, base: str, shown: str, replace_readonly: bool) -> os.stat_result | None:
    """What is at `base` in the folder, when it may be replaced (None: nothing); OSError saying why not."""
    try:
        st = os.stat(base, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        raise OSError(errno.ELOOP, f"'{shown}' is a symbolic link; deepdsl neither writes through a link nor replaces "
                      "one (remove it, or name the file it points to)", shown)  # fmt: skip
    if not stat.S_ISREG(st.st_mode):
        kind = _KINDS.get(stat.S_IFMT(st.st_mode), "not a regular file")
        raise OSError(errno.EEXIST, f"'{shown}' is {kind}; only a regular file is replaced", shown)
    if not replace_readonly and not writable_by_us(st):
        mode = stat.S_IMODE(st.st_mode)
        raise OSError(errno.EACCES, f"'{shown}' is read-only (mode {mode:04o}); {READ_ONLY_HINT}", shown)
    return st


def _check_name(dir_fd: int, base: str, shown: str) -> None:
    try:
        limit = os.fpathconf(dir_fd, "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    temp = len(os.fsencode(_temp_name(base)))
    if limit > 0 and temp > limit:
        raise OSError(errno.ENAMETOOLONG, f"the name '{base}' is too long: its temporary file would be {temp} bytes "
                      f"(.NAME.PID.RANDOM{TEMP_SUFFIX}), over the folder's limit of {limit}", shown)  # fmt: skip


def check_replaceable(path: str | os.PathLike[str], *, replace_readonly: bool = False) -> None:
    """Whether `atomic_output(path)` could write `path`, checked before any work: OSError, with a `strerror` that
    says why, for a folder that is missing or not writable, a name too long for its temporary file, or something
    at the path that is not to be replaced (module docstring)."""
    shown, folder, base = _split(path)
    dir_fd = _open_folder(folder, shown)
    try:
        _existing(dir_fd, base, shown, replace_readonly)
        _check_name(dir_fd, base, shown)
        if not os.access(folder, os.W_OK):
            raise OSError(errno.EACCES, f"folder '{folder}' is not writable", shown)
    finally:
        os.close(dir_fd)


@contextmanager
def atomic_output_at(
    dir_fd: int, base: str, shown: str, *, replace_readonly: bool = False, mode: int | None = None
) -> Iterator[BinaryIO]:
    """`atomic_output` of the file `base` in the open folder `dir_fd` (`shown`: its name in messages); `mode`: the
    new file's permission bits whatever the old file's or the umask."""
    old = _existing(dir_fd, base, shown, replace_readonly)
    keep = mode if mode is not None else None if old is None else stat.S_IMODE(old.st_mode)
    _check_name(dir_fd, base, shown)
    _remove_stale_temps(dir_fd, base)
    tmp = _temp_name(base)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _CLOEXEC | _NOFOLLOW
    fd = os.open(tmp, flags, 0o600 if mode is not None else 0o666, dir_fd=dir_fd)  # the umask applies
    try:
        with os.fdopen(fd, "wb") as f:
            if keep is not None:
                os.fchmod(f.fileno(), keep)
            yield f
            f.flush()
            os.fsync(f.fileno())
        _existing(dir_fd, base, shown, replace_readonly)  # what may have been put there meanwhile
        os.rename(tmp, base, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)  # (a link put there since is replaced, not used)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise


@contextmanager
def atomic_output(path: str | os.PathLike[str], *, replace_readonly: bool = False) -> Iterator[BinaryIO]:
    """A binary file to write whose contents replace `path` atomically when the block ends without an error (and
    are thrown away when it raises). Raises OSError, with a `strerror` that says why, for a target that is not to
    be replaced (module docstring)."""
    shown, folder, base = _split(path)
    dir_fd = _open_folder(folder, shown)
    try:
        with atomic_output_at(dir_fd, base, shown, replace_readonly=replace_readonly) as f:
            yield f
    finally:
        os.close(dir_fd)


def write_atomically(path: str | os.PathLike[str], data: str | bytes, *, replace_readonly: bool = False) -> None:
    """`atomic_output` for a whole text (UTF-8) or byte string."""
    with atomic_output(path, replace_readonly=replace_readonly) as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)


def _ours_alone(st: os.stat_result) -> bool:
    return st.st_uid == os.geteuid() and not st.st_mode & 0o022


def private_folder(path: str | os.PathLike[str]) -> int | None:
    """The folder `path` opened (a descriptor to close), when it is ours alone: a real folder (not a link to one),
    owned by this process's user, writable by no one else, checked on the open descriptor. None otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
    except OSError:
        st = None
    if st is None or not stat.S_ISDIR(st.st_mode) or not _ours_alone(st):
        os.close(fd)
        return None
    return fd


def read_private(dir_fd: int, name: str, limit: int = 1 << 28) -> bytes | None:
    """The bytes of `name` in the open folder `dir_fd` when it is a regular file owned by this process's user,
    writable by no one else, and at most `limit` bytes; None otherwise. A link is not followed, and a FIFO or
    device is never opened for reading (O_NONBLOCK as well, so one put there in between cannot hang the open);
    the checks are made on the open descriptor, so nothing can be swapped in after them."""
    try:
        if not stat.S_ISREG(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
            return None
        fd = os.open(name, os.O_RDONLY | _NOFOLLOW | _NONBLOCK | _CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or not _ours_alone(st) or st.st_size > limit:
            return None
        chunks, size = [], 0
        while chunk := os.read(fd, 1 << 20):
            size += len(chunk)
            if size > limit:
                return None
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)
