"""The PyCUDA driver's CUDA graphs (backends/cuda/graphs.py: libcuda's stream capture through ctypes) against the
stand-in driver fake_libcuda.c, built under a soname of its own so that it never stands in for a real libcuda.so.1
in this process: a captured device copy runs at each replay and not at the capture, a failed capture ends the
stream's capture and says why."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from deepdsl.backends.cuda.graphs import CaptureFailed, StreamGraphs

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="no gcc")


@pytest.fixture(scope="module")
def libcuda(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    out = tmp_path_factory.mktemp("cuda") / "libfakecuda_graphs.so"
    c = Path(__file__).with_name("fake_libcuda.c")
    subprocess.run(["gcc", "-O1", "-shared", "-fPIC", "-Wl,-soname,libfakecuda_graphs.so", "-o", str(out), str(c),
                    "-ldl"], check=True)  # fmt: skip
    return ctypes.CDLL(str(out))


def _stream(lib: ctypes.CDLL) -> int:
    stream = ctypes.c_void_p()
    assert lib.cuStreamCreate(ctypes.byref(stream), 0) == 0
    return int(stream.value or 0)


def test_a_captured_copy_runs_at_each_replay_and_not_before(libcuda: ctypes.CDLL) -> None:
    stream = _stream(libcuda)
    graphs = StreamGraphs(libcuda, stream)
    src, dst = np.arange(4, dtype=np.float32), np.zeros(4, np.float32)
    copy = libcuda.cuMemcpyDtoDAsync_v2
    copy.argtypes = [ctypes.c_ulonglong, ctypes.c_ulonglong, ctypes.c_size_t, ctypes.c_void_p]
    graph = graphs.capture(lambda: copy(dst.ctypes.data, src.ctypes.data, src.nbytes, stream))
    assert (dst == 0).all()  # recorded, not run
    graphs.replay(graph)
    np.testing.assert_array_equal(dst, src)
    src += 10
    graphs.replay(graph)  # the graph reads the source where it is, at each replay
    np.testing.assert_array_equal(dst, src)
    graphs.close()
    assert graphs.graphs == []


def test_a_failed_capture_ends_the_capture_and_says_why(libcuda: ctypes.CDLL) -> None:
    stream = _stream(libcuda)
    graphs = StreamGraphs(libcuda, stream)

    def refused() -> None:
        raise RuntimeError("a host copy while capturing")

    with pytest.raises(CaptureFailed, match="the step did not capture: a host copy while capturing"):
        graphs.capture(refused)
    assert graphs.graphs == []
    graphs.capture(lambda: None)  # the stream captures again: the failed capture was ended
    with pytest.raises(CaptureFailed, match="cuStreamBeginCapture_v2: CUDA_ERROR_FAKE"):
        StreamGraphs(libcuda, 0).capture(lambda: None)  # the legacy stream cannot capture
    graphs.close()
