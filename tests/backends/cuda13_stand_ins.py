"""Stand-ins for the CUDA 13 libraries that JavaCPP's CUDA presets link (org.bytedeco:cuda:13.1-9.19-1.5.13), for
the Java CUDA device's vendor path on machines without a GPU (tests/backends/test_java_cuda.py, and the dry run of
scripts/gpu_check.sh). `readelf -d -V` on the presets' libjnicudart.so and libjnicublas.so shows what they need:
the sonames libcudart.so.13, libcublas.so.13 and libcublasLt.so.13, and each symbol in a version node of that name.
The stand-ins carry that node (a linker version script), as the real libraries do. glibc would take a library with
no version nodes at all too (it checks versions only against a library that defines some; tried), but one whose
symbols are in another node loads and then kills the JVM at the first call (`symbol lookup error: ... undefined
symbol: cublasCreate_v2, version libcublas.so.13`; tried). The functions are bound lazily, so only those called
must exist."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

CUDA13 = ("libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13")  # in the order the loader misses them
# the stand-ins beside fake_libcublas.c: JavaCPP's loading needs their sonames; nothing of them is called
STAND_INS = {
    "libcudart.so.13": "int cudaRuntimeGetVersion(int *v) { *v = 13010; return 0; }\n",
    "libcublasLt.so.13": "#include <stddef.h>\nsize_t cublasLtGetVersion(void) { return 130000; }\n",
}


def fake_cuda13(folder: Path, libraries: Sequence[str] = CUDA13) -> Path:
    """The CUDA 13 libraries JavaCPP's presets link (`readelf -d -V` on libjnicudart.so and libjnicublas.so: each
    NEEDED soname, and its symbols in a version node named after it) as stand-ins in `folder`: fake_libcublas.c as
    libcublas.so.13, the two others (libcudart.so.13, libcublasLt.so.13) loaded, never called; returns `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    for soname in libraries:
        script = folder / f"{soname}.map"
        script.write_text(f"{soname} {{ global: *; }};\n")
        if soname in STAND_INS:
            source = folder / f"{soname}.c"
            source.write_text(STAND_INS[soname])
            flags = []
        else:
            source, flags = Path(__file__).with_name("fake_libcublas.c"), ["-DFAKE_CUBLAS_VERSION=130000"]
        link = [f"-Wl,-soname,{soname}", f"-Wl,--version-script={script}"]
        subprocess.run(["gcc", "-O2", "-shared", "-fPIC", *flags, *link, "-o", str(folder / soname), str(source)],
                       check=True)  # fmt: skip
    return folder
