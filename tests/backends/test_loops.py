"""One loop generator (backends/loops.py) with a Java and a CUDA dialect: each backend's `Gen` keeps only its
dialect's parts, and the loops, bounds tests and accumulators the two print for one body are the same but for
the language's words."""

from __future__ import annotations

import inspect

import pytest

from deepdsl import api
from deepdsl.backends import java, loops
from deepdsl.backends.cuda import expressions as cuda_expressions
from deepdsl.backends.java import kernels as java_kernels
from deepdsl.ir.indexexpr import Affine, Apply, Const, Read, Reduce

SHARED = ("bind", "range_of", "count_of", "affine", "bounds", "strided", "generic_tests", "guarded", "expr",
          "compound", "start", "accumulate", "reduce")  # fmt: skip


@pytest.mark.parametrize("module", [java_kernels, cuda_expressions], ids=["java", "cuda"])
def test_each_backend_keeps_only_its_dialect(module) -> None:  # noqa: ANN001
    gen = module.Gen
    assert issubclass(gen, loops.LoopGen)
    assert [m for m in SHARED if m in vars(gen)] == []  # the walk is the shared generator's, not a copy
    assert not hasattr(module, "strides")
    for name in ("usable", "numbered", "read"):  # what a dialect must say
        assert name in vars(gen), name
    assert inspect.getsource(gen).count("\n") < 110


def _print(gen: loops.LoopGen, body, out) -> list[str]:  # noqa: ANN001
    for var, size in out:
        gen.bind(var, size)
    pre: list[str] = []
    value, _ = gen.expr(body, pre, "  ")
    return [*pre, value]


def test_one_body_reads_the_same_in_both_dialects() -> None:
    # out[i] = max over r < 3 of x[i + r - 1] (a window padded by one), then halved
    window = Reduce("max", (("r", 3),), Read(0, (Affine((("i", 1), ("r", 1)), -1),)))
    body = Apply("*", (Const(0.5), window))
    cuda = _print(cuda_expressions.Gen(((4,),)), body, (("i", 4),))
    java = _print(java_kernels.Gen(((4,),)), body, (("i", 4),))
    assert cuda == [
        "  float s0 = __int_as_float(0xff800000);",
        "  for (int r = 0; r < 3; r++) {",
        "    s0 = fmaxf(s0, (i + r - 1 >= 0 && i + r - 1 < 4 ? in0[i + r - 1] : 0.0f));",
        "  }",
        "(0.5f * s0)",
    ]
    assert java == [
        "  float s0 = Float.NEGATIVE_INFINITY;",
        "  for (int r = 0; r < 3; r++) {",
        "    s0 = Math.max(s0, (i + r - 1 >= 0 && i + r - 1 < 4 ? a0[p0 + i + r - 1] : 0f));",
        "  }",
        "(0.5f * s0)",
    ]


def test_a_taken_name_is_renamed_in_each_dialects_way() -> None:
    cuda, java = cuda_expressions.Gen(((2,),)), java_kernels.Gen(((2,),), taken={"i"})
    assert cuda.bind("int", 2) == "int_2"  # a C keyword
    assert java.bind("i", 2) == "i2"


@pytest.mark.parametrize("gen", [java_kernels.Gen, cuda_expressions.Gen], ids=["java", "cuda"])
@pytest.mark.parametrize("name", ["no0", "sto1", "n0_1", "st2_0", "in0", "s3"])
def test_a_reserved_name_is_renamed_to_one_that_is_not(gen, name: str) -> None:  # noqa: ANN001
    # Java's renaming appended digits, so a name of its sizes (`no0`: the output's first dim) stayed one for ever
    # and bind looped (a tensor function `-> [no0: B, c]` hung `deepdsl compile`)
    g = gen(((2,),))
    other = name
    for k in range(2, 5):
        if not g.RESERVED.fullmatch(other):
            break
        other = g.numbered(name, k)
    assert not g.RESERVED.fullmatch(other), other
    assert g.bind(name, 2) == other


def test_a_tensor_function_may_name_its_index_as_a_size_is_named(tmp_path) -> None:  # noqa: ANN001
    src = tmp_path / "flip.ddsl"
    src.write_text(
        "network Flip\ninput x : [4, 8]\nlabel y : [4] classes 8\n"
        "tensor flip(x[B, C]) -> [no0: B, n0_1: C] = x[B - 1 - no0, n0_1]\n"
        "layer fc = full(8)\nloss = softmax_cross_entropy(fc(flip(x)), y)\n"
        "train {\n  optimizer = sgd(lr=0.1)\n  iterations = 1\n}\n"
    )
    c = api.compile_file(src, stop_at="plan")
    b = c.build
    text = java.java_program(b.program, b.train_plan, b.infer_plan, b.eval_plan).java
    assert "no0_2" in text and "n0_1_2" in text
