"""Fuzz the front end: whatever text it is given, `deepdsl check` ends with exit 0, or exit 1 and a diagnostic.

Three kinds of input (hypothesis, derandomized so CI is reproducible):

* random token streams drawn from the language's vocabulary, sometimes after a valid header;
* the files of `networks/` (and two seeds of our own with tensor functions, includes, `if` and `for`)
  with 1-3 random token deletions, duplications, swaps, replacements or insertions (shrunk with
  `--set N=2` and a small H = W so that elaboration stays fast);
* the same files with sizes a hostile user writes (zero, negative, past a Java int, past 2^62), names swapped,
  lines dropped or duplicated: `check`, and `memcheck` of what check accepts (issue 36).

Every case runs in-process through the CLI's own entry point (the click group), so a crash shows up as
exit 3 ("internal error") or as an exception that escaped the CLI; every command must end within CASE_SECONDS.
The default run has 650 cases (enough to keep every seed and mutation kind in play; it is a third of the suite's
time at 2,000); the `slow` variants run 5,000, and 10,000 of the sizes (`pytest -m slow tests/frontend/test_fuzz.py`;
about 17 minutes for the sizes on two cores).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from deepdsl.cli import cli as deepdsl_cli

ROOT = Path(__file__).resolve().parents[2]
NETWORKS = sorted((ROOT / "networks").glob("*.ddsl"))

# The smallest input size each network shape-checks with (see the comments at the top of the files);
# N = 2 everywhere. A mutation may make these invalid, which must then be a diagnostic.
SMALL_HW = {"alexnet": 67, "googlenet": 67, "lenet": 28, "mlp": 28, "overfeat": 71, "resnet50": 67, "vgg16": 32}
SMALL_HW["vit_tiny"] = 8  # two 4x4 patches a side

HEADER = "network T\nconst N = 2\ninput x : [N, 3, 8, 8]\nlabel y : [N] classes 10\n"

KEYWORDS = [
    "network", "const", "input", "label", "layer", "def", "tensor", "param", "loss", "predict", "train",
    "include", "for", "in", "if", "then", "else", "return", "and", "or", "not", "true", "false", "o",
    "classes", "sum", "max",
]  # fmt: skip
BUILTINS = [
    "conv", "max_pool", "avg_pool", "global_avg_pool", "full", "flatten", "relu", "sigmoid", "tanh", "leaky_relu",
    "softmax", "log_softmax", "dropout", "batch_norm", "lrn", "concat", "softmax_cross_entropy", "cross_entropy",
    "mse", "argmax", "accuracy", "abs", "exp", "log", "sqrt", "dim", "channels", "rank",
    "relu6", "clip", "hard_sigmoid", "hard_swish", "silu", "group_norm", "instance_norm", "adaptive_avg_pool",
    "he", "xavier", "gaussian", "uniform", "constant", "synthetic", "mnist", "cifar10", "npz", "sgd", "adam",
    "lstm", "gru", "sequences", "hidden",  # recurrent layers (issue 34)
    "slice", "chunk", "mean", "expand", "keepdim",  # along axes (issue 34); sum and max are in KEYWORDS
]  # fmt: skip
NAMES = [
    "x", "y", "h", "net", "body", "f", "g", "i", "j", "n", "d", "N", "K", "H", "W", "D", "C", "T",
    "kernel", "stride", "pad", "groups", "bias", "init", "name", "axis", "p", "eps", "lr", "momentum",
    "data", "optimizer", "iterations", "test_every", "seed", "_", "conv1", "fc1",
]  # fmt: skip
NUMBERS = [
    "0", "1", "2", "3", "5", "10", "64", "224", "007", "2147483648", "9223372036854775808",
    "100000000000000000000000000000", "0.0", "0.5", "1.0", "1e-5", "1e309", "2.5e3", "1E+2",
]  # fmt: skip
# `"case.ddsl"` is the fuzzed file itself (a self-include), "lib.ddsl" the file LIB next to it, "." a directory.
STRINGS = ['""', '"a"', '"data/mnist"', '"case.ddsl"', '"lib.ddsl"', '"missing.ddsl"', '"."', '"/"']
LIB = "def twice(x) = relu(relu(x))\ntensor neg(x[N, D]) -> [n, d] = 0 - x[n, d]\n"
PUNCT = [
    "(", ")", "[", "]", "{", "}", ",", ":", ";", "=", "==", "!=", "<", "<=", ">", ">=",
    "+", "-", "*", "/", "%", "^", "?", ".", "..", "->", "#", "\n",
]  # fmt: skip
ODD = ["\t", "\r", "\x00", "\\", "'", "@", "$", "`", "\u00e9", "\u03bb", "\ufeff"]  # still valid UTF-8
VOCAB = KEYWORDS + BUILTINS + NAMES + NUMBERS + STRINGS + PUNCT + ODD

# A rough tokenizer for the mutations: comments, strings, numbers, names, two-char operators, whitespace,
# and any other single character. Joining the tokens gives back the text.
TOKEN = re.compile(
    r'#[^\n]*|"[^"\n]*"|\d+\.\d+(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+|\d+|[A-Za-z_]\w*|\.\.|->|==|!=|<=|>=|\s+|.',
    re.DOTALL,
)

# what one command may take on one case (issue 36: 18 of 36,000 fuzzed networks took over 20 s in check or memcheck)
CASE_SECONDS = 20

# `file:line:col: error: ...`, or `error: ...` for the few errors that have no location (a bad --set).
DIAGNOSTIC = re.compile(r"^(?:\S.*:\d+:\d+: )?error: \S", re.MULTILINE)


# ---- strategies -------------------------------------------------------------------------------


@st.composite
def token_streams(draw: st.DrawFn) -> str:
    tokens = draw(st.lists(st.sampled_from(VOCAB), max_size=40))
    seps = draw(st.lists(st.sampled_from([" ", " ", "\n", ""]), min_size=len(tokens), max_size=len(tokens)))
    body = "".join(t + s for t, s in zip(tokens, seps))
    return (HEADER if draw(st.booleans()) else "") + body


def _split(text: str) -> list[str]:
    return TOKEN.findall(text)


# The networks use no tensor functions, includes or `if` blocks, so a few seeds of our own cover those parts
# of the language too (each compiles; `test_seeds_compile` keeps it so). They get `--set N=2` only.
_TENSORFN = """
tensor swish(x[N, D]) -> [n, d] = x[n, d] * sigmoid(x[n, d])
tensor gram(x[B, C, P]) -> [b, i, j] = sum[p] x[b, i, p] * x[b, j, p]
tensor my_conv(x[N, C, H, W], w[F, C, K, K]) -> [n, f, i: H - K + 1, j: W - K + 1] =
  sum[c, kh, kw] x[n, c, i + kh, j + kw] * w[f, c, kh, kw]
