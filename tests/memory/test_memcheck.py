"""deepdsl memcheck: totals, --json, --gpu-mem (fits, largest batch, over budget)."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT

from deepdsl import api
from deepdsl.memory.report import largest_batch, parse_size

LENET = str(ROOT / "networks" / "lenet.ddsl")


def test_json_has_the_plan_figures(cli) -> None:  # noqa: ANN001
    r = cli("memcheck", LENET, "--json")
    assert r.exit_code == 0, r.output
    obj = json.loads(r.stdout)
    c = api.compile_file(LENET, stop_at="plan")
    persistent = 2 * 431_080 * 4 + 64 * 28 * 28 * 4 + 64 * 8  # parameters and momentum, x, y (gradients: arena)
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
