"""Limits before allocation (issue 15): --set values, tensor sizes, the run's footprint, synthetic data; and what
check accepts that javac or a runner cannot take, or that takes minutes to refuse (issue 36)."""

from __future__ import annotations

import time

import numpy as np
import pytest
from deep_networks import SMALL
from helpers import ROOT

from deepdsl import api
from deepdsl.data.synthetic import MAX_BYTES, synthetic_sizes
from deepdsl.frontend.train import MAX_ITERATIONS
from deepdsl.memory.footprint import Footprint, check_fits, footprint
from deepdsl.memory.report import persistent_bytes

MLP = str(ROOT / "networks" / "mlp.ddsl")


@pytest.mark.parametrize("value", ["99999999999999999999999", str(2**62), str(-(2**62)), "nan", "inf", "-inf"])
def test_set_values_obey_the_literals_limits(cli, value: str) -> None:  # noqa: ANN001
    for command in ("check", "memcheck"):
        r = cli(command, MLP, "--set", f"N={value}")
        assert r.exit_code == 1, r.output
        assert f"--set N={value}" in r.stderr.replace("N=-", "N=-") and "internal error" not in r.stderr


def test_a_set_value_at_the_limit_is_taken(cli) -> None:  # noqa: ANN001
    r = cli("check", MLP, "--set", f"N={2**62 - 1}")
    assert r.exit_code == 1  # too many elements, but not a --set error
    assert "--set N=" not in r.stderr.replace("--set N=...", "") and "elements" in r.stderr


def test_a_tensor_that_overflows_the_grid_stride_loop_is_a_diagnostic(cli, tmp_path) -> None:  # noqa: ANN001
    # 2,146,959,360 elements: under 2^31, but a 32-bit index stepping by 256 x 65536 overflows before the end
    f = tmp_path / "big.ddsl"
    f.write_text(
        "network Big\nconst N = 2048\ninput x : [N, 1048320]\nlabel y : [N] classes 2\n"
        "layer f = full(2)\nloss = softmax_cross_entropy(f(x), y)\n"
    )
    for args in (["check"], ["compile", "-o", str(tmp_path / "out")]):
        r = cli(args[0], str(f), *args[1:])
        assert r.exit_code == 1, r.output
        assert "2,146,959,360 elements" in r.stderr and "big.ddsl:3:1" in r.stderr
    assert not (tmp_path / "out").exists()
    f.write_text(f.read_text().replace("2048", "2032"))  # 2,130,186,240 elements: fits
    assert cli("check", str(f)).exit_code == 0


def test_compile_of_a_2_31_element_tensor_is_a_diagnostic(cli, tmp_path) -> None:  # noqa: ANN001
    r = cli("compile", MLP, "--set", "N=3000000", "-o", str(tmp_path / "out"))
    assert r.exit_code == 1, r.output
    assert "elements" in r.stderr and "internal error" not in r.stderr


def test_the_footprint_counts_more_than_the_arena() -> None:
    c = api.compile_file(MLP, {"N": 64}, stop_at="plan")
    assert c.plan is not None
    f = footprint(c.plan)
    assert f.persistent == persistent_bytes(c.plan.graph)
    assert f.arena == c.plan.arena_bytes and f.copies > 0
    assert f.total > persistent_bytes(c.plan.graph) + c.plan.arena_bytes
    assert footprint(c.plan, 8).total == 2 * f.total


def test_check_fits_says_what_the_run_needs_in_one_line() -> None:
    f = Footprint(3 * 2**30, 2**30, 20 * 2**30)
    check_fits(f, None)  # unknown: not checked
    check_fits(f, 24 * 2**30)
    with pytest.raises(Exception, match=r"needs at least 24.00 GiB .* but 2.00 GiB is available") as info:
        check_fits(f, 2 * 2**30)
    assert "\n" not in str(info.value)


def test_run_refuses_a_batch_the_machine_cannot_hold(cli, monkeypatch) -> None:  # noqa: ANN001
    import deepdsl.trainer

    allocated = []
    monkeypatch.setattr(deepdsl.trainer, "available_memory", lambda: 2**20)
    monkeypatch.setattr(deepdsl.trainer.Trainer, "_init", lambda self, p: allocated.append(p) or None)
    r = cli("run", MLP, "--data", "synthetic", "--iters", "1", "--device", "cpu")
    assert r.exit_code == 1, r.output
    assert "of memory" in r.stderr and "is available" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not allocated  # refused before any parameter was allocated


