"""The sizes of a shape-generic kernel as names, shared by the Java and the CUDA kernel printers.

A kernel written with these names serves every statement whose kernel text is the same, whatever its sizes:
dim j of the output is `no{j}`, dim j of input k is `n{k}_{j}`, their row-major strides `sto{j}` and `st{k}_{j}`
(locals the kernel computes from the dims). A reduction's range is named after the input dim it runs over where
it runs over all of one (`sum[r0:64] in0[r0, i0]` runs to `n0_0`), else it stays a number (a pooling window).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from deepdsl.ir.indexexpr import IE, Affine, reads


@dataclass(frozen=True)
class Sizes:
    out: tuple[int, ...]  # the output's shape
    shapes: tuple[tuple[int, ...], ...]  # the inputs' shapes

    @staticmethod
    def out_dim(j: int) -> str:
        return f"no{j}"

    @staticmethod
    def dim(k: int, j: int) -> str:
        return f"n{k}_{j}"

    def out_stride(self, j: int) -> str:
        return "1" if j == len(self.out) - 1 else f"sto{j}"

    def stride(self, k: int, j: int) -> str:
        return "1" if j == len(self.shapes[k]) - 1 else f"st{k}_{j}"

    def range_of(self, var: str, size: int, body: IE) -> str:
        """The name of a reduction variable's range: the input dim `var` runs over in `body`, else the number."""
        for r in reads(body):
            for j, a in enumerate(r.index):
                if a.plain_var == var and r.input < len(self.shapes):
                    if self.shapes[r.input][j] == size:
                        return self.dim(r.input, j)
        return str(size)

    def offset(self, k: int, index: tuple[Affine, ...], names: dict[str, str]) -> str:
        """The element offset of input k at `index`: each axis's index times its stride."""
        parts = []
        for j, a in enumerate(index):
            text = a.render(names)
            if text == "0":
                continue
            stride = self.stride(k, j)
            simple = re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*|\d+", text) is not None or _grouped(text)
            parts.append(text if stride == "1" else f"{text if simple else '(' + text + ')'} * {stride}")
        return " + ".join(parts) or "0"

    def locals(self, text: str) -> list[tuple[str, str]]:
        """(name, value) of each stride (and the dims the strides use) that `text` needs, in order."""
        out: list[tuple[str, str]] = []
        for j in range(len(self.out) - 1):
            name = self.out_stride(j)
            if re.search(rf"\b{name}\b", text):
                out.append((name, " * ".join(self.out_dim(m) for m in range(j + 1, len(self.out)))))
        for k, shape in enumerate(self.shapes):
            for j in range(len(shape) - 1):
                name = self.stride(k, j)
                if re.search(rf"\b{name}\b", text):
                    out.append((name, " * ".join(self.dim(k, m) for m in range(j + 1, len(shape)))))
        return out

    def dims_used(self, text: str) -> list[tuple[str, int, int]]:
        """(name, buffer, axis) of each dim `text` reads (buffer -1: the output), in order."""
        out = [(self.out_dim(j), -1, j) for j in range(len(self.out))]
        out += [(self.dim(k, j), k, j) for k, shape in enumerate(self.shapes) for j in range(len(shape))]
        return [d for d in out if re.search(rf"\b{d[0]}\b", text)]

    def all_dims(self) -> list[str]:
        """Every dim, the output's then each input's: the size arguments of a CUDA kernel."""
        return [self.out_dim(j) for j in range(len(self.out))] + [
            self.dim(k, j) for k, shape in enumerate(self.shapes) for j in range(len(shape))
        ]


def _grouped(text: str) -> bool:
    """Whether `text` is one parenthesised group, `(r2 + 1)` (not `(a) + (b)`)."""
    if not text.startswith("("):
        return False
    depth = 0
    for k, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0:
            return k == len(text) - 1
    return False
