"""CUDA graphs of one stream through libcuda's own entry points (ctypes): PyCUDA (2026.1 and before) wraps no
stream capture, and the driver API needs no other dependency.

`StreamGraphs.capture(issue)` runs `issue` (which launches kernels, device copies and vendor library calls on the
stream) between `cuStreamBeginCapture_v2` and `cuStreamEndCapture`: nothing runs, the driver records it as a graph,
which `cuGraphInstantiateWithFlags` makes executable. `replay` is one `cuGraphLaunch` on the same stream. The
capture is thread-local: a synchronous call of this thread (a host copy, an allocation) while capturing is an error,
not a silent synchronisation, so what must stay outside the graph (the batch's upload) cannot slip in.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

from deepdsl.errors import DslProgramError

CAPTURE_MODE_THREAD_LOCAL = 1  # CU_STREAM_CAPTURE_MODE_THREAD_LOCAL


class CaptureFailed(Exception):
    """A step that could not be captured (its calls did not run; it runs call for call instead); the message says
    why, for the device line's "graph: off (why)"."""


class StreamGraphs:
    """The graphs captured from `stream` on the current context, kept until `close`."""

    def __init__(self, lib: ctypes.CDLL, stream: int):
        self.lib, self.stream = lib, ctypes.c_void_p(stream)
        p, pp = ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)
        lib.cuStreamBeginCapture_v2.argtypes = [p, ctypes.c_int]
        lib.cuStreamEndCapture.argtypes = [p, pp]
        lib.cuGraphInstantiateWithFlags.argtypes = [pp, p, ctypes.c_ulonglong]
        lib.cuGraphLaunch.argtypes = [p, p]
        lib.cuGraphExecDestroy.argtypes = [p]
        lib.cuGraphDestroy.argtypes = [p]
        lib.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        self.graphs: list[tuple[ctypes.c_void_p, ctypes.c_void_p]] = []  # (graph, its executable)

    def _error(self, status: int, call: str) -> str:
        name = ctypes.c_char_p()
        self.lib.cuGetErrorName(status, ctypes.byref(name))
        return f"{call}: {name.value.decode() if name.value else status}"

    def capture(self, issue: Callable[[], None]) -> ctypes.c_void_p:
        """The executable graph of what `issue` puts on the stream (none of it runs); CaptureFailed where the driver
        refuses a call while capturing, or the graph."""
        status = self.lib.cuStreamBeginCapture_v2(self.stream, CAPTURE_MODE_THREAD_LOCAL)
        if status:
            raise CaptureFailed(self._error(status, "cuStreamBeginCapture_v2"))
        graph = ctypes.c_void_p()
        try:
            issue()
        except Exception as err:  # a call refused while capturing: the capture ends (invalidated) before we go on
            self.lib.cuStreamEndCapture(self.stream, ctypes.byref(graph))
            if graph:
                self.lib.cuGraphDestroy(graph)
            raise CaptureFailed(f"the step did not capture: {err}") from err
        status = self.lib.cuStreamEndCapture(self.stream, ctypes.byref(graph))
        if status or not graph:
            raise CaptureFailed(self._error(status, "cuStreamEndCapture"))
        executable = ctypes.c_void_p()
        status = self.lib.cuGraphInstantiateWithFlags(ctypes.byref(executable), graph, 0)
        if status:
            self.lib.cuGraphDestroy(graph)
            raise CaptureFailed(self._error(status, "cuGraphInstantiateWithFlags"))
        self.graphs.append((graph, executable))
        return executable

    def replay(self, executable: ctypes.c_void_p) -> None:
        status = self.lib.cuGraphLaunch(executable, self.stream)
        if status:
            raise DslProgramError(f"--device cuda: {self._error(status, 'cuGraphLaunch')}")

    def close(self) -> None:
        for graph, executable in self.graphs:
            self.lib.cuGraphExecDestroy(executable)
            self.lib.cuGraphDestroy(graph)
        self.graphs.clear()


__all__ = ["CaptureFailed", "StreamGraphs"]
