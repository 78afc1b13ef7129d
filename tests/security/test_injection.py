"""No text of a .ddsl file becomes code in the generated Java or CUDA (issue 15).

A .ddsl string cannot hold `"` or a newline, but javac decodes `\\u0022` and `\\u000a` before it lexes, and a file
name can hold anything but `/`. What reaches the output from the source: the train block's data string (a Java
string literal), the source and include file names and `name=` identifiers (comments, string literals, names).
The tests: the escaping functions on their own (hypothesis, read back by a model of javac's and of a C compiler's
lexing, and one real javac and g++ run over a batch of strings), then whole compilations with hostile names and
paths, whose Java and CUDA must lex to the same tokens as a harmless compilation, and the issue's two proofs of
concept and a real newline in a file name compiled by javac and run.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import tempfile
from pathlib import Path
from unittest import mock

import pytest
from helpers import JAVAC
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from security_env import PROGRAMS, build_programs, needs_javac, run_java
from source_tokens import LexError, c_tokens, java_text, java_tokens

from deepdsl.api import build, compile_source
from deepdsl.backends.escape import c_comment, java_comment, java_string
from deepdsl.backends.java import java_program, steps
from deepdsl.backends.java.names import JAVA_KEYWORDS
from deepdsl.frontend.train import relative_to_source

# pieces an attacker would combine: unicode escapes, quotes, comment ends, splices, trigraphs, line terminators
PIECES = [
    "\\u0022", "\\u000a", "\\u000d", "\\u005c", "\\uuu0022", "\\\\u0022", "\\u", "\\u12", "\\", "\\\\", '"', "'",
    "*/", "/*", "//", "??/", "??", "?", "\n", "\r", "\r\n", "\t", "\x00", "\x1a", "\x7f", "\u2028", "\x85", "é",
    "\U0001f600", "\udc80", "\ud800", "a", "u", "0", "2", "); static { System.exit(7); } //", "x", " ", "{", "}",
]  # fmt: skip
TEXT = st.one_of(
    st.lists(st.sampled_from(PIECES), max_size=12).map("".join),
    st.text(max_size=20),
    st.text(st.characters(min_codepoint=0, max_codepoint=0x80), max_size=20),
)


def fuzz_strings(count: int, seed: int = 15) -> list[str]:
    """`count` strings for the javac and g++ batches: every piece alone and in pairs, then random mixes."""
    rng = random.Random(seed)
    out = list(PIECES) + [a + b for a in PIECES for b in ("\\u0022", "\n", "*/", "\\")]
    while len(out) < count:
        n = rng.randint(1, 10)
        out.append(
            "".join(rng.choice(PIECES) if rng.random() < 0.7 else chr(rng.randint(0, 0x10FFFF)) for _ in range(n))
        )
    return out[:count]


# ---- the escaping functions ----


@settings(max_examples=500, derandomize=True, deadline=None)
@given(TEXT)
def test_a_java_literal_and_comment_of_any_text_lex_as_one_token(text: str) -> None:
    literal, comment = java_string(text), java_comment(text)
    assert literal.isascii() and comment.isascii()
    source = f"String s = {literal}; // {comment}\nint t; /* {comment} */ int u;\n"
    assert java_tokens(source) == [
        ("NAME", "String"), ("NAME", "s"), ("OP", "="), ("STRING", java_text(text)), ("OP", ";"),
        ("COMMENT", f" {comment}"), ("NAME", "int"), ("NAME", "t"), ("OP", ";"), ("COMMENT", f" {comment} "),
        ("NAME", "int"), ("NAME", "u"), ("OP", ";"),
    ]  # fmt: skip


@settings(max_examples=500, derandomize=True, deadline=None)
@given(TEXT)
def test_a_c_comment_of_any_text_lexes_as_one_comment(text: str) -> None:
    comment = c_comment(text)
    assert comment.isascii()
    source = f"int a; // {comment}\nint b; /* {comment} */ int c;\n"
    kinds = [k for k, _ in c_tokens(source)]
    assert kinds == ["NAME", "NAME", "OP", "COMMENT", "NAME", "NAME", "OP", "COMMENT", "NAME", "NAME", "OP"]


def test_the_lexer_model_sees_the_attacks() -> None:
    """The checks above could not fail if the lexers missed what javac and a C compiler do."""
    assert ("STRING", "a") in java_tokens('String s = "a\\u0022; int x;')  # \u0022 ends the string early
    assert ("NAME", "x") in java_tokens("// a\\u000aint x;")  # \u000a ends the comment
    assert ("NAME", "x") not in java_tokens('String s = "a\\\\u0022; int x;";')  # \\u is no escape (JLS 3.3)
    with pytest.raises(LexError):
        java_tokens('String s = "\\u12";')
    assert ("NAME", "x") not in c_tokens("// a \\\nint x;\n")  # a splice continues the comment
    assert ("NAME", "x") not in c_tokens("// a ??/\nint x;\n")  # so does a trigraph backslash
    assert ("NAME", "x") in c_tokens("/* a */ int x; */\n")


needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="no g++")
BATCH = 600


@pytest.mark.java
@needs_javac
def test_javac_reads_back_every_literal_and_comment(tmp_path: Path) -> None:
    """One class holding BATCH literals, each between a `//` and a `/* */` comment of a fuzz string: javac compiles
    it, the array has BATCH elements, each exactly its string (compared as UTF-16 code units)."""
    texts = fuzz_strings(BATCH)
    lines = ["public final class Fuzz {", "  static final String[] S = {"]
    for k, t in enumerate(texts):
        other = texts[(k + 1) % len(texts)]
        lines += [
            f"    // {java_comment(t)}",
            f"    /* {java_comment(other)} */ {java_string(t)}, // {java_comment(t)}",
        ]
    lines += [
        "  };",
        "  public static void main(String[] a) {",
        "    System.out.println(S.length);",
        "    for (String s : S) {",
        '      StringBuilder b = new StringBuilder("u");',
        '      for (int i = 0; i < s.length(); i++) b.append(String.format(" %04x", (int) s.charAt(i)));',
        "      System.out.println(b);",
        "    }",
        "  }",
        "}",
    ]
    source = "\n".join(lines) + "\n"
    assert source.isascii()
    (tmp_path / "Fuzz.java").write_text(source, encoding="ascii")
    strings = [v for k, v in java_tokens(source) if k == "STRING"]
    assert strings[: len(texts)] == list(map(java_text, texts))  # the lexer model agrees with javac below
    subprocess.run([*JAVAC, "-d", str(tmp_path), str(tmp_path / "Fuzz.java")], check=True, timeout=300)
    out = subprocess.run(["java", "-cp", str(tmp_path), "Fuzz"], capture_output=True, text=True, check=True).stdout
    rows = out.splitlines()
    assert rows[0] == str(len(texts))

    def units(t: str) -> str:
        raw = t.encode("utf-16-be", "surrogatepass")
        return "u" + "".join(f" {int.from_bytes(raw[i : i + 2], 'big'):04x}" for i in range(0, len(raw), 2))

    assert rows[1:] == [units(t) for t in texts]


@needs_gxx
def test_gxx_sees_every_comment_end_where_it_was_written(tmp_path: Path) -> None:
    """BATCH `//` and `/* */` comments of fuzz strings, each followed by a statement on the next line, compiled
    with trigraphs on: every statement runs (a spliced or broken comment would swallow or break one)."""
    texts = fuzz_strings(BATCH, seed=16)
    lines = ["#include <cstdio>", "int main() {", "  int n = 0;"]
    for t in texts:
        lines += [f"  // {c_comment(t)}", "  n++;", f"  /* {c_comment(t)} */ n++;"]
    lines += ['  std::printf("%d\\n", n);', "  return 0;", "}"]
    (tmp_path / "fuzz.cpp").write_text("\n".join(lines) + "\n", encoding="ascii")
    exe = tmp_path / "fuzz"
    subprocess.run(["g++", "-std=c++11", "-trigraphs", "-w", "-o", str(exe), str(tmp_path / "fuzz.cpp")], check=True)
    assert subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.strip() == str(2 * len(texts))


# ---- whole compilations ----

NETWORK = """network Fuzz
const N = 2
input x : [N, 1, 4, 4]
label y : [N] classes 3
include "{include}"
def blk(t) {{
  h = relu(full(t, 6, name="{name}"))
  return dropout(neg(h), p=0.5)
}}
layer m = blk
layer out = full(3)
loss = softmax_cross_entropy(out(twice(m(flatten(x)))), y)
predict = out(twice(m(flatten(x))))
train {{
  data = npz("{data}")
  optimizer = sgd(lr=0.01, momentum=0.9)
  iterations = 1
}}
"""
LIBRARY = "def twice(x) = relu(batch_norm(relu(x)))\ntensor neg(x[B, D]) -> [b, d] = 0 - x[b, d]\n"


def compiled(folder: Path, file: str, include: str, data: str, name: str) -> tuple[str, str, list[str]]:
    """The Java class and CUDA source of NETWORK compiled from `folder/file`, and the names of its parameters,
    model state and optimizer state."""
    (folder / include).write_text(LIBRARY)
    text = NETWORK.format(include=include, data=data, name=name)
    c = compile_source(text, str(folder / file))
    assert c.program is not None
    b = build(c.program)
    # steps split into parts, so that the parts' comments and shared fields are fuzzed too
    with mock.patch.object(steps, "MAX_STATEMENTS_PER_METHOD", 6):
        p = java_program(b.program, b.train_plan, b.infer_plan, b.eval_plan)
    # a constant hoisted out of the step (passes/motion.py: `const<k>`) is named for what it is (`dloss`), not by text
    return p.java, p.cuda, [q.value.name for q in b.train_plan.graph.params if q.kind != "const"]


def shape(tokens: list[tuple[str, str]], keywords: frozenset[str]) -> list[tuple[str, str]]:
    """Tokens with what the source may change blanked: comments and string values, names that are not keywords."""
    out = []
    for kind, text in tokens:
        if kind in ("COMMENT", "STRING"):
            text = ""
        elif kind == "NAME" and text not in keywords:
            text = "name"
        out.append((kind, text))
    return out


def file_name(text: str) -> bool:
    try:
        raw = os.fsencode(text)
    except UnicodeError:
        return False
    return bool(raw) and b"/" not in raw and b"\0" not in raw and text not in (".", "..") and len(raw) < 200


def ddsl_string(text: str) -> bool:
    """A string the language takes: no quote, no line end, no NUL (which check refuses, test_limits.py)."""
    return '"' not in text and "\n" not in text and "\0" not in text


C_KEYWORDS = frozenset(
    """auto break case char const continue default do double else enum extern float for goto if inline int long
    register restrict return short signed sizeof static struct switch typedef union unsigned void volatile while
    __global__ __device__ __shared__ __restrict__ __syncthreads""".split()
)


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> tuple[list, list]:
    folder = tmp_path_factory.mktemp("baseline")
    java, cuda, _ = compiled(folder, "fuzz.ddsl", "lib.ddsl", "d.npz", "n")
    return shape(java_tokens(java), JAVA_KEYWORDS), shape(c_tokens(cuda), C_KEYWORDS)


def check_compilation(baseline: tuple[list, list], file: str, include: str, data: str, name: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        java, cuda, params = compiled(Path(tmp), file, include, data, name)
        read = relative_to_source(data, str(Path(tmp) / file))  # the train block's path is the .ddsl file's
    assert java.isascii() and cuda.isascii()
    tokens = java_tokens(java)
    assert shape(tokens, JAVA_KEYWORDS) == baseline[0]
    strings = {v for k, v in tokens if k == "STRING"}
    assert java_text(f"npz:{read}") in strings  # Java reads the very path Python reads
    # a parameter's name is one string; an optimizer state `opt/P/what` names P's field and `what` (P is a parameter)
    states = [p.split("/") for p in params if p.startswith("opt/") and p.count("/") == 2]
    plain = {p for p in params if not (p.startswith("opt/") and p.count("/") == 2)}
    assert {java_text(p) for p in plain} | {java_text(w) for _, _, w in states} <= strings
    assert shape(c_tokens(cuda), C_KEYWORDS) == baseline[1]


FILE_NAMES = TEXT.filter(file_name)
FUZZ = {
    "file": FILE_NAMES.map(lambda t: t + ".ddsl"),
    "include": FILE_NAMES.filter(ddsl_string),
    "data": TEXT.filter(ddsl_string),
    "name": st.text(st.characters(categories=["L"]), min_size=1, max_size=6).filter(str.isidentifier),
}


SCOPED = [HealthCheck.function_scoped_fixture]


@pytest.mark.slow  # 7 s (the default suite's four minutes)
@settings(max_examples=40, derandomize=True, deadline=None, suppress_health_check=SCOPED)
@given(**FUZZ)
def test_hostile_names_and_paths_change_no_token_of_the_output(
    baseline: tuple[list, list], file: str, include: str, data: str, name: str
) -> None:
    check_compilation(baseline, file, include, data, name)


@pytest.mark.parametrize("include", ["ReductionPass.", "MultiKernel(", "static final ReductionPass x"])
def test_a_file_named_like_a_runtime_class_changes_no_import(baseline: tuple[list, list], include: str) -> None:
    """The long fuzz found it (include 'ReductionPass.'): the emitter chose its imports by searching the whole class,
    comments included, where the include file's name appears."""
    check_compilation(baseline, "f.ddsl", include, "d.npz", "n")


