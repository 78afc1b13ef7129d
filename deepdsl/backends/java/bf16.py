"""--precision bf16 in the Java program: the library entry points (cuda/entries.cu) its library calls launch with
bf16 pointers. entries.cu's kernels take float pointers and call library.cu's functions, which are templated on
each pointer's storage; a bf16 program's Name.cu adds, for each library call that passes a bf16 value, the entry it
launches with those pointers `dd_bf16*`, named after its pointers' types (`dd_k_max_pool2d_hh`: both bf16), from
entries.cu's own text (no second copy of an entry). The CUDA device launches `NAME_CODES` where any tensor it passes
is bf16 (CudaMemory.launch): one letter per tensor of the launch, `h` bf16, `f` anything else."""

from __future__ import annotations

import re
from collections.abc import Iterable

from deepdsl.errors import DslProgramError
from deepdsl.ir import REGISTRY, Stmt
from deepdsl.ir.analysis import index_form
from deepdsl.ir.types import DType
from deepdsl.memory import Plan

# each library op's entries as the CUDA device launches them (runtime/CudaLibrary.java, CudaConvolution.java): the
# entry and how many tensors it passes, the first of the statement's (its output, then the call's tensors in order)
ENTRIES: dict[str, tuple[tuple[str, int], ...]] = {
    "conv2d": (("dd_k_conv2d", 3),),
    "conv2d_backward_data": (("dd_k_conv2d_backward_data", 3),),
    "conv2d_backward_filter": (("dd_k_conv2d_backward_filter", 3), ("dd_k_conv2d_backward_filter_finish", 1)),
    "linear": (("dd_k_gemm", 3),),
    "matmul": (("dd_k_gemm", 3),),
    "batch_matmul": (("dd_k_gemm", 3),),
    "max_pool2d": (("dd_k_max_pool2d", 2),),
    "max_pool2d_backward": (("dd_k_max_pool2d_backward", 4),),
    "avg_pool2d": (("dd_k_avg_pool2d", 2),),
    "avg_pool2d_backward": (("dd_k_avg_pool2d_backward", 2),),
    "softmax": (("dd_k_softmax", 2),),
    "log_softmax": (("dd_k_softmax", 2),),
    "softmax_backward": (("dd_k_softmax_backward", 3),),
    "log_softmax_backward": (("dd_k_softmax_backward", 3),),
    "masked_softmax": (("dd_k_masked_softmax", 2),),
    "softmax_cross_entropy": (("dd_k_softmax_cross_entropy", 3),),
    "softmax_cross_entropy_backward": (("dd_k_softmax_cross_entropy_backward", 4),),
    "cross_entropy": (("dd_k_cross_entropy", 3),),
    "cross_entropy_backward": (("dd_k_cross_entropy_backward", 4),),
    "argmax": (("dd_k_argmax", 2),),
    "accuracy": (("dd_k_accuracy", 3),),
    "lrn": (("dd_k_lrn", 2),),
    "lrn_backward": (("dd_k_lrn_backward", 4),),
    "layer_norm_rows": (("dd_k_layer_norm_rows", 2),),
    "layer_norm_rows_backward": (("dd_k_layer_norm_rows_backward", 3),),
    "bn_train_apply": (("dd_k_bn_apply", 6),),
    "bn_train_backward": (("dd_k_bn_train_backward", 8),),
    "dropout_mask": (("dd_k_dropout_mask", 1),),
    "random_normal": (("dd_k_random_normal", 1),),
    "random_uniform": (("dd_k_random_uniform", 1),),
}

_ENTRY = re.compile(r'extern "C" __global__ void (\w+)\(([^)]*)\) \{(.*?)\}\n', re.S)


def code(dtype: DType) -> str:
    """A tensor's letter in a typed entry's name: `h` bf16, `f` anything else (float32, int64)."""
    return "h" if dtype is DType.BF16 else "f"


def typed_entry(source: str, name: str, codes: str) -> str:
    """Entry `name` of entries.cu `source` with its first pointers typed as `codes` says (`h`: `dd_bf16*`), named
    `name_codes`."""
    found = {m.group(1): m for m in _ENTRY.finditer(source)}
    m = found[name]
    params = [p.strip() for p in m.group(2).replace("\n", " ").split(",")]
    for k, c in enumerate(codes):
        if c == "h":
            if not re.fullmatch(r"(const )?float\* \w+", params[k]):
                raise ValueError(f"{name}: parameter {k} ({params[k]}) is no float pointer")
            params[k] = params[k].replace("float*", "dd_bf16*")
    return f'extern "C" __global__ void {name}_{codes}({", ".join(params)}) {{{m.group(3)}}}\n'


def _tensors(s: Stmt, counters: frozenset[str]) -> list[DType]:
    """The element types of the tensors a library call of `s` passes: its output, then its inputs (the step
    counter is a number), an epilogue's inputs left out (its own kernel reads them)."""
    op = REGISTRY[s.op]
    arity = op.arity if op.arity is not None and "epilogue" in s.a else len(s.inputs)
    return [s.out.type.dtype, *(v.type.dtype for v in s.inputs[:arity] if v.name not in counters)]


def _library_call(s: Stmt) -> bool:
    """Whether the Java program runs `s` as a call of the device's library (calls.py `statement`), not a kernel."""
    op = REGISTRY[s.op]
    if op.java is None or op.view:
        return False
    return op.java.called or index_form(s) is None and op.cuda_form is None


def entries(source: str, plans: Iterable[Plan]) -> str:
    """The typed entries (`typed_entry`) the library calls of `plans` launch with a bf16 tensor; "" where none does.
    A library call passing bf16 that no entry here takes is a DslProgramError naming the op."""
    wanted: dict[str, None] = {}
    for p in plans:
        counters = frozenset(d.value.name for d in p.graph.inputs if d.kind in ("step", "offset"))
        for s in p.graph.stmts:
            if s.op == "allreduce_start" and any(v.type.dtype is DType.BF16 for v in s.inputs):
                # data parallelism: a bf16 gradient packed, widened, into its float32 bucket (CudaMemory.pack)
                wanted[typed_entry(source, "dd_k_dp_pack", "fhf")] = None
                continue
            types = _tensors(s, counters)
            if DType.BF16 not in types or not _library_call(s):
                continue
            if s.op not in ENTRIES:
                raise DslProgramError(
                    f"--precision bf16: the Java CUDA device has no bf16 form of {s.op} (%{s.out.name}); "
                    "`deepdsl run --precision bf16 --device cuda` runs it"
                )
            codes = "".join(map(code, types))
            for name, n in ENTRIES[s.op]:
                if "h" in codes[:n]:
                    wanted[typed_entry(source, name, codes[:n])] = None
    return "".join(f"\n{text}" for text in wanted)
