"""Golden text of every stage (ast, graph, train, infer) of every network; `pytest --update-golden` rewrites them.

The train and infer programs are printed at batch 2 (the statements do not depend on it) to keep the
files small enough to review.
"""

from __future__ import annotations

import pytest
from conftest import GOLDEN, NETWORKS, ROOT

from deepdsl import api
from deepdsl.frontend.ast import format_node
from deepdsl.ir.printer import format_graph


@pytest.mark.parametrize("stage", ["ast", "graph", "train", "infer"])
@pytest.mark.parametrize("path", NETWORKS, ids=lambda p: p.stem)
def test_stage_text_is_stable(path, stage, golden) -> None:
    rel = str(path.relative_to(ROOT))
    c = api.compile_file(rel, {"N": 2} if stage in ("train", "infer") else None, stop_at=stage)
    graph = {"graph": c.program.graph, "train": c.train, "infer": c.infer}.get(stage) if c.program else None
    text = format_node(c.module) + "\n" if stage == "ast" else format_graph(graph)
    golden(GOLDEN / f"{path.stem}.{stage}.txt", text)