@pytest.mark.slow
@settings(
    max_examples=1500, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(**FUZZ)
def test_hostile_names_and_paths_change_no_token_of_the_output_long(
    baseline: tuple[list, list], file: str, include: str, data: str, name: str
) -> None:
    check_compilation(baseline, file, include, data, name)


# ---- the proofs of concept (security_env.py), compiled and run ----


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_programs(tmp_path_factory)


@pytest.mark.java
@needs_javac
@pytest.mark.parametrize("cls", list(PROGRAMS))
def test_the_proofs_of_concept_run_no_injected_code(programs: Path, cls: str) -> None:
    r = run_java(programs, cls, "--iters", "2", "--data", "synthetic", "--json")
    assert r.returncode == 0, r.stderr
    assert "INJECTED" not in r.stdout + r.stderr
    assert len(json.loads(r.stdout)["losses"]) == 2


@pytest.mark.java
@needs_javac
@pytest.mark.parametrize("cls", ["DataPoc", "NewlinePoc"])
def test_java_and_python_read_the_same_data_path(programs: Path, cli, cls: str) -> None:
    file, _, data = PROGRAMS[cls]
    read = relative_to_source(data, str(programs / file))  # beside the .ddsl file, as an include is
    assert read == str(programs / data)
    r = run_java(programs, cls, "--iters", "1")
    assert r.returncode == 1
    assert f"npz data file not found: '{read}'" in r.stderr
    py = cli("run", str(programs / file), "--iters", "1")
    assert py.exit_code == 1
    assert f"npz data file not found: '{read}'" in py.output