tensor row_norm(x[N, D]) -> [n, d] {
  param g[D] = constant(1)
  param h[D] = constant(0)
  mu[n]  = sum[d] x[n, d] / D
  var[n] = sum[d] (x[n, d] - mu[n]) ^ 2 / D
  return g[d] * (x[n, d] - mu[n]) / sqrt(var[n] + 1e-5) + h[d]
}
tensor clamp1(x[N, D]) -> [n, d] = x[n, d] > 1 ? 1 : max(x[n, d], 0 - 1)
tensor rowmax(x[N, D]) -> [n, d] = x[n, d] - (max[e] x[n, e])
tensor row(x[N, C, H, W]) -> [n, c, w] = x[n, c, 0, w]
g = gram(row(relu(my_conv(x, x))))
h = row_norm(swish(full(flatten(g), 16)))
loss = softmax_cross_entropy(full(clamp1(rowmax(h)), 10), y)
predict = h
"""
_BLOCKS = """
include "lib.ddsl"
def unit(x, c, down=false) {
  h = twice(batch_norm(conv(x, c, kernel=3, pad=1, bias=false)))
  if down { h = max_pool(h, 2) } else { h = h }
  for i in 0 .. 2 { h = leaky_relu(h, slope=0.1) }
  s = if channels(x) != c or down then conv(x, c, kernel=1, stride=if down then 2 else 1) else x
  return relu(h + s)
}
layer body = unit
const K = 10
net = full(K) o dropout(p=0.25) o flatten o global_avg_pool o lrn(size=3)
a = net(concat(unit(x, 4, down=true), avg_pool(x, 2), axis=1))
loss = softmax_cross_entropy(a, y) + 0.5 * mse(softmax(a), softmax(a))
predict = argmax(log_softmax(a))
train {
  data = synthetic(seed=3); optimizer = adam(lr=0.001)
  iterations = 10; test_every = 5; seed = 7
}
"""
SEEDS = {"tensorfn": HEADER + _TENSORFN, "blocks": HEADER + _BLOCKS}
SEED_SETS = {name: {"N": 2} for name in SEEDS}
for _name, _hw in SMALL_HW.items():
    SEED_SETS[_name] = {"N": 2, "H": _hw, "W": _hw}
SEED_SETS.update({"autoencoder": {"N": 2}, "regression": {"N": 2}})  # networks of flat vectors: no H, W
SEED_SETS["gpt_tiny"] = {"N": 2, "T": 8}  # sequences of 8 characters: no H, W

SEED_TOKENS = {p.stem: _split(p.read_text(encoding="utf-8")) for p in NETWORKS}
SEED_TOKENS.update({name: _split(text) for name, text in SEEDS.items()})

NUMBER = re.compile(r"\d")
NAME = re.compile(r"[A-Za-z_]\w*")
# For a replacement that keeps the kind of the token (so the text more often still parses and the
# mutation reaches the elaborator): numbers, strings, names (the file's own, builtins, common ones), operators.
OPERATORS = ["+", "-", "*", "/", "%", "^", "==", "!=", "<", "<=", ">", ">=", "and", "or", "o"]
KINDRED = {"number": NUMBERS, "string": STRINGS, "name": BUILTINS + NAMES, "operator": OPERATORS, "punct": PUNCT}


def _kind(token: str) -> str:
    if NUMBER.match(token):
        return "number"
    if token.startswith('"'):
        return "string"
    if token in OPERATORS:
        return "operator"
    if NAME.fullmatch(token) and token not in KEYWORDS:
        return "name"
    return "punct"


@st.composite
def mutated_networks(draw: st.DrawFn) -> tuple[str, str]:
    """(seed name, mutated text): 1-3 edits of the non-blank, non-comment tokens of a file in networks/
    (or of one of SEEDS): deletions, duplications, swaps, replacements and insertions."""
    name = draw(st.sampled_from(sorted(SEED_TOKENS)))
    tokens = list(SEED_TOKENS[name])
    own_names = sorted({t for t in tokens if _kind(t) == "name"})
    for _ in range(draw(st.integers(1, 3))):
        solid = [i for i, t in enumerate(tokens) if t.strip() and not t.startswith("#")]
        if not solid:
            break
        i = draw(st.sampled_from(solid))
        op = draw(st.sampled_from(["delete", "duplicate", "swap", "replace", "replace_kin", "replace_kin", "insert"]))
        if op == "delete":
            del tokens[i]
        elif op == "duplicate":
            tokens.insert(i, tokens[i] + draw(st.sampled_from([" ", ""])))
        elif op == "swap":
            j = draw(st.sampled_from(solid))
            tokens[i], tokens[j] = tokens[j], tokens[i]
        elif op == "replace":
            tokens[i] = draw(st.sampled_from(VOCAB))
        elif op == "replace_kin":
            kind = _kind(tokens[i])
            # a name is more often another of the file's own names than a builtin or a stranger
            tokens[i] = draw(st.sampled_from(own_names * 3 + KINDRED[kind] if kind == "name" else KINDRED[kind]))
        else:
            tokens.insert(i, draw(st.sampled_from(VOCAB)) + " ")
    return name, "".join(tokens)


# Sizes as a hostile or careless user writes them (issue 36): zero, negative, past a Java int, past 2^62.
SIZES = ["0", "-1", "-7", "1", "65536", "100000", "1000000", "46341", "2147483647", "2147483648", "4294967296",
         "1099511627777", "4611686018427387903", "4611686018427387904", "99999999999999999999999", "1e30",
         "0.0"]  # fmt: skip


@st.composite
def sized_networks(draw: st.DrawFn) -> tuple[str, str]:
    """(seed name, mutated text): 1-3 of numbers set to a size of SIZES, two names swapped, a line dropped or
    duplicated, in a file of networks/ (or of SEEDS)."""
    name = draw(st.sampled_from(sorted(SEED_TOKENS)))
    tokens = list(SEED_TOKENS[name])
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["size", "size", "size", "size", "swap", "drop", "duplicate"]))
        if op in ("drop", "duplicate"):
            lines = "".join(tokens).split("\n")
            i = draw(st.integers(0, len(lines) - 1))
            lines[i : i + 1] = [] if op == "drop" else [lines[i], lines[i]]
            tokens = _split("\n".join(lines))
            continue
        kind = "number" if op == "size" else "name"
        where = [i for i, t in enumerate(tokens) if _kind(t) == kind and not t.startswith("#")]
        if len(where) < 2:
            continue
        i = draw(st.sampled_from(where))
        if op == "size":
            tokens[i] = draw(st.sampled_from(SIZES))
        else:
            j = draw(st.sampled_from(where))
            tokens[i], tokens[j] = tokens[j], tokens[i]
    return name, "".join(tokens)


# ---- the check ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def case_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One file, rewritten for every case (a module-scoped fixture, so hypothesis can share it)."""
    folder = tmp_path_factory.mktemp("fuzz")
    (folder / "lib.ddsl").write_text(LIB, encoding="utf-8")
    return folder / "case.ddsl"


