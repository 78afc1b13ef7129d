"""Elaboration semantics: naming, sharing, defs, control flow, consts, tensor functions, includes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import HEADER, compile_text, error_text

from deepdsl.ir import indexexpr as ie
from deepdsl.ir.printer import format_graph
from deepdsl.ir.verify import check_graph


def graph(body: str, **sets):  # noqa: ANN201
    return check_graph(compile_text(HEADER + body, sets).program.graph)


def names(g) -> list[str]:  # noqa: ANN001
    return [p.value.name for p in g.params]


def test_layer_binding_shares_parameters_and_names_them() -> None:
    g = graph("layer c = conv(3, kernel=3, pad=1)\nh = c(c(x))\nloss = mse(h, x)\n")
    assert names(g) == ["c.W", "c.b"]
    assert [s.op for s in g.stmts] == ["conv2d", "bias_add", "conv2d", "bias_add", "mse"]


def test_def_calls_make_fresh_parameters_with_ordinals() -> None:
    body = "def blk(x, c) = relu(conv(x, c, kernel=3, pad=1))\nh = blk(blk(x, 4), 4)\nloss = mse(h, blk(x, 4))\n"
    g = graph(body)
    # the binding names the outermost call; the inner one is counted in the top-level scope
    assert names(g) == ["blk1.conv1.W", "blk1.conv1.b", "h.conv1.W", "h.conv1.b", "blk2.conv1.W", "blk2.conv1.b"]


def test_layer_bound_def_is_shared_and_scoped_by_the_binding() -> None:
    body = (
        'def body(x) { h = conv(x, 3, kernel=1, bias=false)\n return batch_norm(h, name="bn") }\n'
        "layer model = body\nloss = mse(model(model(x)), x)\n"
    )
    g = graph(body)
    assert names(g) == [
        "model.conv1.W",
        "model.bn.running_mean",
        "model.bn.running_var",
        "model.bn.gamma",
        "model.bn.beta",
    ]
    assert [p.kind for p in g.params] == ["param", "state", "state", "param", "param"]


def test_explicit_name_replaces_the_ordinal_and_duplicates_are_errors() -> None:
    g = graph('h = relu(conv(x, 4, kernel=3, name="stem"))\nloss = mse(h, h)\n')
    assert names(g) == ["stem.W", "stem.b"]
    err = error_text(
        HEADER + 'def f(x) = conv(conv(x, 3, kernel=1, name="a"), 3, kernel=1, name="a")\nloss = mse(f(x), x)\n'
    )
    assert "parameter name 'f1.a.W' is already used" in err


def test_partial_def_is_a_function_waiting_for_its_input() -> None:
    body = "def blk(x, c, k=3) = conv(x, c, kernel=k, pad=1)\nlayer b = blk(3)\nloss = mse(b(b(x)), x)\n"
    g = graph(body)
    assert names(g) == ["b.conv1.W", "b.conv1.b"]


def test_loops_and_conditions_unroll_at_compile_time() -> None:
    body = (
        "def deep(x, n) {\n for i in 0 .. n { if i % 2 == 0 { x = relu(x) } else { x = tanh(x) } }\n return x }\n"
        "h = deep(x, 5)\nloss = mse(if rank(h) == 4 then h else x, x)\n"
    )
    g = graph(body)
    assert [s.op for s in g.stmts] == ["relu", "tanh", "relu", "tanh", "relu", "mse"]


def test_consts_and_shape_queries_and_set_override() -> None:
    body = "const C = 2 * channels(x) + dim(x, 2) / 3\nh = conv(x, C, kernel=1)\nloss = mse(h, h)\n"
    assert graph(body).params[0].value.type.shape == (8, 3, 1, 1)  # 2 * 3 + 8 // 3
    assert graph(body, N=7).inputs[0].value.type.shape == (7, 3, 8, 8)


def test_scalar_arithmetic_lowers_to_scalar_ops() -> None:
    g = graph("h = 1 - 2 * x / 4 + x ^ 2\nloss = mse(h, x) + 0.5 * mse(x, h)\n")
    ops = [(s.op, s.a.get("value")) for s in g.stmts]
    assert ops[:4] == [("mul_scalar", 2.0), ("mul_scalar", 0.25), ("rsub_scalar", 1.0), ("pow_scalar", 2.0)]


def test_tensor_function_lowers_to_indexed_statements_with_inferred_ranges() -> None:
    body = (
        "tensor ln(x[B, D]) -> [b, d] {\n  param g[D] = constant(1)\n  mu[b] = sum[d] x[b, d] / D\n"
        "  return g[d] * (x[b, d] - mu[b])\n}\n"
        "h = ln(flatten(x))\nloss = mse(h, h)\n"
    )
    g = graph(body)
    assert names(g) == ["h.g"]
    mu, out = [s for s in g.stmts if s.op == "indexed"]
    assert mu.a["out"] == (("b", 4),) and out.a["out"] == (("b", 4), ("d", 192))
    # a reduction extends as far right as it can: the division is inside the sum
    assert mu.a["body"] == ie.Reduce(
        "sum", (("d", 192),), ie.Apply("/", (ie.Read(0, (ie.Affine.var("b"), ie.Affine.var("d"))), ie.Const(192.0)))
    )


def test_reduction_variables_are_renamed_apart_from_output_indices() -> None:
    g = graph(
        "tensor centre(x[B, D]) -> [b, d] = x[b, d] - (sum[d] x[b, d]) / D\nh = centre(flatten(x))\nloss = mse(h, h)\n"
    )
    assert "(sum[d_2:192] %1[b, d_2])" in format_graph(g)


def test_tensor_function_with_explicit_ranges_like_a_convolution() -> None:
    body = (
        "tensor my_conv(x[N, C, H, W], w[F, C, K, K]) -> [n, f, i: H - K + 1, j: W - K + 1] =\n"
        "  sum[c, kh: K, kw: K] x[n, c, i + kh, j + kw] * w[f, c, kh, kw]\n"
        "tensor wgt(x[N, C, H, W]) -> [f: 5, c: C, a: 3, b: 3] = 0.1\n"
        "h = my_conv(x, wgt(x))\nloss = mse(h, h)\n"
    )
    g = graph(body)
    conv = g.stmts[-2]
    assert conv.out.type.shape == (4, 5, 6, 6)
    assert "(sum[c:3, kh:3, kw:3] (%x[n, c, i + kh, j + kw] * %1[f, c, kh, kw]))" in format_graph(g)


def test_include_brings_defs_into_scope(tmp_path) -> None:  # noqa: ANN001
    (tmp_path / "lib.ddsl").write_text("def twice(x) = relu(relu(x))\n")
    main = tmp_path / "main.ddsl"
    main.write_text(HEADER + 'include "lib.ddsl"\nloss = mse(twice(x), x)\n')
    from deepdsl import api

    g = api.compile_file(main).program.graph
    assert [s.op for s in g.stmts] == ["relu", "relu", "mse"]


def test_value_numbering_computes_a_shared_network_once() -> None:
    g = graph("layer f = full(10)\nnet = f o flatten\nloss = softmax_cross_entropy(net(x), y)\npredict = net(x)\n")
    assert [s.op for s in g.stmts] == ["reshape", "linear", "bias_add", "softmax_cross_entropy"]
    assert g.output("predict") == g.stmts[2].out


@pytest.mark.parametrize(
    "body, message",
    [
        ("loss = mse(x, x)\nloss = mse(x, x)\n", "`loss` is defined twice"),
        ("def f(x) = g(x)\ndef g(x) = f(x)\nloss = mse(f(x), x)\n", "recursive call of 'f' (f -> g -> f)"),
        ("h = x\nloss = mse(h, x)\nh = x\n", "'h' is defined twice"),
        ("loss = mse(h, x)\nh = x\n", "'h' is used before its definition on line 6"),
        ("layer c = conv(3, kernel=1)\nloss = mse(c(flatten(x)), x)\n", "conv expects a 4-D input"),
        ("loss = mse(x, x)\ntrain { iterations = -1 }\n", "'iterations' must be an integer of at least 0"),
        ('loss = mse(x, x)\ntrain { optimizer = mnist("d") }\n', "'optimizer' must be one of sgd(...), adam(...)"),
        ("const Q = 10 / 0\nloss = mse(x, x)\n", "division by zero"),
        ("loss = mse(max_pool(x, 9), x)\n", "does not fit an input of size 8"),
        ("layer d = dropout(1.5)\nloss = mse(d(x), x)\n", "argument 'p' of dropout must be less than 1"),
        (
            "layer b = batch_norm(momentum=2)\nloss = mse(b(x), x)\n",
            "'momentum' of batch_norm must be at most 1, got 2",
        ),
        ("layer b = batch_norm(momentum=-0.1)\nloss = mse(b(x), x)\n", "'momentum' of batch_norm must be at least 0"),
        ("layer n = lrn(k=0)\nloss = mse(n(x), x)\n", "argument 'k' of lrn must be at least"),
        ("layer n = lrn(beta=-1)\nloss = mse(n(x), x)\n", "argument 'beta' of lrn must be at least 0"),
        ("loss = mse(x, x)\ntrain { optimizer = sgd(lr=0.1, momentum=1) }\n", "'momentum' of sgd must be less than 1"),
        ("def f(a, a) = a\nloss = mse(x, x)\n", "'a' names two parameters of 'f'"),
        ("tensor t(a[B], a[B]) -> [n] = a[n]\nloss = mse(x, x)\n", "'a' names two parameters of 't'"),
    ],
)
def test_user_errors(body: str, message: str) -> None:
    assert message in error_text(HEADER + body)


def test_a_train_block_using_a_failed_definition_reports_only_the_first_error() -> None:
    err = error_text(HEADER + "lr = relux\nloss = mse(x, x)\ntrain { optimizer = sgd(lr=lr) }\n")
    assert "unknown name 'relux'" in err and err.count("error:") == 1


@pytest.mark.parametrize("name", ["Network", "Buf", "String", "Settings", "Math", "System", "Kernel", "Device", "buf"])
def test_a_network_may_not_take_a_name_the_generated_java_needs(name: str) -> None:
    err = error_text(HEADER.replace("network T", f"network {name}") + "loss = mse(x, x)\n")
    assert f"'{name}' cannot name a network: its Java class {name[:1].upper() + name[1:]} would hide" in err
    assert "t.ddsl:1:9: error:" in err


def test_every_runtime_class_the_generated_program_imports_is_reserved() -> None:
    from deepdsl.frontend.javanames import reserved_class_names

    text = (Path(__file__).resolve().parents[1] / "golden" / "java" / "LeNet.java").read_text()
    imported = set(re.findall(r"^import (?:static )?deepdsl\.runtime\.(\w+)", text, re.M))
    assert {"Buf", "Network", "Kernel"} <= imported <= set(reserved_class_names())


def test_a_tensor_function_no_one_calls_is_checked_and_leaves_no_trace() -> None:
    uncalled = "tensor f(a[B, D]) -> [b, d] = a[b, d] * gain\nloss = mse(x, x)\n"
    assert "unknown name 'gain' in a tensor body" in error_text(HEADER + uncalled)
    assert "'%' is not a scalar operator" in error_text(HEADER + uncalled.replace("* gain", "% 2"))
    assert "'a' has rank 2" in error_text(HEADER + uncalled.replace("a[b, d] * gain", "a[b]"))
    # what holds only for some sizes is not judged on stand-in sizes; nothing of the check reaches the program
    fine = "tensor f(a[B, D]) -> [b, d: D - 20] = a[b, d + 20] * p\nloss = mse(x, x)\n"
    head = HEADER + "const p = 2\n"
    plain = compile_text(head + "\nloss = mse(x, x)\n").program.graph
    checked = compile_text(head + fine).program.graph
    assert format_graph(checked) == format_graph(plain)


def test_an_ordinal_after_a_digit_is_set_off_by_an_underscore() -> None:
    text = HEADER + (
        "def dwconv3(x) = conv(x, 3, kernel=3, pad=1, groups=3)\n"
        "def block(x) = dwconv3(dwconv3(x))\n"
        "loss = mse(block(x), x)\n"
    )
    names = [p.value.name for p in compile_text(text).program.graph.params]
    assert names == ["block1.dwconv3_1.conv1.W", "block1.dwconv3_1.conv1.b",
                     "block1.dwconv3_2.conv1.W", "block1.dwconv3_2.conv1.b"]  # fmt: skip


def test_a_utf8_byte_order_mark_is_accepted(tmp_path: Path, cli) -> None:  # noqa: ANN001
    (tmp_path / "lib.ddsl").write_bytes(b"\xef\xbb\xbfdef twice(x) = x + x\n")
    text = HEADER + 'include "lib.ddsl"\nloss = mse(twice(x), x)\n'
    (tmp_path / "bom.ddsl").write_bytes(b"\xef\xbb\xbf" + text.encode())
    r = cli("check", str(tmp_path / "bom.ddsl"))
    assert r.exit_code == 0, r.output
    (tmp_path / "bad.ddsl").write_bytes(b"\xef\xbb\xbfnetwork 1T\n")  # columns count from after the mark
    assert f"{tmp_path / 'bad.ddsl'}:1:9: error:" in cli("check", str(tmp_path / "bad.ddsl")).stderr
