"""CUDA C → PTX with NVRTC (the PyPI wheel `nvidia-cuda-nvrtc-cu12`, loaded through ctypes), or nvcc.

No GPU is needed: NVRTC only compiles. The wheel is pinned (pyproject.toml, `test` extra) to a CUDA 12.6
NVRTC, whose PTX (ISA 8.5) every driver from 560 on accepts, CUDA 13.0's 580 included; a newer NVRTC would
emit PTX that older drivers refuse (CUDA_ERROR_UNSUPPORTED_PTX_VERSION). A compile error, and any warning,
is a `CudaCompileError` carrying the compiler's log; no compiler at all is a `NoCudaCompiler` whose message
says what to install.

NVRTC's PTX is kept by a key of everything that makes it (the source, the architecture, the file name, strictness,
the options and NVRTC's version): the last few in the process, so that several runners of one network (a benchmark's
rows) compile its translation unit once, and with DEEPDSL_PTX_CACHE=1 also as files in the user's cache folder
(DEEPDSL_CACHE), for the later processes of one check (scripts/gpu_check.sh). PTX runs on the GPU, so a file is read
only from a folder and as a file that are this user's alone (files.private_folder, files.read_private), as the parser
tables are; only a compile without error is kept.
"""

from __future__ import annotations

import ctypes
import glob
import hashlib
import os
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

from deepdsl import config, files
from deepdsl.errors import DslProgramError

DEFAULT_ARCHS = ("sm_90", "sm_80")
PINNED_NVRTC = "nvidia-cuda-nvrtc-cu12==12.6.85"


class CudaCompileError(RuntimeError):
    """The compiler rejected the source or warned about it (a bug in the emitter); the message holds its log."""


class NoCudaCompiler(DslProgramError):
    """Neither NVRTC nor nvcc could be found (a DslError, so the CLI prints its message without a traceback)."""


def _candidates() -> list[str]:
    found = []
    try:
        import nvidia.cuda_nvrtc as wheel  # the PyPI wheel: a namespace package holding lib/libnvrtc.so.12

        for folder in wheel.__path__:
            found += sorted(glob.glob(os.path.join(folder, "lib", "libnvrtc.so*")))
            found += sorted(glob.glob(os.path.join(folder, "bin", "nvrtc64_*.dll")))
    except ImportError:
        pass
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            found += sorted(glob.glob(os.path.join(home, "lib64", "libnvrtc.so*")))
    return found + ["libnvrtc.so.12", "libnvrtc.so"]


@cache
def _library() -> ctypes.CDLL | None:
    for name in _candidates():
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        return lib
    return None


def nvrtc_version() -> tuple[int, int] | None:
    """(major, minor) of the NVRTC found, or None."""
    lib = _library()
    if lib is None:
        return None
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return major.value, minor.value


def compiler() -> str:
    """Which compiler `ptx` uses: 'nvrtc 12.6', 'nvcc', or raises NoCudaCompiler."""
    v = nvrtc_version()
    if v is not None:
        return f"nvrtc {v[0]}.{v[1]}"
    if shutil.which("nvcc"):
        return "nvcc"
    raise NoCudaCompiler(
        "no CUDA compiler found: install NVRTC with `pip install 'deepdsl[test]'` (or "
        f"`pip install {PINNED_NVRTC}`), or put nvcc on PATH"
    )


def supported_archs() -> tuple[str, ...] | None:
    """The architectures the compiler `ptx` uses writes PTX for (`sm_50`, ..., `sm_90` for NVRTC 12.6), or None
    where it cannot say (no compiler; an nvcc too old for --list-gpu-arch)."""
    lib = _library()
    if lib is not None:
        n = ctypes.c_int()
        if lib.nvrtcGetNumSupportedArchs(ctypes.byref(n)) != 0 or n.value <= 0:
            return None
        found = (ctypes.c_int * n.value)()
        if lib.nvrtcGetSupportedArchs(found) != 0:
            return None
        return tuple(f"sm_{a}" for a in found)
    if shutil.which("nvcc"):
        run = subprocess.run(["nvcc", "--list-gpu-arch"], capture_output=True, text=True)
        archs = tuple(f"sm_{line.strip()[8:]}" for line in run.stdout.splitlines() if line.startswith("compute_"))
        return archs if run.returncode == 0 and archs else None
    return None


