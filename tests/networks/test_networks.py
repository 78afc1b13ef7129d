"""Every network of networks/ parses and shape-checks; the reference networks have the reference parameter count,
and the networks that are not classifiers (an autoencoder, a regression) train on synthetic data."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import NETWORKS as ALL_NETWORKS

from deepdsl import api
from deepdsl.ir.verify import check_graph
from deepdsl.running import run_training

# shared/reference/networks.md
REFERENCE = {
    "mlp": ("MLP", 545_810, (1, 28, 28), 10),
    "lenet": ("LeNet", 431_080, (1, 28, 28), 10),
    "alexnet": ("AlexNet", 60_965_224, (3, 227, 227), 1000),
    "overfeat": ("OverFeat", 145_920_872, (3, 231, 231), 1000),
    "vgg16": ("VGG16", 138_357_544, (3, 224, 224), 1000),
    "googlenet": ("GoogLeNet", 6_998_552, (3, 224, 224), 1000),
    "resnet50": ("ResNet50", 25_557_032, (3, 224, 224), 1000),
}

# the networks of networks/ that are not reference classifiers: no labels, or real-valued targets
UNLABELLED = ("autoencoder", "regression")
# the Transformers, each tested in a file of its own (test_vit_tiny.py, test_gpt_tiny.py)
TRANSFORMERS = ("vit_tiny", "gpt_tiny")
NETWORKS = [p for p in ALL_NETWORKS if p.stem in REFERENCE]

# the smallest spatial size each architecture still fits (see each file's header)
SMALL = {"mlp": 28, "lenet": 28, "alexnet": 67, "overfeat": 71, "vgg16": 32, "googlenet": 32, "resnet50": 32}


def test_every_reference_network_is_there() -> None:
    assert sorted(p.stem for p in ALL_NETWORKS) == sorted([*REFERENCE, *UNLABELLED, *TRANSFORMERS])


@pytest.fixture(scope="module")
def unlabelled_runs() -> dict[str, dict]:
    """Each of UNLABELLED trained 12 steps at batch 8 on the NumPy runner, from its train block's synthetic data."""
    path = {p.stem: p for p in ALL_NETWORKS}
    return {name: run_training(api.build(api.compile_file(path[name], {"N": 8}).program), iters=12, device="cpu")
            for name in UNLABELLED}  # fmt: skip


@pytest.mark.parametrize("name", UNLABELLED)
def test_a_network_without_class_labels_trains_and_reports_its_test_loss(unlabelled_runs, name: str) -> None:  # noqa: ANN001
    result = unlabelled_runs[name]
    losses = result["losses"]
    assert np.all(np.isfinite(losses)) and np.mean(losses[-3:]) < 0.8 * np.mean(losses[:3]), losses
    assert np.isfinite(result["test_loss"]) and result["test_loss"] < losses[0]
    assert "test_accuracy" not in result  # its loss classifies nothing: no accuracy (never "3300.00%")


@pytest.mark.parametrize("path", NETWORKS, ids=lambda p: p.stem)
def test_network_matches_reference(path) -> None:
    name, params, chw, classes = REFERENCE[path.stem]
    c = api.compile_file(path)
    g = check_graph(c.program.graph)
    assert g.name == name
    assert g.parameter_count == params
    assert g.parameter_bytes == 4 * params
    x = next(d for d in g.inputs if d.kind == "input")
    y = next(d for d in g.inputs if d.kind == "label")
    assert x.value.type.shape[1:] == chw
    assert y.classes == classes
    n = x.value.type.shape[0]
    assert g.output("loss").type.shape == ()
    assert g.output("predict").type.shape == (n, classes)
    assert c.program.warnings == ()


@pytest.mark.parametrize("path", NETWORKS, ids=lambda p: p.stem)
def test_network_scales_down_with_set(path) -> None:
    size = SMALL[path.stem]
    sets = {"N": 2, "H": size, "W": size}
    g = check_graph(api.compile_file(path, sets).program.graph)
    x = next(d for d in g.inputs if d.kind == "input")
    assert x.value.type.shape[0] == 2 and x.value.type.shape[2:] == (size, size)
    assert g.output("predict").type.shape[0] == 2
    if path.stem in ("googlenet", "resnet50"):  # global average pooling: the same parameters at any size
        assert g.parameter_count == REFERENCE[path.stem][1]


def test_resnet50_parameter_names_follow_the_call_path() -> None:
    g = api.compile_file(next(p for p in NETWORKS if p.stem == "resnet50")).program.graph
    names = {p.value.name for p in g.params}
    assert "model.stem.conv.W" in names
    assert "model.stage1.bottleneck1.shortcut.bn.gamma" in names
    assert "model.stage3.bottleneck6.conv_bn2.conv.W" in names
    assert "model.stage1.bottleneck2.shortcut.conv.W" not in names  # only the first block projects
    assert "model.fc.W" in names and "model.fc.b" in names
    state = {p.value.name for p in g.state}
    assert "model.stem.bn.running_mean" in state and "model.stem.bn.running_var" in state
    assert len([p for p in g.params if p.value.name.endswith(".conv.W")]) == 53


@pytest.mark.parametrize(
    ("loss", "predict", "label"),
    [
        ("softmax_cross_entropy(fc(flatten(x)), y)", "fc(flatten(x))", "y"),
        (
            "cross_entropy(softmax(fc(flatten(x))), y) + 0.1 * mse(fc(flatten(x)), fc(flatten(x)))",
            "fc(flatten(x))",
            "y",
        ),  # fmt: skip
        ("mse(dec(flatten(x)), flatten(x))", "dec(flatten(x))", None),  # an autoencoder with a dummy label
        ("softmax_cross_entropy(fc(flatten(x)), y)", "argmax(fc(flatten(x)))", None),  # predict is not the scores
    ],
)
def test_accuracy_is_reported_only_for_a_classification_loss(loss: str, predict: str, label: str | None) -> None:
    from deepdsl.ir.analysis import classified_label

    text = f"""network T
input x : [4, 1, 2, 2]
label y : [4] classes 3
layer fc = full(3)
layer dec = full(4)
loss = {loss}
predict = {predict}
"""
    assert classified_label(api.compile_source(text, "t.ddsl").program.graph) == label
