"""The built-in layers and functions of DESIGN §2.4: their signatures and how each lowers to IR ops.

A built-in layer is the user's vocabulary (`conv`, `full`, `batch_norm`); it makes its parameters and
emits one or more registry ops (`conv2d` + `bias_add`). Signatures are data, so argument checking,
defaults and error messages are shared by every entry.

This module is the table the elaborator looks a name up in: `BUILTINS` (filled by the `builtin` decorator), the
specs' signatures (`SPECS`: initialisers, data sources, optimizers, schedules) and the shape queries (`QUERIES`),
with the helpers the families share. Each family registers its built-ins from a module of its own, imported at the
end of this one, so that importing this module registers every built-in: builtin_layers.py (layers with
parameters), builtin_pooling.py, builtin_activations.py, builtin_random.py, builtin_tensors.py, builtin_losses.py
and recurrent.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from deepdsl.errors import DslShapeError, Note, Span
from deepdsl.frontend.values import Spec, TensorVal

if TYPE_CHECKING:
    from deepdsl.frontend.elaborate import Elaborator

REQUIRED = object()
# the largest float32: an optimizer's hyperparameter is read as a float32 and must stay finite there (the same
# bound as the run options and the Java program's flags, deepdsl/run_settings.py SETTING_RANGES)
FLOAT32_MAX = 3.4028234663852886e38


@dataclass(frozen=True)
class ArgSpec:
    name: str
    kind: str  # int, pair, ints, float, floats, bool, init, str, schedule, table (an embedding layer: full's tied=)
    default: Any = REQUIRED
    low: float | None = None  # smallest allowed value (ints, pairs, floats)
    below: float | None = None  # values must be strictly less than this
    high: float | None = None  # largest allowed value
    keyword: bool = False  # given by name only (the cross-entropies' label_smoothing= and weight=)


Args = dict[str, Any]
Apply = Callable[["Elaborator", str, tuple[TensorVal, ...], Args, Span], TensorVal]


@dataclass(frozen=True)
class Builtin:
    name: str
    inputs: int  # leading tensor inputs; -1 for any number (concat)
    args: tuple[ArgSpec, ...]
    apply: Apply
    layer: bool = True  # a layer gets a naming scope and a row in `check --layers`
    params: bool = False  # it makes parameters: `layer l = NAME` makes them once for every use of l


HE = Spec("init", "he", ())
ZERO = Spec("init", "constant", (("v", 0.0),))
ONE = Spec("init", "constant", (("v", 1.0),))

BUILTINS: dict[str, Builtin] = {}


def builtin(
    name: str, *args: ArgSpec, inputs: int = 1, layer: bool = True, params: bool = False
) -> Callable[[Apply], Apply]:
    def register(fn: Apply) -> Apply:
        BUILTINS[name] = Builtin(name, inputs, args, fn, layer, params)
        return fn

    return register


def need_rank(x: TensorVal, ranks: tuple[int, ...], what: str, span: Span, hint: str | None = None) -> None:
    if len(x.shape) not in ranks:
        want = " or ".join(f"{r}-D" for r in ranks)
        raise DslShapeError(f"{what} expects a {want} input, got {x.value.type} from {x.origin}", span, hint=hint)


# ---- shared by the families: where a tensor comes from, a free view ----------------------------------------


def origin_notes(*xs: TensorVal) -> list[Note]:
    """A note of where each of xs comes from (a parameter's needs none: its name says it)."""
    return [Note(f"{x.value.type} comes from {x.origin}", x.span) for x in xs if "parameter" not in x.origin]


def view(el: Elaborator, x: TensorVal, shape: tuple[int, ...], span: Span, path: str, kind: str) -> TensorVal:
    """x viewed as `shape` (a reshape, which is free), or x itself when it has that shape already."""
    return x if tuple(x.shape) == shape else el.emit("reshape", (x,), span, path, kind, shape=shape)


# ---- specs: initialisers, data sources, optimizers ---------------------------------------------------

SPECS: dict[str, tuple[str, tuple[ArgSpec, ...]]] = {
    "he": ("init", ()),
    "xavier": ("init", ()),
    "gaussian": ("init", (ArgSpec("std", "float", low=0.0),)),
    "uniform": ("init", (ArgSpec("a", "float", low=0.0),)),
    "constant": ("init", (ArgSpec("v", "float"),)),
    "synthetic": ("data", (ArgSpec("seed", "int", 1),)),
    "mnist": ("data", (ArgSpec("dir", "str"),)),
    "cifar10": ("data", (ArgSpec("dir", "str"),)),
    "npz": ("data", (ArgSpec("file", "str"),)),
    "text": ("data", (ArgSpec("file", "str"),)),
    "sgd": (
        "optimizer",
        (
            ArgSpec("lr", "float", 0.01, low=0.0, high=FLOAT32_MAX),
            ArgSpec("momentum", "float", 0.0, low=0.0, below=1.0),
            ArgSpec("weight_decay", "float", 0.0, low=0.0, high=FLOAT32_MAX),
            ArgSpec("clip", "float", 0.0, low=0.0, high=FLOAT32_MAX),
            ArgSpec("nesterov", "bool", False),  # [optim] torch's nesterov=True: needs momentum > 0
        ),
    ),  # fmt: skip
    # learning-rate schedules (frontend/program.py Schedule); `lr` is a number or another schedule
    "step": (
        "schedule",
        (
            ArgSpec("lr", "schedule", high=FLOAT32_MAX),
            ArgSpec("every", "int", low=1),
            ArgSpec("gamma", "float", 0.1, low=0.0, high=FLOAT32_MAX),
        ),
    ),  # fmt: skip
    "cosine": (
        "schedule",
        # total left out: the train block's iterations (an explicit 0 is an error, not "all of them")
        (
            ArgSpec("lr", "schedule", high=FLOAT32_MAX),
            ArgSpec("total", "int", None, low=1),
            ArgSpec("min", "float", 0.0, low=0.0, high=FLOAT32_MAX),
        ),
    ),  # fmt: skip
    "warmup": ("schedule", (ArgSpec("lr", "schedule", high=FLOAT32_MAX), ArgSpec("steps", "int", low=1))),
    "adam": (
        "optimizer",
        (
            ArgSpec("lr", "float", 0.001, low=0.0, high=FLOAT32_MAX),
            ArgSpec("beta1", "float", 0.9, low=0.0, below=1.0),
            ArgSpec("beta2", "float", 0.999, low=0.0, below=1.0),
            ArgSpec("eps", "float", 1e-8, low=0.0, high=FLOAT32_MAX),
        ),
    ),  # fmt: skip
    # data sources: a folder of class folders of images, a numeric CSV file (data/images.py, data/table.py)
    "images": ("data", (ArgSpec("dir", "str"),)),
    "csv": ("data", (ArgSpec("file", "str"),)),
    # [optim] torch.optim.AdamW (decoupled weight decay) and RMSprop (centered=False, eps outside the sqrt)
    "adamw": (
        "optimizer",
        (
            ArgSpec("lr", "float", 0.001, low=0.0, high=FLOAT32_MAX),
            ArgSpec("beta1", "float", 0.9, low=0.0, below=1.0),
            ArgSpec("beta2", "float", 0.999, low=0.0, below=1.0),
            ArgSpec("eps", "float", 1e-8, low=0.0, high=FLOAT32_MAX),
            ArgSpec("weight_decay", "float", 0.01, low=0.0, high=FLOAT32_MAX),
            ArgSpec("clip", "float", 0.0, low=0.0, high=FLOAT32_MAX),
        ),
    ),  # fmt: skip
    "rmsprop": (
        "optimizer",
        (
            ArgSpec("lr", "float", 0.01, low=0.0, high=FLOAT32_MAX),
            ArgSpec("alpha", "float", 0.99, low=0.0, below=1.0),
            ArgSpec("eps", "float", 1e-8, low=0.0, high=FLOAT32_MAX),
            ArgSpec("momentum", "float", 0.0, low=0.0, below=1.0),
            ArgSpec("weight_decay", "float", 0.0, low=0.0, high=FLOAT32_MAX),
            ArgSpec("clip", "float", 0.0, low=0.0, high=FLOAT32_MAX),
        ),
    ),  # fmt: skip
}

# compile-time shape queries: name -> number of arguments after the tensor
QUERIES = {"dim": 1, "channels": 0, "rank": 0}


# ---- the families: each module registers its built-ins in BUILTINS when it is imported -------------------------
import deepdsl.frontend.builtin_activations  # noqa: E402, F401
import deepdsl.frontend.builtin_layers  # noqa: E402, F401
import deepdsl.frontend.builtin_losses  # noqa: E402, F401
import deepdsl.frontend.builtin_pooling  # noqa: E402, F401
import deepdsl.frontend.builtin_random  # noqa: E402, F401
import deepdsl.frontend.builtin_tensors  # noqa: E402, F401
import deepdsl.frontend.recurrent  # noqa: E402, F401  (lstm, gru)