def ptx(source: str, arch: str = "sm_90", name: str = "program.cu", strict: bool = True) -> str:
    """The PTX of `source` for `arch` (e.g. sm_90); CudaCompileError on an error, and with `strict` (the tests, and
    what deepdsl compile writes) on any warning too."""
    if not arch.startswith("sm_") or not arch[3:].isdigit():
        raise ValueError(f"unknown CUDA architecture {arch!r} (expected e.g. sm_90)")
    lib = _library()
    if lib is not None:
        key = _key(source, arch, name, strict)
        text = _kept(key)
        if text is None:
            text = _nvrtc(lib, source, arch, name, strict)
            _keep(key, text)
        return text
    if shutil.which("nvcc"):
        return _nvcc(source, arch, name, strict)
    compiler()  # raises NoCudaCompiler
    raise AssertionError("unreachable")


def _check(lib: ctypes.CDLL, code: int, what: str) -> None:
    if code != 0:
        raise CudaCompileError(f"{what}: {lib.nvrtcGetErrorString(code).decode()}")


def _options(arch: str) -> list[str]:
    return [f"--gpu-architecture=compute_{arch[3:]}", "--std=c++17", "--fmad=true"]


KEPT_IN_PROCESS = 8  # translation units whose PTX a process keeps (ResNet-50's is about 0.9 MB)
_recent: dict[str, str] = {}  # key -> PTX, oldest first


def _key(source: str, arch: str, name: str, strict: bool) -> str:
    made_by = "\0".join((source, arch, name, str(strict), *_options(arch), repr(nvrtc_version())))
    return hashlib.sha256(made_by.encode()).hexdigest()


def _cache_folder() -> str | None:
    """The folder of the PTX files kept between processes; None: none kept (DEEPDSL_PTX_CACHE unset)."""
    cfg = config.from_env()
    return cfg.cache_dir if cfg.ptx_cache else None


def _kept(key: str) -> str | None:
    """The PTX compiled before under `key`, in this process or (DEEPDSL_PTX_CACHE) in the cache folder; else None."""
    if key in _recent:
        return _recent[key]
    folder = _cache_folder()
    if folder is None:
        return None
    fd = files.private_folder(folder)
    if fd is None:
        return None
    try:
        data = files.read_private(fd, f"ptx-{key[:40]}.ptx")
    finally:
        os.close(fd)
    if data is None or not data.startswith(b"//"):  # NVRTC's PTX opens with its comment header
        return None
    text = data.decode(errors="replace")
    _remember(key, text)
    return text


def _remember(key: str, text: str) -> None:
    _recent.pop(key, None)
    _recent[key] = text
    while len(_recent) > KEPT_IN_PROCESS:
        del _recent[next(iter(_recent))]


def _keep(key: str, text: str) -> None:
    """Keep `text` under `key` for this process and (DEEPDSL_PTX_CACHE) as a file of the cache folder, mode 0600; a
    folder that cannot be made or written only means compiling again."""
    _remember(key, text)
    folder = _cache_folder()
    if folder is None:
        return
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
    except OSError:
        return
    fd = files.private_folder(folder)
    if fd is None:
        return
    name = f"ptx-{key[:40]}.ptx"
    try:
        with files.atomic_output_at(fd, name, os.path.join(folder, name), replace_readonly=True, mode=0o600) as f:
            f.write(text.encode())
    except OSError:
        pass
    finally:
        os.close(fd)


def _nvrtc(lib: ctypes.CDLL, source: str, arch: str, name: str, strict: bool) -> str:
    prog = ctypes.c_void_p()
    _check(lib, lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None),
           "nvrtcCreateProgram")  # fmt: skip
    try:
        options = _options(arch)
        argv = (ctypes.c_char_p * len(options))(*(o.encode() for o in options))
        code = lib.nvrtcCompileProgram(prog, len(options), argv)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
        text = log.value.decode(errors="replace").strip()
        if code != 0:
            raise CudaCompileError(f"NVRTC could not compile {name} for {arch}:\n{text}")
        if text and strict:
            raise CudaCompileError(f"NVRTC warned while compiling {name} for {arch}:\n{text}")
        _check(lib, lib.nvrtcGetPTXSize(prog, ctypes.byref(size)), "nvrtcGetPTXSize")
        out = ctypes.create_string_buffer(size.value)
        _check(lib, lib.nvrtcGetPTX(prog, out), "nvrtcGetPTX")
        return out.value.decode()
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def _nvcc(source: str, arch: str, name: str, strict: bool) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / name, Path(tmp) / "out.ptx"
        src.write_text(source)
        run = subprocess.run(["nvcc", "-ptx", f"-arch=compute_{arch[3:]}", "-std=c++17", str(src), "-o", str(dst)],
                             capture_output=True, text=True)  # fmt: skip
        log = (run.stdout + run.stderr).strip()
        if run.returncode != 0:
            raise CudaCompileError(f"nvcc could not compile {name} for {arch}:\n{log}")
        if log and strict:
            raise CudaCompileError(f"nvcc warned while compiling {name} for {arch}:\n{log}")
        return dst.read_text()