@pytest.mark.parametrize("d", [1, 784, 3072, 65536, 65537, 150528, 10**6, 10**8])
def test_synthetic_data_is_capped_by_bytes(d: int) -> None:
    n_train, n_test = synthetic_sizes(d)
    assert n_train >= 1 and n_test >= 1
    assert (n_train + n_test) * 4 * d <= max(MAX_BYTES, 2 * 4 * d)
    if d <= 150528:  # the sizes every network of networks/ gets are unchanged
        assert (n_train, n_test) == ((1024, 256) if d <= 65536 else (256, 64))


def test_synthetic_data_of_a_large_sample_stays_under_the_cap(monkeypatch) -> None:  # noqa: ANN001
    import deepdsl.data.synthetic as synthetic

    monkeypatch.setattr(synthetic, "MAX_BYTES", 2**20)  # a small cap, to keep the test fast
    data = synthetic.make_synthetic((1, 256, 256), 10, 1)  # 1280 samples of 256 KiB were 335 MB
    assert data.x_test is not None
    assert data.x_train.nbytes + data.x_test.nbytes <= 2**20
    assert (len(data.x_train), len(data.x_test)) == (3, 1)
    assert np.isfinite(data.x_train).all()


# ---- what check accepts, javac and the runners take (issue 36): ints, windows, statements, literals ----

IMAGE = "network T\nconst N = 1\ninput x : [N, 2, 4, 4]\nlabel y : [N] classes 2\n"
HEAD = "layer fc = full(2)\nloss = softmax_cross_entropy(fc(flatten(h)), y)\n"
INT_MAX = 2**31 - 1


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (f"h = conv(x, 2, kernel=1, stride={2**31})", "argument 'stride' of conv must be at most 2,147,483,647"),
        (f"h = max_pool(x, 1, stride=({2**40}, 1))", "argument 'stride' of max_pool must be at most 2,147,483,647"),
        (f"h = lrn(x, size={2**40 + 1})", "argument 'size' of lrn must be at most 2,147,483,647"),
        (f"h = lrn(x, size={2**31})", "argument 'size' of lrn must be at most 2,147,483,647"),
        (f"h = conv(x, 2, kernel=1, groups={2**31})", "argument 'groups' of conv must be at most 2,147,483,647"),
        (f"h = conv(x, 2, kernel=1, pad={2**30}, stride={INT_MAX})", "padded by 1,073,741,824 on both sides"),
        (f"h = avg_pool(x, (65536, 65536), pad=32768, stride={INT_MAX})", "holds 4,294,967,296 elements"),
        (f"h = upsample(x, {2**31})", "argument 'factor' of upsample must be at most 2,147,483,647"),
    ],
)  # fmt: skip
def test_integers_past_a_java_int_are_refused_at_check(cli, tmp_path, line: str, message: str) -> None:  # noqa: ANN001
    """They passed check and broke javac ("integer number too large"), or made an int overflow in the program."""
    f = tmp_path / "t.ddsl"
    f.write_text(IMAGE + line + "\n" + HEAD)
    r = cli("check", str(f))
    assert r.exit_code == 1, r.output
    assert message in r.stderr and "t.ddsl:5:" in r.stderr and "internal error" not in r.stderr


@pytest.mark.parametrize("key", ["iterations", "test_every", "test_iterations", "save_every"])
def test_the_train_blocks_counts_fit_an_int(cli, tmp_path, key: str) -> None:  # noqa: ANN001
    text = IMAGE + "h = x\n" + HEAD + f"train {{\n  {key} = {2**31}\n}}\n"
    (tmp_path / "t.ddsl").write_text(text)
    r = cli("check", str(tmp_path / "t.ddsl"))
    assert r.exit_code == 1, r.output
    # iterations has its own, smaller bound (--iters: frontend/train.py MAX_ITERATIONS); the others a Java int's
    most = MAX_ITERATIONS if key == "iterations" else INT_MAX
    assert f"'{key}' must be at most {most:,}" in r.stderr and "t.ddsl:9:" in r.stderr
    extra = f"  seed = {2**62 - 1}\n" + ('  save = "w.npz"\n' if key == "save_every" else "")  # the seed is a long
    (tmp_path / "t.ddsl").write_text(text.replace(str(2**31), str(most)).replace("train {\n", "train {\n" + extra))
    r = cli("check", str(tmp_path / "t.ddsl"))
    assert r.exit_code == 0, r.output


def test_a_loop_run_away_is_refused_in_seconds(cli, tmp_path) -> None:  # noqa: ANN001
    """VGG-16 with a block of 65,536 convolutions elaborated for 22 s (154 billion parameters) before check said
    yes; a loop bound of 100,000 ran to the evaluation limit for 30 s."""
    vgg = (ROOT / "networks" / "vgg16.ddsl").read_text()
    assert "x = vgg_block(x, 512, 3)" in vgg
    for bound in ("65536", "100000"):
        f = tmp_path / "vgg.ddsl"
        f.write_text(vgg.replace("x = vgg_block(x, 512, 3)", f"x = vgg_block(x, 512, {bound})", 1))
        start = time.perf_counter()
        r = cli("check", str(f))
        assert r.exit_code == 1, r.output
        assert "the network has more than 10,000 statements" in r.stderr and "vgg.ddsl:" in r.stderr
        assert time.perf_counter() - start < 10


