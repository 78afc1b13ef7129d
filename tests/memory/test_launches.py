"""memory/launches.py: the plan's launches cut by an incremental check of the launch's memory (_Apart, merged byte
ranges) give the launches that the plain pairwise check (`_apart`, every region of the launch against every region
of the group) gives, on networks whose optimiser updates share multi-tensor launches; and the kept memory meets a
region exactly where the pairwise rule says (random regions: no network here has updates that share memory)."""

from __future__ import annotations

import random

import pytest
from helpers import ROOT

from deepdsl import api
from deepdsl.ir.launches import launch_groups
from deepdsl.memory import launches
from deepdsl.memory.groups import apart_or_same, planned_groups, region

CASES = [("lenet.ddsl", {"N": 4}), ("gpt_tiny.ddsl", {"N": 2, "T": 8}), ("resnet50.ddsl", {"N": 2})]


def _plan(name: str, sets: dict[str, int]):  # noqa: ANN202
    return api.build(api.compile_file(str(ROOT / "networks" / name), sets).program).train_plan


def _apart(plan, launch, group) -> bool:  # noqa: ANN001
    """The rule itself, pairwise: `group` writes no memory that the launch's groups read or write, and reads none
    they write."""
    written = [region(plan, s.out.name) for g in launch for s in g]
    read = [region(plan, v.name) for g in launch for s in g for v in s.inputs]
    mine_written = [region(plan, s.out.name) for s in group]
    mine_read = [region(plan, v.name) for s in group for v in s.inputs]
    return all(apart_or_same(a, b, False) for a in mine_written for b in written + read) and all(
        apart_or_same(a, b, False) for a in written for b in mine_read
    )


def _pairwise(plan) -> list:  # noqa: ANN001
    return launch_groups(planned_groups(plan), lambda launch, group: _apart(plan, launch, group))


@pytest.mark.parametrize(("name", "sets"), CASES, ids=[c[0] for c in CASES])
def test_the_incremental_check_cuts_the_launches_the_pairwise_one_does(name: str, sets: dict[str, int]) -> None:
    plan = _plan(name, sets)
    got, want = launches.planned_launches(plan), _pairwise(plan)
    assert got == want
    assert any(len(launch) > 1 for launch in got)  # some updates share a launch: the check was asked


def _meets_as_apart_does(memory_cls: type, seed: int) -> list[str]:
    """Random regions (arena ranges, some empty, some touching; tensors) added to a memory: each probe's `meets`
    against the pairwise rule, `apart_or_same(probe, each, False)` failing for one. The disagreements."""
    rng = random.Random(seed)

    def region() -> tuple[str, int, int]:
        if rng.random() < 0.2:
            return (f"tensor:t{rng.randrange(5)}", 0, 0)
        return ("arena", 4 * rng.randrange(64), 4 * rng.randrange(0, 9))

    wrong = []
    for _ in range(300):
        memory, added = memory_cls(), [region() for _ in range(rng.randrange(1, 12))]
        for r in added:
            memory.add(r)
        for probe in (region() for _ in range(20)):
            if memory.meets(probe) != (not all(apart_or_same(probe, b, False) for b in added)):
                wrong.append(f"{probe} against {added}")
    return wrong


def test_the_kept_memory_meets_a_region_exactly_where_the_pairwise_rule_says() -> None:
    assert _meets_as_apart_does(launches._Memory, 1) == []


def test_a_memory_that_forgets_a_range_is_caught() -> None:
    """The comparison fails where the kept memory is wrong: ranges dropped as they are merged."""

    class Forgetful(launches._Memory):
        def add(self, r) -> None:  # noqa: ANN001
            if r[0] == "arena":
                self.starts, self.ends = [], []  # keeps only the last range
            super().add(r)

    assert _meets_as_apart_does(Forgetful, 1) != []
