"""Hostile ONNX models (issue 36): external data is read from the model's own folder only, with its offsets and
lengths checked against the file; what a model says that the language cannot take (NaN attributes, dims that lie,
an index out of range, a Cast to string, huge attributes, long names) is a clear error (exit 1) or imports as a
network that checks; never an internal error, never a file that the next command refuses."""

from __future__ import annotations

import os
import random
import threading

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

SECRET = np.asarray([1.5, 2.5, 3.5], np.float32)  # what a private file holds: it must never reach a parameter


def model(nodes: list, inits: list, x_shape: tuple = (1, 4), out: str = "y", out_rank: int | None = None,
          inputs: list | None = None, name: str = "g", opset: int = 13):  # fmt: skip  # noqa: ANN201
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))
    y = helper.make_tensor_value_info(out, TensorProto.FLOAT, [f"d{i}" for i in range(out_rank or len(x_shape))])
    g = helper.make_graph(nodes, name, inputs or [x], [y], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


W = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(3, 4) / 10, "W")


def gemm(x: str = "x", out: str = "y", **attrs):  # noqa: ANN003, ANN201
    return helper.make_node("Gemm", [x, "W"], [out], transB=1, **attrs)


def external(name: str, location: str, dims: list[int], offset: int | None = None, length: int | None = None):  # noqa: ANN201
    """A float tensor that keeps its data in `location`."""
    t = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=dims, data_location=TensorProto.EXTERNAL)
    for key, value in (("location", location), ("offset", offset), ("length", length)):
        if value is not None:
            entry = t.external_data.add()
            entry.key, entry.value = key, str(value)
    return t


def constant_model(location: str, **kw):  # noqa: ANN003, ANN201
    """Gemm, then Add of a Constant [3] whose value is external data at `location` (the issue's proof)."""
    c = helper.make_node("Constant", [], ["c"], value=external("c", location, [3], **kw))
    return model([gemm(out="h"), c, helper.make_node("Add", ["h", "c"], ["y"])], [W])


def run_import(cli, tmp_path, m, name: str = "m.onnx"):  # noqa: ANN001, ANN201
    folder = tmp_path / "model"
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(m, folder / name)
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    r = cli("import", str(folder / name), "-o", str(out / "n.ddsl"), "--no-loss")
    assert "Traceback" not in r.output and "internal error" not in r.output, r.output
    return r, out


def refused(cli, tmp_path, m, message: str) -> str:  # noqa: ANN001
    r, out = run_import(cli, tmp_path, m)
    assert r.exit_code == 1, r.output
    assert message in r.stderr, r.stderr
    assert not list(out.iterdir()), "nothing is written when the import is refused"
    return r.stderr


# ---- external data: the model's folder only ----