def test_a_tensor_over_the_limit_is_refused_where_it_is_made(cli, tmp_path) -> None:  # noqa: ANN001
    # 64 x 2^26 elements, made on line 5, then used by 10,000 more statements: refused at line 5 straight away
    text = (IMAGE.replace("input x : [N, 2, 4, 4]", "input x : [N, 64]")
            + "h = upsample(reshape(x, (1, 64, 1, 1)), 8192)\ndef many(t) {\n  for i in 0 .. 100000 { t = relu(t) }\n"
            "  return t\n}\nloss = softmax_cross_entropy(full(flatten(many(h)), 2), y)\n")  # fmt: skip
    (tmp_path / "t.ddsl").write_text(text)
    r = cli("check", str(tmp_path / "t.ddsl"))
    assert r.exit_code == 1, r.output
    assert "the result of upsample" in r.stderr and "4,294,967,296 elements" in r.stderr and "t.ddsl:5:" in r.stderr


def test_the_numpy_lrn_of_a_huge_window_sums_the_channels_there_are() -> None:
    """lrn(size=2^31 - 1) looped over 2^31 window offsets (the issue's size=2^40+1 hung the NumPy runner)."""
    from deepdsl.ir.registry import REGISTRY

    rng = np.random.default_rng(36)
    x = rng.standard_normal((2, 3, 2, 2)).astype(np.float32)
    a = {"size": INT_MAX, "alpha": 1e-4 * INT_MAX, "beta": 0.75, "k": 2.0}
    start = time.perf_counter()
    got = REGISTRY["lrn"].numpy((x,), a)
    assert time.perf_counter() - start < 1
    want = x * (2.0 + 1e-4 * (x * x).sum(axis=1, keepdims=True)) ** -0.75  # every channel is in every window
    np.testing.assert_allclose(got, want, rtol=1e-5)


@pytest.mark.parametrize(
    ("text", "message", "where"),
    [
        ('include "a\x00b.ddsl"\n', "a string may not hold a NUL character", "t.ddsl:5:9"),
        ("const K = " + "9" * 5000 + "\n", "an integer of 5,000 digits is too large", "t.ddsl:5:11"),
        ("const K = " + "0" * 5000 + "7\nh = x\n", None, None),  # leading zeros are no digits of the value
        ("const " + "k" * 100_000 + " = 1\n", "a name of 100,000 characters; at most 128", "t.ddsl:5:7"),
        ('h = x\ntrain {\n  data = npz("' + "d" * 5000 + '")\n}\n', "a string of 5,000 characters", "t.ddsl:7:14"),
    ],
)  # fmt: skip
def test_literals_past_the_limits_are_located_errors(cli, tmp_path, text: str, message, where) -> None:  # noqa: ANN001
    f = tmp_path / "t.ddsl"
    tail = ("" if "h = x" in text else "h = x\n") + "loss = softmax_cross_entropy(full(h, 2), y)\n"
    f.write_text(SMALL + text + tail)
    r = cli("check", str(f))
    if message is None:
        assert r.exit_code == 0, r.output
        return
    assert r.exit_code == 1, r.output
    assert message in r.stderr and where in r.stderr and "internal error" not in r.stderr


def test_a_1500_include_chain_is_a_located_error(cli, tmp_path) -> None:  # noqa: ANN001
    """It ended in a RecursionError (exit 3); now the 64th include in the chain is refused, naming how it began."""
    for i in range(1500):
        (tmp_path / f"c{i}.ddsl").write_text(f'include "c{i + 1}.ddsl"\n')
    (tmp_path / "c1500.ddsl").write_text("def twice(t) = relu(relu(t))\n")
    f = tmp_path / "t.ddsl"
    f.write_text(SMALL + 'include "c0.ddsl"\nloss = softmax_cross_entropy(full(twice(x), 2), y)\n')
    r = cli("check", str(f))
    assert r.exit_code == 1, r.output
    assert "includes nest more than 64 files deep (t.ddsl -> c0.ddsl -> c1.ddsl -> c2.ddsl -> ... -> c63.ddsl" in (
        r.stderr
    )
    assert "c63.ddsl:1:1" in r.stderr and "internal error" not in r.stderr
    (tmp_path / "c60.ddsl").write_text("def twice(t) = relu(relu(t))\n")  # a chain of 61 files is fine
    assert cli("check", str(f)).exit_code == 0
