"""The op registry: one `OpDef` per op holds everything the op means.

An op's module registers its shape rule with `defop` (with the op's yes/no facts: element-wise, a view,
differentiable, cheap to recompute, accepts an epilogue, inlined into its readers), then attaches the other
aspects to the same entry with `numpy_kernel`, `vjp_rule`, `flops_rule`, `lowering`, `java_call`, ... Backends
and passes read entries; they never keep per-op tables of their own. The CUDA fields are the one aspect filled
from outside `deepdsl/ops/`: they are C-writing code that lives with the CUDA backend (backends/cuda/ops.py).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from deepdsl.errors import did_you_mean
from deepdsl.ir.types import TensorType

ShapeRule = Callable[[tuple[TensorType, ...], dict[str, Any]], TensorType]
# (input arrays, attrs) -> output array, in the inputs' float precision
NumpyKernel = Callable[[tuple[Any, ...], dict[str, Any]], Any]
# (builder, the statement, the gradient of its output) -> one gradient Value (or None) per input
VjpRule = Callable[[Any, Any, Any], tuple[Any, ...]]
# (input types, output type, attrs) -> floating-point operations
FlopsRule = Callable[[tuple[TensorType, ...], TensorType, dict[str, Any]], int]
# (input types, output type, attrs) -> the op as an index expression over the output's indices i0, i1, ...
IndexFormRule = Callable[[tuple[TensorType, ...], TensorType, dict[str, Any]], Any]
# (builder, the statement, autodiff.LowerContext) -> the Value that replaces the statement's output
LowerRule = Callable[[Any, Any, Any], Any]
# (kernel name, the statement, its inputs' C types) -> the CUDA kernel calling library.cu (backends/cuda/ops.py)
CudaRule = Callable[[str, Any, tuple[str, ...]], Any]
# (the statement) -> (index expression, output indices): a shape op as the CUDA backend writes it
CudaForm = Callable[[Any], Any]
# (input types, attrs) -> whether recomputing this statement is worth it (a fact that depends on the shapes)
CheapRule = Callable[[tuple[TensorType, ...], dict[str, Any]], bool]
# (input types, output type, attrs) -> bytes of scratch the op's kernel needs while it runs
WorkspaceRule = Callable[[tuple[TensorType, ...], TensorType, dict[str, Any]], int]
# (input types, output type, attrs) -> the vendor routine that computes the statement (ir/vendor.py), or None
VendorRule = Callable[[tuple[TensorType, ...], TensorType, dict[str, Any]], Any]
# (attrs) -> the storage kind under --precision bf16 of a statement whose attributes decide it (OpDef.storage)
StorageRule = Callable[[dict[str, Any]], str]


@dataclass(frozen=True)
class Saves:
    """What an eager autograd framework (PyTorch) keeps of an op for its backward pass (the eager baseline).

    `which` names kept values: input positions and "out"; `extra` gives the bytes of what it keeps besides
    (max-pool indices, batch-norm statistics, a dropout mask) from (input types, output type, attrs).
    """

    which: tuple[int | str, ...] = ()
    extra: Callable[[tuple[TensorType, ...], TensorType, dict[str, Any]], int] | None = None


@dataclass(frozen=True)
class JavaCall:
    """How the Java program calls the op: the step calls `dev.<device>(out, ...)` (a method of the runtime's
    Device), which the CPU device runs as `cls.<op name>(out, params...)`: `cls` is the family class that does the
    work (`CpuGemm`, `CpuConvolution`, `CpuPooling`, `CpuNormalisation`, `CpuLosses`, `CpuShapes`, `CpuAttention`,
    `Rng` for the dropout mask, `Workspace` for conv2d's im2col-or-direct choice), with no forwarding class
    between them.

    `params` are the Java method's parameters after the output, as (type, name): `Buf` (one per input, in
    order), or one `Buf[]` holding every input (concat), then the attributes, each named as its attribute in
    camelCase (`in_shape` is `inShape`); `long step` is the iteration counter and `long limit` the program's
    workspace limit. `keys` gives, for each attribute parameter in order, the statement attribute it passes.
    tests/ops/test_registry_complete.py checks them against the runtime's Java sources.
    """

    cls: str
    params: tuple[tuple[str, str], ...]
    device: str = ""  # the Device method the generated step calls (java_call sets it)
    keys: tuple[str, ...] = ()  # the statement attribute of each attribute parameter (java_call sets them)
    # the step calls the Device method even where the op has a CUDA form the backends would write as a kernel
    # (avg_pool2d: the CUDA device sends it to cuDNN, our kernel where it cannot)
    called: bool = False
    # the Device method takes, last, the statement's planned workspace (`Buf workspace`, in the arena; null where
    # the plan gave it none), which the CPU class's method does not: conv2d_backward_filter's partial sums
    workspace: bool = False

    @property
    def inputs_as_array(self) -> bool:
        return any(t == "Buf[]" for t, _ in self.params)

    @property
    def attributes(self) -> tuple[tuple[str, str], ...]:
        return tuple((t, n) for t, n in self.params if t not in ("Buf", "Buf[]"))


@dataclass(frozen=True)
class OpDef:
    name: str
    shape: ShapeRule
    arity: int | None  # number of inputs, None for variadic (concat, indexed)
    doc: str = ""
    elementwise: bool = False
    view: bool = False  # the output aliases its input (flatten/reshape): no kernel, no copy
    # True: recomputing it costs about one pass over its output (element-wise work, a view, a dropout mask, a row
    # softmax), so memory/remat.py recomputes it for each backward reader rather than keep it alive across the
    # forward pass. A CheapRule: worth recomputing (once, shared by its readers) where the rule says so for the
    # statement's shapes (a batched GEMM whose output outweighs its operands: attention's scores)
    cheap_to_recompute: bool | CheapRule = False
    # a library kernel whose result an element-wise statement may follow inside the same call (passes/fuse.py)
    accepts_epilogue: bool = False
    # so cheap (a broadcast, a constant) that each element-wise reader recomputes it instead of reading a buffer
    inline_into_readers: bool = False
    numpy: NumpyKernel | None = None
    vjp: VjpRule | None = None
    flops: FlopsRule | None = None
    lower: LowerRule | None = None  # ops the train/infer programs rewrite into others (batch_norm, dropout)
    differentiable: bool = True  # False for ops whose output carries no gradient (argmax, accuracy)
    # a loss over (scores [N, K], class ids [N]): a network whose loss is one reports test accuracy (trainer.py)
    classifies: bool = False
    index_form: IndexFormRule | None = None  # element-wise ops and simple reductions: what fusion composes
    workspace: WorkspaceRule | None = None  # scratch beyond the output (an im2col matrix); None: none
    numpy_ws: Callable[..., Any] | None = None  # (inputs, attrs, workspace uint8 array) -> output, using it
    saves: Saves | None = None  # what eager autograd keeps of the op (memcheck's eager baseline); None: nothing
    cuda: CudaRule | None = None  # the CUDA kernel of an op without an index form (set by deepdsl.backends.cuda)
    cuda_form: CudaForm | None = None  # or its index expression, written by the CUDA backend only
    java: JavaCall | None = None  # the runtime call of an op without an index form (deepdsl/runtime/*.java)
    vendor: VendorRule | None = None  # the vendor library routine that may replace the op's own kernel (ir/vendor.py)
    # (input, value) where the op's value or slope jumps (ReLU's 0 in its input): the oracles sample these points
    kinks: tuple[tuple[int, float], ...] = ()
    # under --precision bf16 (passes/precision.py), how the op stores its result: "bf16" (operands rounded to bf16,
    # the result bf16, accumulated in fp32: GEMMs and convolutions), "bf16_out" (computes in fp32 from its inputs
    # as they are, stores bf16: element-wise chains, pooling), "fp32" (reductions, statistics, softmax, losses, the
    # optimiser) or "follow" (its first input's type: views, copies). "": derived, `follow` for a view, `bf16_out`
    # for an element-wise op, else `fp32` (the safe side); or a rule of the statement's attributes (a fused
    # statement: bf16_out unless its body reduces); `storage` gives it
    storage: str | StorageRule = ""

    def stores(self, attrs: dict[str, Any] | None = None) -> str:
        """The op's storage fact under bf16 (see `storage`) for a statement with `attrs`, derived where it gives
        none."""
        if callable(self.storage):
            return self.storage(attrs or {})
        return self.storage or ("follow" if self.view else "bf16_out" if self.elementwise else "fp32")


REGISTRY: dict[str, OpDef] = {}


def defop(
    name: str,
    arity: int | None = 1,
    *,
    doc: str = "",
    elementwise: bool = False,
    view: bool = False,
    differentiable: bool = True,
    cheap_to_recompute: bool | CheapRule = False,
    accepts_epilogue: bool = False,
    inline_into_readers: bool = False,
    classifies: bool = False,
) -> Callable[[ShapeRule], ShapeRule]:
    """Register `fn` as the shape rule of op `name`; `doc` (else the rule's docstring) describes the op."""

    def register(fn: ShapeRule) -> ShapeRule:
        assert name not in REGISTRY, f"op {name} registered twice"
        description = doc or (fn.__doc__ or "").strip()
        REGISTRY[name] = OpDef(
            name, fn, arity, description, elementwise, view,
            cheap_to_recompute=cheap_to_recompute, accepts_epilogue=accepts_epilogue,
            inline_into_readers=inline_into_readers, differentiable=differentiable, classifies=classifies,
        )  # fmt: skip
        return fn

    return register


def _attach(name: str, field: str) -> Callable[[Callable], Callable]:
    def register(fn: Callable) -> Callable:
        entry = REGISTRY[name]
        assert getattr(entry, field) is None, f"op {name}: {field} given twice"
        REGISTRY[name] = dataclasses.replace(entry, **{field: fn})
        return fn

    return register


STORAGE = ("bf16", "bf16_out", "fp32", "follow")


def storage(kind: str | StorageRule, *names: str) -> None:
    """The bf16 storage fact (OpDef.storage) of each op in `names`: a kind of STORAGE, or a rule giving one."""
    assert callable(kind) or kind in STORAGE, kind
    for name in names:
        REGISTRY[name] = dataclasses.replace(REGISTRY[name], storage=kind)


def numpy_kernel(*names: str) -> Callable[[NumpyKernel], NumpyKernel]:
    """Attach `fn` as the NumPy kernel of each op in `names`."""
    return _attach_all(names, "numpy")


def vjp_rule(*names: str) -> Callable[[VjpRule], VjpRule]:
    return _attach_all(names, "vjp")


def flops_rule(*names: str) -> Callable[[FlopsRule], FlopsRule]:
    return _attach_all(names, "flops")


def index_form(*names: str) -> Callable[[IndexFormRule], IndexFormRule]:
    return _attach_all(names, "index_form")


def lowering(*names: str) -> Callable[[LowerRule], LowerRule]:
    return _attach_all(names, "lower")


def workspace_rule(*names: str) -> Callable[[WorkspaceRule], WorkspaceRule]:
    """Attach the scratch bytes the op's fast kernel needs; the plan gives it that much arena while it runs."""
    return _attach_all(names, "workspace")


def numpy_workspace_kernel(*names: str) -> Callable[[Callable], Callable]:
    """Attach the NumPy kernel that does its work in the planned workspace (so the arena use is real)."""
    return _attach_all(names, "numpy_ws")


def cuda_kernel(*names: str) -> Callable[[CudaRule], CudaRule]:
    """Attach the CUDA kernel (a call of library.cu, and its launch) of each op in `names`."""
    return _attach_all(names, "cuda")


def cuda_form(*names: str) -> Callable[[CudaForm], CudaForm]:
    """Attach the index expression the CUDA backend writes for each op in `names` (shape ops)."""
    return _attach_all(names, "cuda_form")


def vendor_rule(*names: str) -> Callable[[VendorRule], VendorRule]:
    """Attach the vendor routine (an ir/vendor.py description) that serves each op in `names` where the library
    loads; a backend interprets the description and keeps the op's own kernel as the fallback."""
    return _attach_all(names, "vendor")


def eager_saves(*names: str, which: tuple[int | str, ...] = (), extra: Callable | None = None) -> None:
    """Declare what an eager framework keeps of each op in `names` for its backward pass (see `Saves`)."""
    for name in names:
        _attach(name, "saves")(Saves(which, extra))


def java_call(name: str, params: str, *, cls: str, device: str | None = None, called: bool = False,
              workspace: bool = False) -> None:  # fmt: skip
    """Declare the runtime method the Java program calls for op `name`: `params` as the Java source writes them
    after the output (`"Buf x, Buf w, int groups, int[] pad"`), in class `cls` (the runtime's class of the op's
    family, `CpuLosses`, which the CPU device calls directly), and the Device method a step
    calls, `device` (by default the op's name in camelCase: `conv2d_backward_data` -> `conv2dBackwardData`); each
    attribute parameter passes the statement attribute of its name in snake_case (`inShape` -> `in_shape`). With
    `called`, a step calls it even where the op has a CUDA form (which the Java program otherwise runs as a
    generated kernel). With `workspace`, the Device method (not the CPU class's) takes the statement's planned
    workspace last."""
    words = [p.split() for p in params.split(",") if p.strip()]
    assert all(len(w) == 2 for w in words), f"op {name}: Java parameters {params!r} are not 'type name, ...'"
    pairs = tuple((w[0], w[1]) for w in words)
    head, *rest = name.split("_")
    method = device or head + "".join(p[:1].upper() + p[1:] for p in rest)
    keys = tuple(re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", n).lower() for t, n in pairs if t not in ("Buf", "Buf[]"))
    _attach(name, "java")(JavaCall(cls, pairs, method, keys, called, workspace))


def kink_points(*names: str, at: tuple[tuple[int, float], ...]) -> None:
    """Declare where each op in `names` is not smooth, as (input index, value) pairs; tests sample those values."""
    for name in names:
        assert not REGISTRY[name].kinks, f"op {name}: kinks given twice"
        REGISTRY[name] = dataclasses.replace(REGISTRY[name], kinks=at)


def _attach_all(names: tuple[str, ...], field: str) -> Callable[[Callable], Callable]:
    def register(fn: Callable) -> Callable:
        for name in names:
            _attach(name, field)(fn)
        return fn

    return register


def lookup(name: str) -> OpDef:
    try:
        return REGISTRY[name]
    except KeyError:
        hint = did_you_mean(name, REGISTRY)
        raise KeyError(f"no op named {name!r}" + (f"; {hint}" if hint else "")) from None
