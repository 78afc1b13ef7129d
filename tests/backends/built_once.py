"""Native builds made once per test run: the stand-in libraries (fake_libcuda.c, fake_libcublas.c, fake_libcudnn.c
and the CUDA 13 and cuDNN 9 sets made from them) and the emulated kernels of a translation unit are the same files
in every test that builds them, and gcc or g++ costs a second or more each time (fake_libcudnn.c alone, built four
times for a cuDNN 9 set: about 4 s). `in_folder(key, folder, make)` builds with `make(tmp)` once per key in the run's
cache folder, $DEEPDSL_TEST_BUILDS (tests/conftest.py names a fresh one for each pytest run, shared by its xdist
workers and what they launch, made by the first build and removed at the end), and copies the files into `folder`.
Each test still gets files of its own, so a library is loaded from its own path as before (a second dlopen of one
path would share the first one's state). Without $DEEPDSL_TEST_BUILDS (scripts/gpu_prepare.sh,
scripts/profile_gpu.py) `make(folder)` builds in place, as before.

The key names everything the files depend on that may differ within a run (the caller's arguments and the sources'
text); a build that fails is not kept, so every test that asks for it fails the same way."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

VARIABLE = "DEEPDSL_TEST_BUILDS"


def in_folder(key: str, folder: Path, make: Callable[[Path], None]) -> Path:
    """The files `make(tmp)` writes into an empty folder, built once a run for `key`, copied into `folder` (made if
    missing); returns `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    cache = os.environ.get(VARIABLE)
    if not cache:
        make(folder)
        return folder
    done = Path(cache) / hashlib.sha256(key.encode()).hexdigest()[:24]
    if not done.is_dir():
        Path(cache).mkdir(mode=0o700, exist_ok=True)  # the run's first build makes it
        with open(done.with_name(f"{done.name}.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another xdist worker or rank may be building the same key
            if not done.is_dir():
                work = Path(tempfile.mkdtemp(dir=cache))
                try:
                    make(work)
                    work.rename(done)  # complete, or not at all
                finally:
                    shutil.rmtree(work, ignore_errors=True)
    for path in sorted(done.rglob("*")):
        target = folder / path.relative_to(done)
        if path.is_dir():
            target.mkdir(exist_ok=True)
            continue
        # a new file renamed over the old one, as the linker writes its output: a process that loaded the old
        # library (drivers may share a folder) keeps its mapping
        fresh = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        shutil.copy2(path, fresh)
        os.replace(fresh, target)
    return folder


def text_of(*paths: Path) -> str:
    """The sources' names and text, for a key."""
    return "".join(f"{p.name}\0{p.read_text()}\0" for p in paths)
