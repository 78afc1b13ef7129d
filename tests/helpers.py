"""Small helpers for tests: compile a snippet, render its diagnostics, the session's compile cache, the
networks at a reduced size (and which of them only `pytest -m slow` runs), javac's command line, NumPy's BLAS on one
thread for a run in process."""

from __future__ import annotations

import copy
import dataclasses
import time
from pathlib import Path

import pytest

from deepdsl import api
from deepdsl.errors import DslError, render

ROOT = Path(__file__).resolve().parent.parent
NETWORKS = sorted((ROOT / "networks").glob("*.ddsl"))
GOLDEN = ROOT / "tests" / "golden"

HEADER = "network T\nconst N = 4\ninput x : [N, 3, 8, 8]\nlabel y : [N] classes 10\n"

# javac as the tests run it: its own JVM on the first JIT tier alone, with the serial collector. A javac run is a
# few seconds, too short for the optimising JIT to pay for the CPU its threads take compiling javac itself (that is
# half of a javac run's CPU: the runtime's 52 sources took 5.0 s of CPU, 2.1 s so); the class files are the same.
JAVAC = ("javac", "-J-XX:TieredStopAtLevel=1", "-J-XX:+UseSerialGC")


def one_blas_thread():  # noqa: ANN201
    """A context in which NumPy's BLAS runs on one thread, as in a process started with OPENBLAS_NUM_THREADS=1 (the
    ranks the tests launch): for a run in process whose bits are compared with theirs, whatever the variable says
    here. (tests/conftest.py puts the test processes on one thread already, unless the variable is set.)"""
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1, user_api="blas")


def compile_text(text: str, sets: dict | None = None, file: str = "t.ddsl") -> api.Compilation:
    return api.compile_source(text, file, sets)


def error_text(text: str, file: str = "t.ddsl", sets: dict | None = None) -> str:
    """The rendered diagnostics for `text`; fails if it compiles."""
    c = api.Compilation()
    try:
        api.compile_source(text, file, sets, c=c)
    except DslError as err:
        return render(err, c.sources)
    raise AssertionError("expected a compile error")


# ---- gradient checks ----


def op_graph(op: str, inputs: list, attrs: dict, build=None):  # noqa: ANN001, ANN201
    """A graph `loss = sum(op(inputs) * r)`: float inputs become parameters, int inputs labels; with `build`, the
    statements `build(b, values)` emits (returning the result) in place of the one op."""
    import numpy as np

    from deepdsl.ir import GraphBuilder, Init, InputDef, ParamDef, TensorType, Value
    from deepdsl.ir.types import DType

    b = GraphBuilder("T")
    values = []
    for k, x in enumerate(inputs):
        x = np.asarray(x)
        if x.dtype.kind == "i":
            values.append(b.add_input(InputDef(Value(f"i{k}", TensorType(x.shape, DType.I64)), "label", 10)))
        else:
            values.append(b.add_param(ParamDef(Value(f"p{k}", TensorType(x.shape)), Init("constant", (0.0,)))))
    out = build(b, values) if build is not None else b.emit(op, *values, **attrs)
    r = b.add_input(InputDef(Value("r", out.type), "input"))
    loss = b.emit("sum", b.emit("mul", out, r))
    b.output("loss", loss)
    return b, values, loss


def check_op_gradient(
    op: str, inputs: list, attrs: dict, samples: int = 20, seed: int = 0, tol: float = 1e-5, build=None
) -> None:  # noqa: ANN001
    """Compare the op's symbolic gradient (autodiff over its vjp rule) with central differences in float64; with
    `build`, of the statements it emits (see op_graph)."""
    import numpy as np

    from deepdsl.autodiff import gradients
    from deepdsl.backends.numpy_runner import run

    rng = np.random.default_rng(seed)
    b, values, loss = op_graph(op, inputs, attrs, build)
    params = {v.name: np.asarray(x, dtype=np.float64) for v, x in zip(values, inputs) if v.name.startswith("p")}
    feeds = {v.name: np.asarray(x) for v, x in zip(values, inputs) if v.name.startswith("i")}
    feeds["r"] = rng.standard_normal(next(d.value.type.shape for d in b.inputs if d.value.name == "r"))
    grads = gradients(b, loss, set(params))
    for name in params:
        if name in grads:
            b.output(f"d{name}", grads[name])
    g = b.build()
    result = run(g, feeds, params, dtype=np.float64)
    for name, x in params.items():
        symbolic = result.outputs.get(f"d{name}", np.zeros_like(x))
        flat = x.reshape(-1)
        for idx in rng.choice(flat.size, size=min(samples, flat.size), replace=False):
            h = 1e-6 * max(1.0, abs(flat[idx]))
            plus, minus = dict(params), dict(params)
            plus[name] = flat.copy()
            plus[name][idx] += h
            minus[name] = flat.copy()
            minus[name][idx] -= h
            plus[name], minus[name] = plus[name].reshape(x.shape), minus[name].reshape(x.shape)
            fp = run(g, feeds, plus, dtype=np.float64).outputs["loss"]
            fm = run(g, feeds, minus, dtype=np.float64).outputs["loss"]
            numeric = (fp - fm) / (2 * h)
            got = symbolic.reshape(-1)[idx]
            scale = max(1.0, abs(numeric), abs(got))
            assert abs(got - numeric) <= tol * scale, f"{op} d{name}[{idx}]: symbolic {got}, numeric {numeric}"


