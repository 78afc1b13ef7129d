"""deepdsl memcheck: totals, --json, --gpu-mem (fits, largest batch, over budget)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import ROOT, SMALL

from deepdsl import api
from deepdsl.memory.report import largest_batch, parse_size, total_peak

LENET = str(ROOT / "networks" / "lenet.ddsl")
GPT = str(ROOT / "networks" / "gpt_tiny.ddsl")


def test_json_has_the_plan_figures(cli) -> None:  # noqa: ANN001
    r = cli("memcheck", LENET, "--json")
    assert r.exit_code == 0, r.output
    obj = json.loads(r.stdout)
    c = api.compile_file(LENET, stop_at="plan")
    # parameters and momentum, x, y (gradients: arena), the loss seed (a constant hoisted out of the step)
    persistent = 2 * 431_080 * 4 + 64 * 28 * 28 * 4 + 64 * 8 + 4
    assert obj["constant_bytes"] == 4
    assert obj["parameter_bytes"] == obj["gradient_bytes"] == obj["optimizer_state_bytes"] == 431_080 * 4
    assert obj["arena_bytes"] == c.plan.arena_bytes
    assert obj["peak_bytes"] == persistent + c.plan.arena_bytes
    assert obj["naive_peak_bytes"] > obj["peak_bytes"]
    assert obj["peak_at"]["layer"] and obj["peak_at"]["source"].startswith(LENET)
    assert obj["train_flops"] > 0 and obj["remat"] == "none"
    assert sum(row["allocated"] for row in obj["rows"]) == sum(b.nbytes for b in c.plan.buffers)


def test_gpu_mem_finds_the_largest_batch_that_fits(cli) -> None:  # noqa: ANN001
    budget = api.peak_bytes(LENET, {"N": 100})
    obj = json.loads(cli("memcheck", LENET, "--json", "--gpu-mem", str(budget)).stdout)
    assert obj["fits"] and obj["budget_bytes"] == budget
    n = obj["max_batch"]
    assert n >= 100 and api.peak_bytes(LENET, {"N": n}) <= budget < api.peak_bytes(LENET, {"N": n + 1})


def test_over_budget_is_a_diagnostic_at_the_peak_statement(cli) -> None:  # noqa: ANN001
    r = cli("memcheck", LENET, "--totals", "--gpu-mem", "4MiB")
    assert r.exit_code == 1
    assert "does NOT fit" in r.stdout
    assert "over the --gpu-mem budget of 4,194,304; its peak is at statement" in r.stderr
    assert "lenet.ddsl:" in r.stderr and "^" in r.stderr


def test_sizes() -> None:
    assert parse_size("16GiB") == 16 * 2**30 and parse_size("12GB") == 12 * 10**9 and parse_size("512") == 512
    with pytest.raises(ValueError):
        parse_size("12XB")
    assert largest_batch(lambda n: 10 * n, 95) == 9 and largest_batch(lambda n: 10 * n, 5) == 0


def test_bad_size_is_a_usage_error(cli) -> None:  # noqa: ANN001
    assert cli("memcheck", LENET, "--gpu-mem", "lots").exit_code == 2


RESNET = str(ROOT / "networks" / "resnet50.ddsl")


def test_eager_baseline_is_close_to_what_pytorch_keeps_for_resnet50() -> None:
    """The reference measured 88.05 MiB per sample with torchvision's ResNet-50 (its in-place ReLUs and BN
    keep a little more than ours); our model of what eager autograd keeps must be within 10% of it."""
    from deepdsl.memory.eager import saved_bytes

    c = api.compile_file(RESNET, {"N": 4}, stop_at="graph")
    per_sample = saved_bytes(c.program.graph) / 4 / 2**20
    assert abs(per_sample - 88.05) / 88.05 < 0.10


@pytest.mark.slow  # 4 s (the default suite's four minutes)
def test_json_reports_remat_and_its_extra_flops(cli) -> None:  # noqa: ANN001
    plain = json.loads(cli("memcheck", RESNET, "--set", "N=8", "--json").stdout)
    cheap = json.loads(cli("memcheck", RESNET, "--set", "N=8", "--json", "--remat", "cheap").stdout)
    full = json.loads(cli("memcheck", RESNET, "--set", "N=8", "--json", "--remat", "full").stdout)
    assert plain["remat"] == "none" and plain["extra_flops"] == 0
    assert plain["peak_bytes"] <= plain["eager_peak_bytes"] < plain["naive_peak_bytes"]
    assert cheap["remat"] == "cheap" and 0 < cheap["extra_flops"] < 0.05 * cheap["train_flops"]
    assert full["remat"] == "full" and cheap["extra_flops"] < full["extra_flops"] < 0.40 * full["train_flops"]
    assert full["peak_bytes"] < cheap["peak_bytes"] < 0.7 * plain["peak_bytes"]
    assert plain["train_flops"] == cheap["train_flops"] == full["train_flops"]


# (network, --set, a budget below its `full` plan): SMALL at batch 32, whose values are over the planner's 64 KiB
# threshold for recomputation, stands in for ResNet-50 at 64x64 (slow: each plan of it takes seconds)
REMAT_CASES = [
    ("small", {"N": 32}, "256KiB"),
    pytest.param("resnet50", {"N": 4, "H": 64, "W": 64}, "16MiB", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("net, sets, too_small", REMAT_CASES, ids=["small", "resnet50"])
def test_gpu_mem_takes_the_least_rematerialisation_that_fits(cli, tmp_path, net, sets, too_small) -> None:  # noqa: ANN001
    path = RESNET
    if net == "small":
        path = str(tmp_path / "small.ddsl")
        Path(path).write_text(SMALL)
    flags = [f"--set={k}={v}" for k, v in sets.items()]
    none = api.peak_bytes(path, sets)
    cheap = api.peak_bytes(path, sets, api.Options(remat="cheap"))
    obj = json.loads(cli("memcheck", path, *flags, "--json", "--gpu-mem", str(cheap)).stdout)
    assert obj["fits"] and obj["remat"] == "cheap" and obj["peak_bytes"] == cheap < none
    obj = json.loads(cli("memcheck", path, *flags, "--json", "--gpu-mem", str(none)).stdout)
    assert obj["fits"] and obj["remat"] == "none"
    r = cli("memcheck", path, *flags, "--totals", "--gpu-mem", too_small)
    assert r.exit_code == 1 and "rematerialised    full" in r.stdout and "its peak is at statement" in r.stderr


@pytest.mark.slow  # gpt_tiny planned under every remat choice and budget (10 s)
def test_gpu_mem_over_budget_takes_the_least_peak_tried(cli) -> None:  # noqa: ANN001
    """gpt_tiny at D=32 peaks lower with `cheap` than with `full`: a budget no level fits gets the `cheap` plan."""
    sets = {"N": 2, "D": 32, "M": 64}
    c = api.compile_file(GPT, sets, stop_at="plan")
    assert c.build is not None
    peaks = {level: total_peak(api.with_remat(c.build, level).train_plan) for level in ("none", "cheap", "full")}
    assert peaks["cheap"] < peaks["full"] < peaks["none"]
    b = api.plan_within(c.build, peaks["cheap"] - 1)
    assert (b.remat, total_peak(b.train_plan)) == ("cheap", peaks["cheap"])
    assert api.plan_within(c.build, peaks["full"]).remat == "cheap"  # both fit: the least rematerialisation
    assert api.plan_within(c.build, peaks["none"]).remat == "none"
    flags = [f"--set={k}={v}" for k, v in sets.items()]
    r = cli("memcheck", GPT, *flags, "--totals", "--gpu-mem", "1MiB")
    assert r.exit_code == 1 and "rematerialised    cheap" in r.stdout and "does NOT fit" in r.stdout


def test_statements_table_and_plot(cli, tmp_path, monkeypatch) -> None:  # noqa: ANN001
    r = cli("memcheck", LENET, "--statements")
    assert r.exit_code == 0 and "   0 %" in r.stdout and "conv2d" in r.stdout
    obj = json.loads(cli("memcheck", LENET, "--statements", "--json").stdout)
    assert [row["statement"] for row in obj["rows"]] == list(range(len(obj["rows"])))
    pytest.importorskip("matplotlib")
    png = tmp_path / "mem.png"
    r = cli("memcheck", LENET, "--totals", "--plot", str(png))
    assert r.exit_code == 0 and f"plot: wrote {png}" in r.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    svg = tmp_path / "mem.SVG"
    r = cli("memcheck", LENET, "--json", "--plot", str(svg))
    assert json.loads(r.stdout)["network"] == "LeNet" and f"plot: wrote {svg}" in r.stderr  # stdout: JSON only
    assert b"<svg" in svg.read_bytes()[:400]
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # written atomically, no temp left
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)  # as if it were not installed
    r = cli("memcheck", LENET, "--totals", "--plot", str(tmp_path / "x.png"))
    assert r.exit_code == 1 and "pip install 'deepdsl[plot]'" in r.stderr


@pytest.mark.parametrize("name", ["missing/mem.png", "mem.txt", "mem"])
def test_plot_path_is_checked_before_compiling(cli, tmp_path, name) -> None:  # noqa: ANN001
    """A folder that is not there, or a format matplotlib does not write, is a usage error, not exit 3."""
    r = cli("memcheck", LENET, "--totals", "--plot", str(tmp_path / name))
    assert r.exit_code == 2, r.output
    assert "--plot" in r.stderr and ("does not exist" in r.stderr or "must end in .png, .svg, .pdf" in r.stderr)
    assert "internal error" not in r.stderr and not list(tmp_path.iterdir())


def test_largest_batch_search_is_right_from_any_hint_and_quick_from_a_good_one() -> None:
    def peak(n: int) -> int:  # nearly linear, as a plan's peak in the batch is
        calls.append(n)
        return 1000 + 37 * n + n * n // 50

    calls: list[int] = []
    for budget in (500, 1037, 5000, 20000, 123456):
        want = max((n for n in range(1, 3000) if peak(n) <= budget), default=0)
        for known in (None, (64, peak(64)), (3, peak(3)), (1000, peak(1000))):
            assert largest_batch(peak, budget, known=known) == want, (budget, known)
    calls.clear()
    assert largest_batch(lambda n: peak(n) - n * n // 50, 100_000, known=(64, 1000 + 37 * 64)) == 2675
    assert len(calls) <= 4  # peak(1), the guess, and the step on each side of it


def test_sizes_are_shown_in_a_unit_that_fits_them(cli) -> None:  # noqa: ANN001
    from deepdsl.memory.report import size

    assert [size(n) for n in (0, 256, 6400, 1_577_728, 5_647_000_000)] == [
        "0 B", "256 B", "6.2 KiB", "1.5 MiB", "5.26 GiB"
    ]  # fmt: skip
    r = cli("memcheck", str(ROOT / "networks" / "mlp.ddsl"), "--set", "N=2")
    assert r.exit_code == 0 and "0.0 MiB" not in r.stdout and " KiB " in r.stdout


def test_the_rows_add_up_to_the_arena(cli) -> None:  # noqa: ANN001
    """live after = the row before's + allocated - freed; the largest `peak live` (what a statement holds while
    it runs) is the arena, but for the gaps the placement leaves, which the totals name."""
    for sets in (["--set", "N=2"], []):
        obj = json.loads(cli("memcheck", LENET, *sets, "--statements", "--json").stdout)
        live = 0
        for row in obj["rows"]:
            live += row["allocated"] - row["freed"]
            assert row["live"] == live and row["peak"] >= max(live, row["workspace"])
        most = max(row["peak"] for row in obj["rows"])
        assert most <= obj["arena_bytes"] and most >= 0.95 * obj["arena_bytes"]
        text = cli("memcheck", LENET, *sets).stdout
        assert "live after" in text and "peak live" in text and "the largest is the arena below" in text
        assert ("lost to gaps between lifetimes" in text) == (most < obj["arena_bytes"])