@pytest.fixture
def secret_in_cwd(tmp_path, monkeypatch):  # noqa: ANN001, ANN201
    """A private file in the current directory (which is not the model's folder), and one above the model's."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (cwd / "secret.bin").write_bytes(SECRET.tobytes())
    (tmp_path / "secret.bin").write_bytes(SECRET.tobytes())
    monkeypatch.chdir(cwd)
    return cwd / "secret.bin"


def _no_secret_written(tmp_path) -> None:  # noqa: ANN001
    for p in (tmp_path / "out").iterdir():
        assert SECRET.tobytes() not in p.read_bytes(), f"the private file's bytes are in {p}"


def test_a_constants_external_data_is_not_read_from_the_current_directory(cli, tmp_path, secret_in_cwd) -> None:  # noqa: ANN001
    """The issue's proof: the Constant's `secret.bin` was read from the cwd, its bytes saved as `Add.k`."""
    refused(cli, tmp_path, constant_model("secret.bin"), "keeps its data in 'secret.bin', which cannot be read")
    _no_secret_written(tmp_path)


@pytest.mark.parametrize(
    ("location", "message"),
    [("SECRET", "an absolute path"), ("../secret.bin", "which climbs out of the model's folder"),
     ("sub/../../secret.bin", "which climbs out"), ("", "which names no file")],
)  # fmt: skip
def test_an_absolute_or_climbing_location_is_refused(cli, tmp_path, secret_in_cwd, location: str, message: str) -> None:  # noqa: ANN001
    location = str(secret_in_cwd) if location == "SECRET" else location
    refused(cli, tmp_path, constant_model(location), message)


def test_a_link_out_of_the_models_folder_is_refused(cli, tmp_path, secret_in_cwd) -> None:  # noqa: ANN001
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "weights.bin").symlink_to(secret_in_cwd)
    (tmp_path / "model" / "sub").symlink_to(secret_in_cwd.parent, target_is_directory=True)
    refused(cli, tmp_path, constant_model("weights.bin"), "which leads out of the model's folder (through a link)")
    refused(cli, tmp_path, constant_model("sub/secret.bin"), "which leads out of the model's folder")
    _no_secret_written(tmp_path)


def test_a_link_within_the_models_folder_is_read(cli, tmp_path) -> None:  # noqa: ANN001
    (tmp_path / "model" / "data").mkdir(parents=True)
    (tmp_path / "model" / "data" / "c.bin").write_bytes(b"\0" * 8 + SECRET.tobytes())
    (tmp_path / "model" / "c.bin").symlink_to(tmp_path / "model" / "data" / "c.bin")
    r, out = run_import(cli, tmp_path, constant_model("c.bin", offset=8))
    assert r.exit_code == 0, r.output
    with np.load(out / "n.npz") as z:
        (k,) = [z[n] for n in z.files if n.endswith(".k")]
    np.testing.assert_array_equal(k, SECRET)


@pytest.mark.parametrize(
    ("kw", "size", "message"),
    [({"offset": 8, "length": 12}, 16, "at offset 8, 12 bytes, past the end of the file (16 bytes)"),
     ({"offset": 8}, 16, "8 bytes, but its dims [3] need 12"),  # the rest of the file, too short
     ({"offset": 4, "length": 12}, 12, "past the end of the file (12 bytes)"),
     ({"offset": 20}, 12, "at offset 20"),
     ({"length": 8}, 12, "8 bytes, but its dims [3] need 12"),
     ({}, 16, "16 bytes, but its dims [3] need 12"),
     ({"offset": "-4"}, 12, "at offset '-4', which is not a byte count"),
     ({"length": "1e3"}, 12, "at length '1e3', which is not a byte count")],
)  # fmt: skip
def test_offsets_and_lengths_past_the_file_are_refused(cli, tmp_path, kw: dict, size: int, message: str) -> None:  # noqa: ANN001
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "c.bin").write_bytes(bytes(size))
    refused(cli, tmp_path, constant_model("c.bin", **kw), message)


def test_a_fifo_as_external_data_is_refused_without_waiting(cli, tmp_path) -> None:  # noqa: ANN001
    (tmp_path / "model").mkdir()
    os.mkfifo(tmp_path / "model" / "c.bin")
    opened = threading.Timer(30, lambda: open(tmp_path / "model" / "c.bin", "wb").close())  # unblocks a reader
    opened.start()
    try:
        refused(cli, tmp_path, constant_model("c.bin"), "which is not a regular file")
    finally:
        opened.cancel()


def test_initialisers_in_an_external_file_load_from_the_models_folder(cli, tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """As PyTorch's exporter saves a large model (`m.onnx` beside `m.onnx.data`); they were refused before. The
    import runs from another folder: the location is the model's folder's, not the cwd's."""
    w = np.random.default_rng(36).standard_normal((10, 300)).astype(np.float32)
    m = model([helper.make_node("Gemm", ["x", "W"], ["y"], transB=1)], [numpy_helper.from_array(w, "W")],
              x_shape=(1, 300))  # fmt: skip
    (tmp_path / "model").mkdir()
    onnx.save(m, tmp_path / "model" / "m.onnx", save_as_external_data=True, location="m.onnx.data",
              size_threshold=0)  # fmt: skip
    assert os.path.getsize(tmp_path / "model" / "m.onnx.data") >= w.nbytes
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    (tmp_path / "out").mkdir()
    r = cli("import", str(tmp_path / "model" / "m.onnx"), "-o", str(tmp_path / "out" / "n.ddsl"), "--no-loss")
    assert r.exit_code == 0, r.output
    with np.load(tmp_path / "out" / "n.npz") as z:
        np.testing.assert_array_equal(z["Gemm_0.W"], w)
    assert cli("check", str(tmp_path / "out" / "n.ddsl")).exit_code == 0
    # the same rules hold for initialisers: a location that climbs out is refused
    m2 = onnx.load(tmp_path / "model" / "m.onnx", load_external_data=False)
    m2.graph.initializer[0].external_data[0].value = "../model/m.onnx.data"
    refused(cli, tmp_path / "again", m2, "which climbs out of the model's folder")


# ---- what was an internal error (exit 3) ----

BN = [numpy_helper.from_array(np.ones(2, np.float32), n) for n in "sbmv"]


def _bn(**attrs):  # noqa: ANN003, ANN202
    return model([helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], **attrs)], BN,
                 x_shape=(1, 2, 4, 4))  # fmt: skip


