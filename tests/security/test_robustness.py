"""No internal error (exit 3) from input, and no silently wrong numbers (issue 15)."""

from __future__ import annotations

import inspect
import os
import random
import subprocess
import sys

import numpy as np
import pytest
from deep_networks import SMALL, chain, residual_mlp
from helpers import ROOT

from deepdsl import api
from deepdsl.memory.plan import first_fit
from deepdsl.memory.schedule import schedule

TRAIN = "train {\n  data = synthetic\n  optimizer = sgd(lr=0.01)\n  iterations = 2\n}\n"


def _write(tmp_path, text: str, name: str = "t.ddsl"):  # noqa: ANN001, ANN202
    f = tmp_path / name
    f.write_text(text)
    return f


# ---- long chains and deep networks ----


@pytest.mark.parametrize("kind", ["+", "-", "not", "o"])
def test_a_600_term_chain_is_a_diagnostic_not_an_internal_error(cli, tmp_path, kind: str) -> None:  # noqa: ANN001
    f = _write(tmp_path, chain(kind, 600))
    for args in (["check"], ["ir", "--stage", "ast"]):
        r = cli(*args, str(f))
        assert r.exit_code == 1, r.output
        assert "nests more than 500 levels deep" in r.stderr and "internal error" not in r.stderr


@pytest.mark.parametrize("kind", ["+", "-", "not", "o"])
def test_a_300_term_chain_compiles(cli, tmp_path, kind: str) -> None:  # noqa: ANN001
    f = _write(tmp_path, chain(kind, 300))
    r = cli("check", str(f))
    assert r.exit_code == 0, r.output


def test_a_long_element_wise_chain_is_fused_into_several_kernels(cli, tmp_path) -> None:  # noqa: ANN001
    # 400 ReLUs in a row were one fused expression 400 levels deep: RecursionError in the fuse pass
    r = cli("memcheck", str(_write(tmp_path, chain("o", 400))), "--totals")
    assert r.exit_code == 0, r.output


@pytest.mark.slow  # 6 s (the default suite's four minutes)
def test_a_300_layer_residual_network_plans(cli, tmp_path) -> None:  # noqa: ANN001
    f = _write(tmp_path, residual_mlp(300))
    r = cli("memcheck", str(f), "--totals", "--json")
    assert r.exit_code == 0, r.output
    # the schedule recursed once per statement of the backward chain (RecursionError from about 400 layers at
    # Python's default limit); now its stack stays flat: 300 layers schedule with 200 frames to spare
    c = api.compile_file(f, stop_at="opt")
    assert c.opt is not None
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(len(inspect.stack(0)) + 200)
    try:
        order = schedule(c.opt)
    finally:
        sys.setrecursionlimit(limit)
    assert sorted(s.out.name for s in order.stmts) == sorted(s.out.name for s in c.opt.stmts)


@pytest.mark.slow
def test_a_1000_layer_residual_network_plans(tmp_path) -> None:  # noqa: ANN001
    """A RecursionError in the schedule before; how the time grows with depth is scripts/bench_deep.py's."""
    f = _write(tmp_path, residual_mlp(1000))
    c = api.compile_file(f, stop_at="plan")
    assert c.plan is not None and c.plan.arena_bytes > 0


def _first_fit_reference(roots, size, start, end):  # noqa: ANN001, ANN202
    """The placement as it was written first (quadratic): the vectorised one must give the same offsets."""
    placed, offsets = [], {}
    for r in roots:
        busy = sorted((o, o + sz) for o, sz, a, b in placed if a <= end[r] and start[r] <= b)
        offset = 0
        for lo, hi in busy:
            if offset + size[r] <= lo:
                break
            offset = max(offset, hi)
        offsets[r] = offset
        placed.append((offset, size[r], start[r], end[r]))
    return offsets


def test_the_vectorised_placement_gives_the_same_offsets() -> None:
    rng = random.Random(15)
    for _ in range(200):
        n = rng.randint(1, 60)
        size = {f"v{i}": 256 * rng.choice([1, 2, 3, 4, 16]) for i in range(n)}
        start = {v: rng.randint(0, 40) for v in size}
        end = {v: start[v] + rng.randint(0, 25) for v in size}
        roots = sorted(size, key=lambda r: (-size[r], start[r]))
        assert first_fit(roots, size, start, end) == _first_fit_reference(roots, size, start, end)


@pytest.mark.slow  # 3.2 s: two processes plan ResNet-50 (the default suite's four minutes)
def test_the_plan_does_not_depend_on_the_hash_seed() -> None:
    # the schedule iterated over sets of value names: ResNet-50's order changed with PYTHONHASHSEED
    code = (
        "from deepdsl import api; from deepdsl.memory import format_plan; "
        "c = api.compile_file('networks/resnet50.ddsl', {'N': 1, 'H': 32, 'W': 32}, stop_at='plan'); "
        "print(format_plan(c.plan))"
    )
    outs = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=False)
        assert r.returncode == 0, r.stderr
        outs.append(r.stdout)
    assert outs[0] == outs[1]