# ---- networks at a reduced size ----

# a small step: a deep network has many ReLU and max-pool kinks, and a larger step crosses some of them
STEP = 1e-7

# every network at a reduced size: (sets, parameter tensors sampled for the gradient check)
REDUCED = {
    "mlp": ({"N": 4}, 6),
    "lenet": ({"N": 4}, 8),
    "alexnet": ({"N": 2, "H": 67, "W": 67}, 4),
    "overfeat": ({"N": 2, "H": 71, "W": 71}, 3),
    "vgg16": ({"N": 2, "H": 32, "W": 32}, 4),
    "googlenet": ({"N": 2, "H": 32, "W": 32}, 4),
    "resnet50": ({"N": 4, "H": 32, "W": 32}, 4),  # BN over 2 samples at 1x1 is too flat for differences
    "small": ({}, 6),  # SMALL below
}


# the ImageNet-sized architectures: their numerics and plans cost seconds each even at a reduced size, so the
# default suite runs MLP, LeNet and SMALL (batch norm, a residual add, concat, dropout and a tensor function:
# the features of ResNet-50 and GoogLeNet in one small network), and `pytest -m slow` runs these too
BIG = ("alexnet", "overfeat", "vgg16", "googlenet", "resnet50")


def with_slow(names, slow=BIG) -> list:  # noqa: ANN001
    """`names` as pytest parameters, those in `slow` marked `slow`."""
    return [pytest.param(n, marks=pytest.mark.slow) if n in slow else n for n in names]


class CompileCache:
    """One compilation per (network, sets, stop_at, options) per test session, shared by every test.

    `net` is a network's name (`"lenet"`: networks/lenet.ddsl, its spans naming the absolute path), `"small"`
    (SMALL below, as small.ddsl), or a path, used as given (so the spans, and golden text, name it as given).
    Every call returns a shallow copy of the cached Compilation: its graphs and plans are shared (frozen values,
    which no test may change), its own fields are the caller's. A stage is taken from a later one already
    compiled (`opt` from `plan`), with the later stages' fields cleared. A compile that fails is not cached; it
    raises again on the next call.
    """

    # the stages whose Compilation holds everything of the key's, and the fields the key's stage leaves empty
    # (only the names that are fields of api.Compilation count: `plan` is a property of `build` today)
    LATER = {"graph": ("plan", "opt", "train", "infer"), "train": ("plan", "opt"), "opt": ("plan",)}
    UNSET = {
        "graph": ("train", "infer", "opt", "passes", "build", "plan"),
        "train": ("infer", "opt", "passes", "build", "plan"),
        "opt": ("infer", "build", "plan"),
    }

    def __init__(self) -> None:
        self.cache: dict[tuple, api.Compilation] = {}
        self.compiles = 0

    def __call__(
        self, net: str | Path, sets: dict | None = None, stop_at: str = "graph", options: api.Options | None = None
    ) -> api.Compilation:  # fmt: skip
        key = (str(net), tuple(sorted((sets or {}).items())), options)
        stages = (stop_at, *self.LATER.get(stop_at, ()))
        found = next((self.cache[(*key, s)] for s in stages if (*key, s) in self.cache), None)
        if found is None:
            self.compiles += 1
            if net == "small":
                found = api.compile_source(SMALL, "small.ddsl", sets, stop_at, options=options)
            else:
                path = ROOT / "networks" / f"{net}.ddsl" if isinstance(net, str) and "/" not in net else net
                found = api.compile_file(path, sets, stop_at, options=options)
            self.cache[(*key, stop_at)] = found
        c = copy.copy(found)
        defaults = {f.name: f for f in dataclasses.fields(c)}
        for name in self.UNSET.get(stop_at, ()):
            if name in defaults:
                f = defaults[name]
                setattr(c, name, f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default)
        return c