def _lying(dims: list[int]):  # noqa: ANN202
    t = helper.make_tensor("W", TensorProto.FLOAT, [3, 4], vals=np.ones(12, np.float32).tobytes(), raw=True)
    t.dims[:] = dims
    return model([gemm()], [t])


def _shape_then(op_nodes: list, inits: list = ()):  # noqa: ANN202
    """Shape of x -> op_nodes (ending in `g`) -> Reshape(x, g): a shape computation as exporters write them."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]), *op_nodes, helper.make_node("Reshape", ["x", "g"], ["y"])]
    return model(nodes, list(inits), x_shape=(1, 2, 2, 2), out_rank=1)


EXIT_3 = {  # the 11 files that gave exit 3, by kind, and what each says now
    "leaky_alpha_nan": (model([helper.make_node("LeakyRelu", ["x"], ["y"], alpha=float("nan"))], []),
                        "its attribute alpha=nan is not a finite number"),
    "lrn_beta_inf": (model([helper.make_node("LRN", ["x"], ["y"], size=3, beta=float("inf"))], [],
                           x_shape=(1, 2, 4, 4)), "its attribute beta=inf is not a finite number"),
    "bn_epsilon_nan": (_bn(epsilon=float("nan")), "its attribute epsilon=nan is not a finite number"),
    "bn_momentum_inf": (_bn(momentum=float("-inf")), "its attribute momentum=-inf is not a finite number"),
    "gemm_alpha_inf": (model([gemm(alpha=float("inf"))], [W]), "its attribute alpha=inf is not a finite number"),
    "dims_lie_more": (_lying([300, 400]), "its dims [300, 400] need 480,000 bytes of data, it holds 48"),
    "dims_lie_less": (_lying([3, 2]), "its dims [3, 2] need 24 bytes of data, it holds 48"),
    "gather_out_of_range": (_shape_then([helper.make_node("Gather", ["s", "i"], ["g"])],
                                        [numpy_helper.from_array(np.asarray([7], np.int64), "i")]),
                            "node 'Gather_1' (Gather, opset 13): indices [7] out of range for an axis of 4"),
    "gather_negative": (_shape_then([helper.make_node("Gather", ["s", "i"], ["g"])],
                                    [numpy_helper.from_array(np.asarray([0, -9], np.int64), "i")]),
                        "indices [0, -9] out of range for an axis of 4"),
    "cast_to_string": (_shape_then([helper.make_node("Cast", ["s"], ["g"], to=TensorProto.STRING)]),
                       "a Cast to STRING: deepdsl folds Casts to numbers only"),
    "string_constant": (model([gemm(out="h"), helper.make_node("Constant", [], ["c"], value=helper.make_tensor(
        "c", TensorProto.STRING, [1], [b"x"])), helper.make_node("Add", ["h", "c"], ["y"])], [W]),
                        "holds STRING elements; deepdsl reads tensors of numbers"),
    "weights_nan": (model([gemm()], [numpy_helper.from_array(np.full((3, 4), np.nan, np.float32), "W")]),
                    "its parameter W holds NaN or infinite values"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(EXIT_3))
def test_what_gave_an_internal_error_is_a_clear_error(cli, tmp_path, case: str) -> None:  # noqa: ANN001
    m, message = EXIT_3[case]
    refused(cli, tmp_path, m, message)


# ---- what imported, then failed in check, javac or the runner ----

CONV_W = numpy_helper.from_array(np.ones((2, 1, 1, 1), np.float32), "W")
LATER = {
    "groups_2_62": (model([helper.make_node("Conv", ["x", "W"], ["y"], group=2**62)], [CONV_W], x_shape=(1, 2, 4, 4)),
                    "groups=4611686018427387904: the language's conv takes at most 2,147,483,647 (2^31 - 1)"),
    "lrn_size_2_40": (model([helper.make_node("LRN", ["x"], ["y"], size=2**40 + 1)], [], x_shape=(1, 2, 4, 4)),
                      "size=1099511627777: the language's lrn takes at most 2,147,483,647"),
    "conv_stride_2_31": (model([helper.make_node("Conv", ["x", "W"], ["y"], strides=[2**31, 1])], [CONV_W],
                               x_shape=(1, 2, 4, 4)), "stride=(2147483648, 1): the language's conv takes at most"),
    "pool_stride_2_31": (model([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[1, 1], strides=[2**31] * 2)],
                               [], x_shape=(1, 2, 4, 4)), "stride=2147483648: the language's max_pool takes at most"),
    "pool_pads_2_20": (model([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], pads=[0, 0, 0, 2**20])],
                             [], x_shape=(1, 2, 4, 4)), "padding of more than a window"),  # listed its windows: OOM
    "pool_input_2_40": (model([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[1, 1], pads=[0, 0, 0, 1])],
                              [], x_shape=(1, 2, 4, 2**40)), "1,099,511,627,777 positions along W"),
    "huge_input": (model([helper.make_node("Relu", ["x"], ["y"])], [], x_shape=(1, 2**40)),
                   "imports as a network that does not check: input 'x' f32[1,1099511627776] has"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(LATER))
def test_what_a_later_stage_refused_is_refused_at_import(cli, tmp_path, case: str) -> None:  # noqa: ANN001
    m, message = LATER[case]
    refused(cli, tmp_path, m, message)


def _pad(mode: str, pads: list[int], x_shape: tuple = (1, 2, 4, 4), opset: int = 13):  # noqa: ANN202
    pads_init = numpy_helper.from_array(np.asarray(pads, np.int64), "pads")
    return model([helper.make_node("Pad", ["x", "pads"], ["y"], mode=mode)], [pads_init], x_shape=x_shape, opset=opset)


PAD_AND_GROUP_NORM = {  # every size bounded before a tensor function's text is built: a pad's range is never listed
    "edge_2_62": (_pad("edge", [0, 0, 2**62, 2**62, 0, 0, 2**62, 2**62]), "Integer overflow"),  # ONNX's own check
    "edge_2_40": (_pad("edge", [0, 0, 2**40, 0, 0, 0, 0, 0]), "make 8,796,093,022,240 elements; at most 2,130,706,432"),
    "constant_2_40": (_pad("constant", [0, 0, 0, 2**40, 0, 0, 0, 0]), "8,796,093,022,240 elements; at most"),
    "reflect_2_40": (_pad("reflect", [0, 0, 2**40, 0, 0, 0, 0, 0]), "a reflected pad must be smaller than the axis"),
    "wrap_2_40": (_pad("wrap", [0, 0, 0, 2**40, 0, 0, 0, 0], opset=19), "deepdsl wraps at most once"),
    "negative_past_the_axis": (_pad("constant", [0, 0, -(2**62), 0, 0, 0, 2**62, 0]),
                               "crop axis 2 of size 4 by 4611686018427387904"),
    "negative_both_ends": (_pad("constant", [0, 0, -3, 0, 0, 0, -3, 0]), "leave an axis of size -2"),
    "rank_12_edge": (_pad("edge", [0] + [1] * 11 + [0] + [1] * 11, x_shape=(1,) + (2,) * 11),
                     "along 11 axes reads the input at 177,147 places"),
}  # fmt: skip


def _group_norm(inputs: list[str], opset: int = 21, **attrs):  # noqa: ANN003, ANN202
    inits = [numpy_helper.from_array(np.ones(2, np.float32), n) for n in ("s", "b")]
    return model([helper.make_node("GroupNormalization", inputs, ["y"], **attrs)], inits, x_shape=(1, 2, 4, 4),
                 opset=opset)  # fmt: skip


# GroupNormalization is an Identity in the skeleton that onnx checks: the import rule checks the node itself
PAD_AND_GROUP_NORM |= {
    "group_norm_2_62": (_group_norm(["x", "s", "b"], num_groups=2**62), "num_groups=4611686018427387904 does not"),
    "group_norm_negative": (_group_norm(["x", "s", "b"], num_groups=-1), "num_groups=-1 does not divide"),
    "group_norm_no_scale": (_group_norm(["x"], num_groups=1), "it needs its scale and bias inputs"),
    "group_norm_18_eps_nan": (_group_norm(["x", "s", "b"], 18, num_groups=2, epsilon=float("nan")),
                              "its attribute epsilon=nan is not a finite number"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(PAD_AND_GROUP_NORM))
def test_a_hostile_pad_or_group_norm_is_a_clear_error(cli, tmp_path, case: str) -> None:  # noqa: ANN001
    m, message = PAD_AND_GROUP_NORM[case]
    refused(cli, tmp_path, m, message)


LONG = "n" * 100_000


def long_names():  # noqa: ANN201
    """A 100,000-character name for the input, a node, its output, an initialiser and the graph."""
    w = numpy_helper.from_array(np.ones((3, 4), np.float32), "w" + LONG)
    x = helper.make_tensor_value_info("i" + LONG, TensorProto.FLOAT, [1, 4])
    nodes = [helper.make_node("Relu", ["i" + LONG], ["o" + LONG], name="r" + LONG),
             helper.make_node("Gemm", ["o" + LONG, "w" + LONG], ["y"], transB=1)]  # fmt: skip
    return model(nodes, [w], inputs=[x], name="G" + LONG)


def input_system():  # noqa: ANN201
    return model([gemm("System")], [W], inputs=[helper.make_tensor_value_info("System", TensorProto.FLOAT, [1, 4])])


@pytest.mark.parametrize("make", [long_names, input_system])
def test_what_imports_checks_and_compiles(cli, tmp_path, make) -> None:  # noqa: ANN001
    """A 100,000-character name became a Java identifier and string constant javac refuses (and a class file name
    too long to write); an input named System hid java.lang.System. javac itself: test_check_accepts_javac."""
    r, out = run_import(cli, tmp_path, make())
    assert r.exit_code == 0, r.output
    text = (out / "n.ddsl").read_text()
    assert max(len(w) for w in text.replace("(", " ").split()) <= 64 + 20
    assert cli("check", str(out / "n.ddsl")).exit_code == 0
    r = cli("compile", str(out / "n.ddsl"), "-o", str(out / "java"))
    assert r.exit_code == 0, r.output
    java = next((out / "java").glob("*.java")).read_text()
    assert "Buf System =" not in java


# ---- a small fuzz: attributes, dims and names of a valid model changed at random ----


def _mutants(count: int, seed: int = 36):  # noqa: ANN202
    """Single-node and small models with one attribute, dim or data field set to a hostile value."""
    rng = random.Random(seed)
    values = [0, -1, 1, 2, 3, 2**31 - 1, 2**31, 2**40 + 1, 2**62, -(2**62), float("nan"), float("inf"), 1e30, -0.0]
    base = [
        lambda: model([helper.make_node("Conv", ["x", "W"], ["y"], kernel_shape=[1, 1], strides=[1, 1],
                                        pads=[0, 0, 0, 0], group=1)], [CONV_W], x_shape=(1, 2, 4, 4)),
        lambda: model([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2])], [],
                      x_shape=(1, 2, 4, 4)),
        lambda: model([helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[2, 2], strides=[1, 1],
                                        pads=[1, 1, 1, 1], count_include_pad=1)], [], x_shape=(1, 2, 4, 4)),
        lambda: model([helper.make_node("LRN", ["x"], ["y"], size=3, alpha=1e-4, beta=0.75, bias=1.0)], [],
                      x_shape=(1, 2, 4, 4)),
        lambda: model([gemm(alpha=1.0, beta=1.0)], [W]),
        lambda: _bn(epsilon=1e-5, momentum=0.9),
        lambda: model([helper.make_node("LeakyRelu", ["x"], ["y"], alpha=0.1)], []),
        lambda: model([helper.make_node("Flatten", ["x"], ["y"], axis=1)], [], x_shape=(1, 2, 4, 4), out_rank=2),
        lambda: model([helper.make_node("Softmax", ["x"], ["y"], axis=1)], []),
        lambda: _shape_then([helper.make_node("Gather", ["s", "i"], ["g"], axis=0)],
                            [numpy_helper.from_array(np.asarray([0, 1, 2, 3], np.int64), "i")]),
    ]  # fmt: skip
    for _ in range(count):
        m = rng.choice(base)()
        targets = [a for n in m.graph.node for a in n.attribute] + list(m.graph.initializer)
        target = rng.choice(targets)
        v = rng.choice(values)
        if isinstance(target, onnx.AttributeProto):
            if target.type == onnx.AttributeProto.INT and isinstance(v, int):
                target.i = max(min(v, 2**63 - 1), -(2**63))
            elif target.type == onnx.AttributeProto.INTS and isinstance(v, int):
                target.ints[rng.randrange(len(target.ints))] = v
            elif target.type == onnx.AttributeProto.FLOAT:
                target.f = float(v)
            elif target.type == onnx.AttributeProto.FLOATS:
                target.floats[0] = float(v)
        elif isinstance(v, int) and 0 <= v < 2**62 and target.dims:
            target.dims[rng.randrange(len(target.dims))] = v  # dims that lie
        yield m


@pytest.mark.parametrize("count", [200, pytest.param(5000, marks=pytest.mark.slow)])
def test_fuzzed_attributes_and_dims_import_or_are_refused(cli, tmp_path, count: int) -> None:  # noqa: ANN001
    for k, m in enumerate(_mutants(count)):
        r, out = run_import(cli, tmp_path / str(k), m)  # no traceback, no internal error: run_import asserts it
        assert r.exit_code in (0, 1), r.output
        if r.exit_code == 0:
            assert cli("check", str(out / "n.ddsl")).exit_code == 0, (k, (out / "n.ddsl").read_text())