RUNNER = CliRunner()


def assert_clean(
    path: Path, text: str, sets: dict[str, int] | None = None, command: tuple[str, ...] = ("check",)
) -> int:
    path.write_text(text, encoding="utf-8")
    args = [*command, str(path)]
    for k, v in (sets or {}).items():
        args += ["--set", f"{k}={v}"]
    start = time.perf_counter()
    result = RUNNER.invoke(deepdsl_cli, args, catch_exceptions=True)
    seconds = time.perf_counter() - start
    out, err = result.stdout, result.stderr
    where = f"\n--- input ---\n{text}\n--- args: {args[2:]}\n--- stdout ---\n{out}\n--- stderr ---\n{err}"
    assert seconds < CASE_SECONDS, f"{args[0]} took {seconds:.1f} s{where}"
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"an exception escaped the CLI: {result.exception!r}{where}"
    )
    assert result.exit_code in (0, 1), f"exit {result.exit_code}{where}"
    assert "Traceback" not in out + err, f"a traceback was printed{where}"
    assert "internal error" not in err, f"an internal error was reported{where}"
    if result.exit_code == 1:
        assert DIAGNOSTIC.search(err), f"exit 1 without a rendered diagnostic{where}"
    return result.exit_code


def check_tokens(path: Path, text: str) -> None:
    assert_clean(path, text)