def feeds_and_params(g, rng):  # noqa: ANN001, ANN201
    """Initial parameters (float64) and random inputs, labels and step for graph `g`."""
    import numpy as np

    from deepdsl.initializers import init_array

    params = {
        p.value.name: init_array(
            p.value.name, p.value.type.shape, p.init.kind, p.init.args, p.init.fan_in, p.init.fan_out, 1, np.float64
        )
        for p in g.params
    }
    feeds = {}
    for d in g.inputs:
        t = d.value.type
        feeds[d.value.name] = (
            rng.integers(0, d.classes, t.shape) if d.classes is not None  # labels and token ids
            else rng.random(t.shape) if d.kind == "input" else np.asarray(3)
        )  # fmt: skip
    return feeds, params


# batch norm, a residual add, concat, dropout and a tensor function in one small network
SMALL = """
network Small

const N = 8
const K = 10

input x : [N, 1, 12, 12]
label y : [N] classes K

tensor swish(x[B, D]) -> [n, d] = x[n, d] * sigmoid(x[n, d])

def unit(x, c) {
  h = relu(batch_norm(conv(x, c, kernel=3, pad=1)))
  return relu(h + x)
}

def body(x) {
  s = conv(x, 4, kernel=3, pad=1)
  b = concat(unit(s, 4), s, axis=1)
  f = dropout(full(flatten(max_pool(b, 2)), 32), p=0.25)
  return full(swish(f), K)
}

layer model = body

loss    = softmax_cross_entropy(model(x), y)
predict = model(x)

train {
  data       = synthetic(seed=5)
  optimizer  = sgd(lr=0.01, momentum=0.9)
  iterations = 5
  seed       = 3
}
"""

# two convolutions (the second strided, grouped: its data gradient too), padded max and average pooling
POOLED = """network Pooled
const N = 2
input x : [N, 3, 8, 8]
label y : [N] classes 10
layer cv1 = conv(4, kernel=3, pad=1)
layer cv2 = conv(6, kernel=3, stride=2, pad=1, groups=2)
layer fc = full(10)
net = fc o flatten o avg_pool(3, stride=2, pad=1) o relu o cv2 o max_pool(3, stride=1, pad=1) o relu o cv1
loss = softmax_cross_entropy(net(x), y)
predict = net(x)
train { data = synthetic(seed=4) optimizer = sgd(lr=0.05, momentum=0.9) iterations = 3 seed = 2 }
"""

# LRN after a convolution, a softmax in the loss (its gradient too), a log softmax in the prediction
NORMED = """network Normed
const N = 2
input x : [N, 3, 6, 6]
label y : [N] classes 10
layer cv = conv(6, kernel=3, pad=1)
layer fc = full(10)
net = fc o flatten o lrn(size=3, alpha=0.5, beta=0.75, k=1.5) o relu o cv
loss = cross_entropy(softmax(net(x)), y)
predict = log_softmax(net(x))
train { data = synthetic(seed=6) optimizer = sgd(lr=0.05, momentum=0.9) iterations = 3 seed = 4 }
"""


SHM = Path("/dev/shm")


def _mapped() -> set[str]:
    """The files some process here has mapped (/proc/*/maps), as far as this user may read them."""
    names = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            lines = maps.read_text().splitlines()
        except OSError:
            continue
        names.update(fields[5] for fields in (line.split(None, 5) for line in lines) if len(fields) == 6)
    return names


def remove_orphans(paths: set[Path], min_age: float = 10.0) -> list[Path]:
    """Removes those of `paths` that no process maps and nobody wrote in the last `min_age` seconds (a segment just
    made, which its other ranks have yet to map, is younger); returns them."""
    mapped = _mapped()
    removed = []
    for path in sorted(paths):
        try:
            if str(path) not in mapped and time.time() - path.stat().st_mtime > min_age:
                path.unlink()
                removed.append(path)
        except OSError:
            continue
    return removed
