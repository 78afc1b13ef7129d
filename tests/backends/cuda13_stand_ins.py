"""Stand-ins for the CUDA 13 libraries that JavaCPP's CUDA presets link (org.bytedeco:cuda:13.1-9.19-1.5.13), for
the Java CUDA device's vendor path on machines without a GPU (tests/backends/test_java_cuda.py, and the dry run of
scripts/gpu_check.sh). `readelf -d -V` on the presets' libjnicudart.so and libjnicublas.so shows what they need:
the sonames libcudart.so.13, libcublas.so.13 and libcublasLt.so.13, and each symbol in a version node of that name.
The stand-ins carry that node (a linker version script), as the real libraries do. glibc would take a library with
no version nodes at all too (it checks versions only against a library that defines some; tried), but one whose
symbols are in another node loads and then kills the JVM at the first call (`symbol lookup error: ... undefined
symbol: cublasCreate_v2, version libcublas.so.13`; tried). The functions are bound lazily, so only those called
must exist.

cuDNN 9 (`fake_cudnn9`): the presets' libjnicudnn.so NEEDs libcudnn_graph.so.9, libcudnn_ops.so.9, libcudnn_cnn.so.9
and libcudnn_adv.so.9 and takes each symbol from the version node of one of them (`readelf -V`, `nm -D`: the handle
calls from libcudnn_graph, the convolution (and Find) calls from libcudnn_cnn, tensor, filter, pooling, softmax, LRN
and batch-norm calls from libcudnn_ops). glibc looks a versioned symbol up in the library whose soname the version
need names, not in any library that defines a node of that name (one library defining all four nodes loads, then
kills the JVM at the first call: `undefined symbol: cudnnCreate, version libcudnn_graph.so.9`; tried). So
fake_libcudnn.c is built three times, as libcudnn_graph.so.9, libcudnn_ops.so.9 and libcudnn_cnn.so.9, each
exporting its calls alone in its node; libcudnn_adv.so.9 (nothing of it called) and libcudnn.so.9 (which the preset
loads too) are empty stand-ins. The copies share no state but the structures the calls pass between them (handle,
descriptors, same layout); the convolutions, and so their count ($FAKE_CUDNN_CALLS, written by the libcudnn_cnn copy
alone), are libcudnn_cnn's; the pooling, softmax, LRN and batch-norm calls, and their count by call
($FAKE_CUDNN_OPS_CALLS), libcudnn_ops's."""

from __future__ import annotations

import fnmatch
import subprocess
from collections.abc import Sequence
from pathlib import Path

from built_once import in_folder, text_of

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
    cublas = Path(__file__).with_name("fake_libcublas.c")

    def make(into: Path) -> None:
        for soname in libraries:
            script = into / f"{soname}.map"
            script.write_text(f"{soname} {{ global: *; }};\n")
            if soname in STAND_INS:
                source = into / f"{soname}.c"
                source.write_text(STAND_INS[soname])
                flags = []
            else:
                source, flags = cublas, ["-DFAKE_CUBLAS_VERSION=130000"]
            link = [f"-Wl,-soname,{soname}", f"-Wl,--version-script={script}"]
            subprocess.run(["gcc", "-O2", "-shared", "-fPIC", *flags, *link, "-o", str(into / soname), str(source)],
                           check=True)  # fmt: skip

    # gcc once a run for these libraries (built_once.py; the files are the same wherever they are built)
    return in_folder(f"fake_cuda13\0{list(libraries)}\0{STAND_INS}\0{text_of(cublas)}", folder, make)


# the calls of fake_libcudnn.c that libjnicudnn.so takes from libcudnn_graph.so.9 and libcudnn_cnn.so.9; the others
# (tensor, filter, pooling, softmax, LRN) from libcudnn_ops.so.9
GRAPH = ("cudnnCreate", "cudnnDestroy", "cudnnSetStream", "cudnnGetVersion", "cudnnGetErrorString")
CNN = ("cudnnConvolution*", "cudnnCreateConvolutionDescriptor", "cudnnDestroyConvolutionDescriptor",
       "cudnnSetConvolution*", "cudnnGetConvolution*", "cudnnFindConvolution*")  # fmt: skip


def fake_cudnn9(folder: Path) -> Path:
    """cuDNN 9 as JavaCPP's libjnicudnn.so links it (see the module's note) in `folder`; returns `folder`."""
    main = Path(__file__).with_name("fake_libcudnn.c")
    # fake_libcudnn.c built four times (about 4 s): once a run (built_once.py; the files are the same wherever built)
    return in_folder(f"fake_cudnn9\0{GRAPH}\0{CNN}\0{text_of(main)}", folder, lambda into: _build_cudnn9(into, main))


def _build_cudnn9(folder: Path, main: Path) -> None:
    plain = folder / "plain.so"  # its symbols, to name each in its library's node
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(plain), str(main), "-lm"], check=True)
    listed = subprocess.run(["nm", "-D", "--defined-only", str(plain)], capture_output=True, text=True, check=True)
    plain.unlink()
    nodes: dict[str, list[str]] = {"libcudnn_graph.so.9": [], "libcudnn_cnn.so.9": [], "libcudnn_ops.so.9": []}
    for symbol in sorted(line.split()[-1] for line in listed.stdout.splitlines() if " T " in line):
        graph, cnn = symbol in GRAPH, any(fnmatch.fnmatchcase(symbol, p) for p in CNN)
        nodes["libcudnn_graph.so.9" if graph else "libcudnn_cnn.so.9" if cnn else "libcudnn_ops.so.9"].append(symbol)
    for soname, symbols in nodes.items():
        script = folder / f"{soname}.map"
        script.write_text(f"{soname} {{ global: {''.join(f'{x}; ' for x in symbols)}local: *; }};\n")
        flags = {"libcudnn_cnn.so.9": ["-DFAKE_CUDNN_WRITES_CALLS"], "libcudnn_ops.so.9": ["-DFAKE_CUDNN_WRITES_OPS"]}
        flags = flags.get(soname, [])
        subprocess.run(["gcc", "-O2", "-shared", "-fPIC", *flags, f"-Wl,-soname,{soname}",
                        f"-Wl,--version-script={script}", "-o", str(folder / soname), str(main), "-lm"],
                       check=True)  # fmt: skip
    for soname in ("libcudnn_adv.so.9", "libcudnn.so.9"):
        stub, script = folder / f"{soname}.c", folder / f"{soname}.map"
        stub.write_text(f"int fake_{soname.split('.so')[0].removeprefix('lib')}_present(void) {{ return 1; }}\n")
        script.write_text(f"{soname} {{ global: *; }};\n")
        subprocess.run(["gcc", "-O2", "-shared", "-fPIC", f"-Wl,-soname,{soname}", f"-Wl,--version-script={script}",
                        "-o", str(folder / soname), str(stub)], check=True)  # fmt: skip