# ---- includes ----


def test_an_include_that_is_a_symlink_loop_is_an_error(cli, tmp_path) -> None:  # noqa: ANN001
    (tmp_path / "a.ddsl").symlink_to(tmp_path / "b.ddsl")
    (tmp_path / "b.ddsl").symlink_to(tmp_path / "a.ddsl")
    text = SMALL + 'include "a.ddsl"\nlayer f = full(2)\nloss = softmax_cross_entropy(f(x), y)\n'
    f = _write(tmp_path, text, "m.ddsl")
    r = cli("check", str(f))
    assert r.exit_code == 1, r.output
    assert "symbolic links" in r.stderr and "internal error" not in r.stderr


def test_an_include_of_a_file_that_is_not_ddsl_echoes_none_of_it(cli, tmp_path) -> None:  # noqa: ANN001
    (tmp_path / "shadow").write_text("Xq7user-7f3a:$6$Zsalt$Whash:19000:0:99999:7:::\n")
    f = _write(tmp_path, SMALL + 'include "shadow"\nlayer f = full(2)\nloss = softmax_cross_entropy(f(x), y)\n')
    r = cli("check", str(f))
    assert r.exit_code == 1, r.output
    assert "it is not .ddsl text" in r.stderr
    assert "Xq7user" not in r.output and "Zsalt" not in r.output and "7f3a" not in r.output


# ---- data and numbers ----


def _npz(tmp_path, x_test: np.ndarray, y_test: np.ndarray):  # noqa: ANN001, ANN202
    rng = np.random.default_rng(0)
    path = tmp_path / "d.npz"
    np.savez(path, x=rng.uniform(-1, 1, (8, 4)).astype(np.float32), y=rng.integers(0, 2, 8), x_test=x_test,
             y_test=y_test)  # fmt: skip
    return path


NET = SMALL + "layer f = full(2)\nloss = softmax_cross_entropy(f(x), y)\npredict = f(x)\n" + TRAIN


def test_an_empty_test_set_is_an_error(cli, tmp_path) -> None:  # noqa: ANN001
    data = _npz(tmp_path, np.zeros((0, 4), np.float32), np.zeros(0, np.int64))
    r = cli("run", str(_write(tmp_path, NET)), "--data", f"npz:{data}", "--device", "cpu")
    assert r.exit_code == 1, r.output
    assert "the test data holds no samples" in r.stderr


def test_all_nan_test_inputs_are_not_100_percent_accurate(cli, tmp_path) -> None:  # noqa: ANN001
    data = _npz(tmp_path, np.full((4, 4), np.nan, np.float32), np.zeros(4, np.int64))
    r = cli("run", str(_write(tmp_path, NET)), "--data", f"npz:{data}", "--device", "cpu")
    assert r.exit_code == 0, r.output
    assert "test accuracy: 0.00%" in r.stdout


@pytest.mark.parametrize(
    ("lr", "sets"),
    [("1e308 * 10", []), ("1e308 * 10 - 1e308 * 10", []), ("1e999", []), ("LR", ["--set", "LR=nan"]),
     ("LR", ["--set", "LR=inf"])],
)  # fmt: skip
def test_a_non_finite_learning_rate_is_refused(cli, tmp_path, lr: str, sets: list[str]) -> None:  # noqa: ANN001
    text = NET.replace("lr=0.01", f"lr={lr}").replace("const N = 2", "const N = 2\nconst LR = 0.1")
    r = cli("check", str(_write(tmp_path, text)), *sets)
    assert r.exit_code == 1, r.output
    assert "finite" in r.stderr or "too large" in r.stderr


def test_the_nan_detector_blames_the_update_that_made_the_nan(cli, tmp_path) -> None:  # noqa: ANN001
    # the first step's loss is finite, its update overflows to Inf: blamed there, not at the next step's forward
    text = (
        "network T\nconst N = 4\ninput x : [N, 3, 8, 8]\nlabel y : [N] classes 10\nlayer fc = full(10)\n"
        "loss = softmax_cross_entropy(fc(flatten(x)) * 1000000.0, y)\n"
        "train {\n  data = synthetic\n  optimizer = sgd(lr=1e38)\n  iterations = 3\n}\n"
    )
    r = cli("run", str(_write(tmp_path, text)), "--device", "cpu")
    assert r.exit_code == 1, r.output
    assert "iteration 1: statement" in r.stderr and "sgd" in r.stderr and "linear" not in r.stderr


# ---- usage errors ----


@pytest.mark.parametrize("args", [["--save", ""], ["--load", " "], ["--data", "synthetic:-1"], ["--data", "foo:x"]])
def test_bad_run_flags_are_usage_errors(cli, tmp_path, args: list[str]) -> None:  # noqa: ANN001
    r = cli("run", str(_write(tmp_path, NET)), "--iters", "1", *args)
    assert r.exit_code == 2, r.output
