"""Limits before allocation (issue 15): --set values, tensor sizes, the run's footprint, synthetic data."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import ROOT

from deepdsl import api
from deepdsl.data.synthetic import MAX_BYTES, synthetic_sizes
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
