"""Golden text of every stage (ast, graph) of every network; `pytest --update-golden` rewrites them."""

from __future__ import annotations

import pytest
from conftest import GOLDEN, NETWORKS, ROOT

from deepdsl import api
from deepdsl.frontend.ast import format_node
from deepdsl.ir.printer import format_graph


@pytest.mark.parametrize("stage", ["ast", "graph"])
@pytest.mark.parametrize("path", NETWORKS, ids=lambda p: p.stem)
def test_stage_text_is_stable(path, stage, golden) -> None:
    rel = str(path.relative_to(ROOT))
    c = api.compile_file(rel, stop_at=stage)
    text = format_node(c.module) + "\n" if stage == "ast" else format_graph(c.program.graph)
    golden(GOLDEN / f"{path.stem}.{stage}.txt", text)