def check_mutation(path: Path, case: tuple[str, str]) -> None:
    """Mutated networks go through the whole compiler: elaboration, autodiff and every optimiser pass."""
    name, text = case
    assert_clean(path, text, SEED_SETS[name], command=("ir", "--stats"))


def fuzz_settings(n: int) -> settings:
    return settings(
        max_examples=n,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )


def test_every_network_has_a_small_size() -> None:
    assert {p.stem for p in NETWORKS} <= set(SEED_SETS), "add the new network's smallest H = W to SMALL_HW"


@pytest.mark.parametrize("name", sorted(SEED_TOKENS))
def test_seeds_compile(case_file: Path, name: str) -> None:
    """The unmutated seeds compile with their small sizes, and the tokenizer gives back their text."""
    text = "".join(SEED_TOKENS[name])
    assert text == (SEEDS[name] if name in SEEDS else (ROOT / "networks" / f"{name}.ddsl").read_text())
    case_file.write_text(text, encoding="utf-8")
    args = ["check", str(case_file)] + [f"--set={k}={v}" for k, v in SEED_SETS[name].items()]
    result = RUNNER.invoke(deepdsl_cli, args, catch_exceptions=True)
    assert result.exit_code == 0, result.output


# Inputs the fuzzer once found to crash deepdsl, kept so that they stay fixed.
FOUND = [
    HEADER + "loss = softmax_cross_entropy(full(flatten(x), 10), y)\ntrain { optimizer = sgd }\n",
]


@fuzz_settings(300)
@given(text=token_streams())
@example(text=FOUND[0])
def test_token_streams(case_file: Path, text: str) -> None:
    check_tokens(case_file, text)


@fuzz_settings(300)
@given(case=mutated_networks())
def test_mutated_networks(case_file: Path, case: tuple[str, str]) -> None:
    check_mutation(case_file, case)


def check_sizes(path: Path, case: tuple[str, str]) -> None:
    """Networks with hostile sizes: `check` (and `memcheck` of what it accepts) end with exit 0 or a diagnostic,
    each within CASE_SECONDS (assert_clean measures every command)."""
    name, text = case
    if assert_clean(path, text, SEED_SETS[name]) == 0:
        assert_clean(path, text, SEED_SETS[name], command=("memcheck", "--totals"))


# what the fuzzer found: a VGG-16 block of 100,000 convolutions elaborated for 30 s before it was refused
RUNAWAY = ("vgg16", "".join(SEED_TOKENS["vgg16"]).replace("vgg_block(x, 512, 3)", "vgg_block(x, 512, 100000)", 1))


@pytest.mark.slow  # 7 s (the default suite's four minutes)
@fuzz_settings(50)  # about 10 s (memcheck of what checks is most of it); the slow variant runs 10,000
@given(case=sized_networks())
@example(case=RUNAWAY)
def test_sized_networks(case_file: Path, case: tuple[str, str]) -> None:
    check_sizes(case_file, case)


@pytest.mark.slow
@fuzz_settings(10_000)
@given(case=sized_networks())
def test_sized_networks_slow(case_file: Path, case: tuple[str, str]) -> None:
    check_sizes(case_file, case)


@pytest.mark.slow
@fuzz_settings(5000)
@given(text=token_streams())
def test_token_streams_slow(case_file: Path, text: str) -> None:
    check_tokens(case_file, text)


@pytest.mark.slow
@fuzz_settings(5000)
@given(case=mutated_networks())
def test_mutated_networks_slow(case_file: Path, case: tuple[str, str]) -> None:
    check_mutation(case_file, case)
