"""Kernels and their launches as data: a kernel's text and launch shape (`Kernel`), each launch's grid, block,
shared memory and where each pointer argument lives (`Launch`: an arena offset from the plan, or a program tensor by
name), a plan's whole CUDA program (`CudaProgram`), the launch shapes of the hand-written library's calls, the
table of a multi-tensor launch, and the device limits every launch is checked against.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from deepdsl.ir.vendor import VendorCall
from deepdsl.ops.conv import OWN_TILE

BLOCK = 256  # threads per block of the element-wise and row kernels
TILE = 16  # the threads of a tiled kernel's block: TILE x TILE (library.cu dd_tiled)
TILE_M, TILE_N, TILE_K = OWN_TILE  # a tiled kernel's block tile: rows, columns, a step (DD_BM, DD_BN, DD_BK)
MAX_GRID = 1 << 16  # blocks of a grid-stride launch at most (its loop covers the rest)
VECTOR = 4  # floats in one vector load or store (float4)
VECTOR_ALIGN = 16  # bytes: the alignment a float4 access needs (every planned buffer has ALIGN, memory/plan.py)
SEGMENT_BLOCKS = 1024  # blocks of one segment of a multi-tensor launch at most (its loop covers the rest)
MAX_THREADS = 1024  # device limits the launches are checked against
MAX_STATIC_SMEM = 48 * 1024
GRID_LIMITS = (2**31 - 1, 65535, 65535)
BLOCK_SMEM = 32 * 4  # dd_block_sum / dd_block_max: one float per warp
GEMM_SMEM = 2 * TILE_K * (TILE_M + 4 + TILE_N + 4) * 4  # dd_tiled's two buffers of A's and B's tiles (padded rows)
SPLIT_SMEM = 1024 * 8 + 4  # dd_block_sum_double: one double per thread; dd_last_block: its flag (a bool, padded)


@dataclass(frozen=True)
class Arg:
    """A pointer argument: an arena region (byte offset from the plan) or a program tensor by name."""

    value: str  # the IR value passed
    storage: str  # "arena" or "tensor" (an input, parameter or state tensor, which lives outside the arena)
    name: str  # the tensor's name (storage "tensor"), else the value whose buffer holds it (a view's base)
    offset: int  # byte offset in the arena (0 for a tensor)
    ctype: str  # "float" or "long long"


@dataclass(frozen=True)
class Launch:
    kernel: str
    stmt: str  # the statement's result value
    op: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int  # dynamic shared memory (0: the kernels use static shared memory only)
    static_smem: int  # bytes of static shared memory the kernel declares
    args: tuple[Arg, ...]  # the output first
    covers: int  # output elements the kernel's loops write, by construction
    loop: str  # "grid-stride" (threads over elements), "block-stride" (blocks over rows), "one-block", "tiles"
    tiles: tuple[int, int, int] = (0, 0, 0)  # loop "tiles": (N, M, batch) of the GEMM
    also: tuple[str, ...] = ()  # the other statements the kernel computes (ir/groups.py); their results follow the
    # first output among the arguments
    vendor: VendorCall | None = None  # the vendor routine that may run instead, on the same arguments (ir/vendor.py)
    # a multi-tensor launch (loop "multi-tensor", ir/launches.py): per segment (first block, blocks, elements, kind,
    # pointers), in order; `args` holds every segment's pointers one after the other, and the kernel takes one
    # argument instead, a table the runner fills once (`multi_table`): the segment count, then a row of `width`
    # 64-bit numbers per segment, its table entries then its pointers
    table: tuple[tuple[int, int, int, int, int], ...] = ()
    width: int = 0
    finishes: bool = False  # the finishing launch of the statement's own kernel: none where a vendor routine serves it


@dataclass(frozen=True)
class CudaProgram:
    source: str  # the translation unit
    kernels: tuple[str, ...]  # kernel names, in launch order
    launches: tuple[Launch, ...]  # in program order
    body: str = ""  # the program's kernels alone (source without the library)
    # after the launches: (result, tensor, bytes) for each update not computed in place, copied into its tensor
    copies: tuple[tuple[Arg, str, int], ...] = ()
    results: tuple[tuple[str, Arg], ...] = ()  # the program's outputs (loss, predict, ...) and where they are


@dataclass(frozen=True)
class Kernel:
    """A kernel's text and how to launch it (its arguments are filled in by the caller)."""

    text: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    static_smem: int
    covers: int
    loop: str
    tiles: tuple[int, int, int] = (0, 0, 0)
    # bytes of the statement's planned workspace the kernel takes as its last argument (float* ws); `finish`, a kernel
    # launched after it on (out, ws) (the filter gradient's split reduction: its partial sums, then their sum)
    scratch: int = 0
    finish: Kernel | None = None
    # an element-wise kernel's float4 loop: its only one, or a shape-generic kernel's beside its scalar loop, taken at
    # run time where the size is a multiple of 4 and the pointers it reads four at a time are 16-byte aligned
    float4: bool = False


def grid_for(n: int, block: int) -> int:
    return max(1, min(MAX_GRID, -(-n // block)))


def segment_blocks(n: int) -> int:
    """The blocks one segment of `n` elements gets in a multi-tensor launch."""
    return max(1, min(SEGMENT_BLOCKS, -(-n // BLOCK)))


def multi_table(launch: Launch, pointers: Sequence[int]) -> np.ndarray:
    """The table a multi-tensor launch's kernel reads (multi_kernel), with the device addresses of its arguments
    (`pointers`, in the order of `launch.args`)."""
    t = np.zeros(1 + len(launch.table) * launch.width, np.int64)
    t[0] = len(launch.table)
    at = 0
    for k, (first, blocks, n, kind, count) in enumerate(launch.table):
        row = 1 + k * launch.width
        t[row : row + 4] = (first, blocks, n, kind)
        t[row + 4 : row + 4 + count] = np.array(pointers[at : at + count], np.uint64).view(np.int64)
        at += count
    return t


def check_size(name: str, *sizes: int) -> None:
    if max(sizes, default=0) >= 2**31:
        raise ValueError(
            f"kernel {name}: a tensor of {max(sizes)} elements is beyond the 32-bit indices of the kernels"
        )


def elementwise_launch(n: int) -> dict[str, Any]:
    """The launch of a grid-stride loop over `n` elements, one thread an element."""
    return {"grid": (grid_for(n, BLOCK), 1, 1), "block": (BLOCK, 1, 1), "static_smem": 0, "covers": n,
            "loop": "grid-stride"}  # fmt: skip


def row_launch(rows: int, covers: int) -> dict[str, Any]:
    """The launch of a block-stride loop: one block a row, its threads sharing the row (`covers` elements in all)."""
    return {"grid": (grid_for(rows, 1), 1, 1), "block": (BLOCK, 1, 1), "static_smem": BLOCK_SMEM, "covers": covers,
            "loop": "block-stride"}  # fmt: skip


def one_block_launch(covers: int) -> dict[str, Any]:
    """The launch of one block that covers all `covers` elements."""
    return {"grid": (1, 1, 1), "block": (BLOCK, 1, 1), "static_smem": BLOCK_SMEM, "covers": covers, "loop": "one-block"}


def c_ints(*xs: Any) -> str:
    """Integers as a C argument list: `2, 3, 4`."""
    return ", ".join(str(int(x)) for x in xs)
