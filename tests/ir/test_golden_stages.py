"""Golden text of the compiler's stages; `pytest --update-golden` rewrites them (review the diff).

- MLP and LeNet: the full text of every stage (`deepdsl ir --stage ast|graph|train|infer|opt|plan`), the
  train, infer, opt and plan stages at batch 2 (the statements do not depend on it; the plan's offsets do,
  and batch 2 keeps the files small enough to review).
- The ImageNet-sized networks: the AST text (the front end's golden for defs, loops and conditions), and
  instead of 60-360 KB program dumps that nobody reviews, the `deepdsl ir --stats --json` summary: statements
  and kernels per stage and after every pass.

Every file is the CLI's output, run in-process from the repository root, so it is what a user sees.
"""

from __future__ import annotations

import json

import pytest
from helpers import GOLDEN, NETWORKS, ROOT

FULL_TEXT = ("mlp", "lenet")
STAGES = ("ast", "graph", "train", "infer", "opt", "plan")
SUMMARISED = tuple(p.stem for p in NETWORKS if p.stem not in FULL_TEXT)


def _ir(cli, monkeypatch: pytest.MonkeyPatch, net: str, *args: str) -> str:  # noqa: ANN001
    monkeypatch.chdir(ROOT)  # the spans in the text name networks/NAME.ddsl
    r = cli("ir", f"networks/{net}.ddsl", *args)
    assert r.exit_code == 0, r.output
    return r.stdout


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("net", FULL_TEXT)
def test_stage_text_is_stable(net: str, stage: str, cli, golden, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    sets = () if stage in ("ast", "graph") else ("--set", "N=2")
    golden(GOLDEN / f"{net}.{stage}.txt", _ir(cli, monkeypatch, net, "--stage", stage, *sets))


@pytest.mark.parametrize("net", SUMMARISED)
def test_ast_text_is_stable(net: str, cli, golden, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    golden(GOLDEN / f"{net}.ast.txt", _ir(cli, monkeypatch, net, "--stage", "ast"))


@pytest.mark.parametrize("net", SUMMARISED)
def test_stats_summary_is_stable(net: str, cli, golden, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    stats = json.loads(_ir(cli, monkeypatch, net, "--stats", "--json", "--set", "N=2"))
    assert [s["stage"] for s in stats["stages"]] == ["graph", "train", "opt"]
    golden(GOLDEN / f"{net}.stats.json", _rows(stats))


def _rows(obj: dict[str, list[dict]]) -> str:
    """The summary as JSON with one row a line, so that a diff shows which stage or pass changed."""
    parts = [f'"{key}": [\n' + ",\n".join("  " + json.dumps(row) for row in rows) + "\n]" for key, rows in obj.items()]
    return "{" + ",\n".join(parts) + "}\n"


def test_every_network_has_golden_files() -> None:
    """A network added to networks/ gets its golden files (the tests above write missing ones, and fail)."""
    want = {f"{n}.{s}.txt" for n in FULL_TEXT for s in STAGES}
    want |= {f"{n}.ast.txt" for n in SUMMARISED} | {f"{n}.stats.json" for n in SUMMARISED}
    have = {p.name for p in GOLDEN.glob("*.*") if p.is_file()}
    assert want == have, f"missing {sorted(want - have)}, stale {sorted(have - want)}"
