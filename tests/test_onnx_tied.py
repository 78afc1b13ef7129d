"""A head tied to its token embedding through ONNX: `deepdsl export` writes `full(tied=tok)` as a Gemm (transB=1) of
the table's one initialiser, which the Gather reads too; `deepdsl import` reads a MatMul or Gemm whose weight is an
embedding's table, value for value, back as `full(tied=...)` (as the very same initialiser, and as the copy of its
transpose that PyTorch's exporters write for the head), `--no-share` keeps the two apart, and ONNX Runtime gives
the same outputs throughout. (scripts/pytorch_onnx_models.py --only gpt2_like runs PyTorch's own exports.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import ROOT

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from test_onnx import close  # noqa: E402
from test_onnx_breadth import feeds_for, run_deepdsl, run_ort  # noqa: E402

from deepdsl import api  # noqa: E402
from deepdsl.autodiff import infer_program  # noqa: E402
from deepdsl.backends.onnx_export import export_graph  # noqa: E402
from deepdsl.interop import initial_arrays  # noqa: E402
from deepdsl.onnx_import import import_model  # noqa: E402

EXAMPLE = ROOT / "networks" / "examples" / "tied_lm.ddsl"
N, T, V, D = 2, 3, 11, 4


def test_the_tied_example_exports_one_table_and_imports_as_a_tied_head_again(tmp_path: Path) -> None:
    program = api.compile_file(str(EXAMPLE), {"N": 2}).program
    arrays = initial_arrays(program)
    model = export_graph(infer_program(program.graph), arrays, 17)
    assert [i.name for i in model.graph.initializer if i.name.startswith("tok")] == ["tok.W"]
    readers = [nd for nd in model.graph.node if "tok.W" in nd.input]
    assert sorted(nd.op_type for nd in readers) == ["Gather", "Gemm"]
    gemm = next(nd for nd in readers if nd.op_type == "Gemm")
    assert {a.name: helper.get_attribute_value(a) for a in gemm.attribute} == {"transB": 1}
    feeds = feeds_for(program, np.random.default_rng(4))
    want = run_deepdsl(program, arrays, feeds)
    close(run_ort(model, feeds), want)
    onnx.save(model, tmp_path / "m.onnx")
    for share in (True, False):
        got = import_model(tmp_path / "m.onnx", 2, share=share)
        again = api.compile_source(got.text, "again.ddsl").program
        extra = 0 if share else 32 * 16  # --no-share: the head's own copy of the table
        assert again.graph.parameter_count == program.graph.parameter_count + extra
        assert ("layer head = full(bias=false, tied=tok)" in got.text) == share, got.text
        assert got.tied == ((("head", "tok"),) if share else ())
        assert [k for k in got.arrays if k.startswith(("tok", "head"))] == (["tok.W"] if share else ["tok.W", "head.W"])
        ours = {d.value.name: v for d, v in zip(infer_program(again.graph).inputs, feeds.values())}
        close(run_deepdsl(again, got.arrays, ours), want)


def lm(head: str, table: np.ndarray) -> object:
    """Token ids [N, T] -> Gather of the table `wte` [V, D] -> a head as PyTorch's exporters write a tied one (a
    MatMul by `wte_t`, an initialiser of its own holding the table's transpose; `bias`: then an Add of `head.b`), or
    deepdsl's (`gemm`: rows [N·T, D] through a Gemm with transB=1 of `wte` itself and a bias)."""
    rng = np.random.default_rng(5)
    inits = {"wte": table, "head.b": rng.standard_normal(V).astype(np.float32)}
    nodes = [helper.make_node("Gather", ["wte", "ids"], ["e"], name="/wte/Gather")]
    if head == "gemm":
        inits["rows"] = np.array([N * T, D], np.int64)
        inits["back"] = np.array([N, T, V], np.int64)
        nodes += [helper.make_node("Reshape", ["e", "rows"], ["r"], name="/Reshape"),
                  helper.make_node("Gemm", ["r", "wte", "head.b"], ["s"], name="/head/Gemm", transB=1),
                  helper.make_node("Reshape", ["s", "back"], ["out"], name="/Reshape_1")]  # fmt: skip
    else:
        inits["wte_t"] = (table if head != "differs" else table + np.eye(V, D, dtype=np.float32) * 1e-3).T.copy()
        last = "out" if head != "bias" else "m"
        nodes.append(helper.make_node("MatMul", ["e", "wte_t"], [last], name="/head/MatMul"))
        if head == "bias":
            nodes.append(helper.make_node("Add", ["m", "head.b"], ["out"], name="/head/Add"))
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, [N, T])
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, [N, T, V])
    init = [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()]
    m = helper.make_model(helper.make_graph(nodes, "torch_jit", [ids], [out], init),
                          opset_imports=[helper.make_opsetid("", 17)])  # fmt: skip
    m.ir_version = 8
    onnx.checker.check_model(m, full_check=True)
    return m


RANDOM = np.random.default_rng(6).standard_normal((V, D)).astype(np.float32)

CASES = {  # head, table -> the head's line, the parameters of the imported network
    "matmul": ("matmul", RANDOM, "full(bias=false, tied=wte)", V * D),
    "matmul_add": ("bias", RANDOM, "full(tied=wte)", V * D + V),
    "gemm": ("gemm", RANDOM, "full(tied=wte)", V * D + V),
    "other_values": ("differs", RANDOM, f"full({V}, bias=false)", 2 * V * D),  # not the table: a weight of its own
    "one_value": ("matmul", np.full((V, D), 0.5, np.float32), f"full({V}, bias=false)", 2 * V * D),  # tells nothing
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_head_whose_weight_is_the_table_imports_tied(cli, tmp_path: Path, case: str) -> None:  # noqa: ANN001
    head, table, line, count = CASES[case]
    model = lm(head, table)
    onnx.save(model, tmp_path / "m.onnx")
    got = import_model(tmp_path / "m.onnx", N, loss=False)
    assert f"layer head = {line}" in got.text, got.text
    program = api.compile_source(got.text, "m.ddsl").program
    assert program.graph.parameter_count == count
    ids = np.random.default_rng(7).integers(0, V, (N, T)).astype(np.int64)
    close(run_deepdsl(program, got.arrays, {"ids": ids}), run_ort(model, {"ids": ids}))
    r = cli("import", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "m.ddsl"), "--no-loss")
    assert r.exit_code == 0, r.output
    assert ("note: heads tied to an embedding, as their weight is its table: head (the table of wte)" in r.output) == (
        "tied" in line
    )
    r = cli("import", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "apart.ddsl"), "--no-loss", "--no-share")
    assert r.exit_code == 0 and "tied" not in (tmp_path / "apart.ddsl").read_text(), r.output
