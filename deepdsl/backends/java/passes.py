"""Large reductions on the Java program's CUDA device as on the PyCUDA runner (ir/reductions.py): the statements
of one pass (a batch norm's channel mean and variance with its running statistics, dgamma with dbeta and the inverse
deviation, a bias gradient alone) are one call `dev.pass(PASS, results..., partials..., inputs..., running...)` of
a `ReductionPass` constant naming the kernel cuda/passes.py `pass_kernels` writes (the same text, the same grid: one
launch, partial sums in double over a 2-D grid into the pass's workspace of the plan, the last block to finish adding
them in slice order). A device without it (the CPU) answers false and runs the statements' own calls, which follow
the call:

    if (!dev.pass(CHANNEL_MEAN_CHANNEL_VAR_PASS, bn1_mean, bn1_var, ..., bn1_mean_partials, ..., cv1_out, ...)) {
      dev.run(CHANNEL_MEAN, bn1_mean, cv1_out);
      ...
    }

Where the plan gave a pass no workspace (`--workspace-limit`), its statements run alone, as on the PyCUDA runner."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from deepdsl.backends.cuda.passes import pass_kernels
from deepdsl.backends.escape import java_comment
from deepdsl.backends.java.names import camel
from deepdsl.backends.java.state import Emitter
from deepdsl.ir import Stmt, Value
from deepdsl.ir.printer import format_stmt
from deepdsl.ir.reductions import ReductionGroup, reduction_group, reduction_groups
from deepdsl.memory import Plan
from deepdsl.memory.launches import pass_scratch

_PLACEHOLDER = "dd_pass_"  # the name a pass's kernels are written under to compare them with those written before


@dataclass(frozen=True)
class Pass:
    """One pass of a plan: its statements in order, the planned groups they came in (the CPU's calls), and the
    byte offset in the arena of each sum's partial sums (split passes only), with their count of doubles."""

    stmts: tuple[Stmt, ...]
    groups: tuple[tuple[Stmt, ...], ...]
    partials: tuple[tuple[int, int], ...]  # (byte offset, doubles) a sum

    @property
    def group(self) -> ReductionGroup:
        rg = reduction_group(self.stmts)
        assert rg is not None
        return rg


def plan_passes(p: Plan, groups: Sequence[tuple[Stmt, ...]]) -> list[Pass | tuple[Stmt, ...]]:
    """The planned `groups` with the passes a CUDA device launches (as cuda/translation.py `program`: every group
    `reduction_group` takes, where a split one has its workspace in the plan) as `Pass`es; every other group as
    it is."""
    out: list[Pass | tuple[Stmt, ...]] = []
    rest = list(groups)
    for merged in reduction_groups(groups):
        parts: list[tuple[Stmt, ...]] = []
        while sum(map(len, parts)) < len(merged):  # reduction_groups joins whole adjacent groups
            parts.append(rest.pop(0))
        rg = reduction_group(merged)
        planned = pass_scratch(p, merged, rg) if rg is not None else None
        if rg is None or planned is None:  # not a pass, or no room for its partial sums: each group on its own
            out += parts
        else:
            partials = tuple((ws.offset, rg.split.slices * rg.split.numel) for ws in planned)
            out.append(Pass(tuple(merged), tuple(parts), partials))
    return out


def _code(text: str) -> str:
    """A kernel's text without its comments and with its name blanked: what two passes' kernels share."""
    return "\n".join(line for line in text.split("\n") if not line.startswith("//"))


def _ints(xs: tuple[int, ...]) -> str:
    return f"new int[] {{{', '.join(map(str, xs))}}}"


def pass_constant(e: Emitter, rg: ReductionGroup) -> tuple[str, tuple[Value, ...]]:
    """The `ReductionPass` constant of `rg` (its kernel written to Name.cu once for every pass that reads the same,
    as the PyCUDA runner writes it once) and the inputs its kernel reads, in order."""
    what = "_".join(f.stmt.a["ops"][-1] if f.stmt.op == "fused" and f.stmt.a.get("ops") else f.stmt.op
                    for f in rg.sums)  # fmt: skip
    probe = pass_kernels(_PLACEHOLDER, rg, ())
    key = ("pass", _code(probe.kernel.text))
    if key in e.kernels:
        return e.kernels[key], probe.inputs
    name = e.kernel_names(f"pass:{rg.stmts[0].out.name}:{len(e.kernels)}", camel(f"{what}_pass"))
    statements = tuple(format_stmt(s) for s in rg.stmts)
    k = pass_kernels(name, rg, statements)
    e.cuda_text.append(k.kernel.text)
    const = e.namer(f"constant:{name}", "_".join(w.upper() for w in f"{what}_pass".split("_") if w))
    counts = [len(rg.sums) + len(rg.updates), *([len(rg.sums)] if k.split else []), len(k.inputs), len(rg.updates)]
    args = [f'"{name}"', _ints(k.kernel.grid), _ints(k.kernel.block)]
    if k.split:
        shape = f"{k.kernel.grid[0]} x {k.kernel.grid[1]} blocks of partial sums, the last to finish adding them up"
        make = "ReductionPass.split"
    else:
        shape = f"{k.kernel.grid[0]} blocks"
        make = "ReductionPass.direct"
    about = f"Reduction pass on the CUDA device, one launch ({shape})"
    one = f"  /** {java_comment(about)}: {java_comment(statements[0])} */"
    if len(statements) == 1 and len(one) <= 130:
        doc = [one]
    else:  # the statements it computes (and those of every pass whose kernels read the same), a line each
        lines = [f"   * {java_comment(about)}:", *(f"   *   {java_comment(line)}" for line in statements)]
        doc = ["  /**", *lines, "   */"]
    head = f"  static final ReductionPass {const} = {make}({', '.join(args[:2])},"
    rest = f"      {', '.join([*args[2:], *map(str, counts)])});"
    e.kernel_text.append("\n".join([*doc, head, rest]))
    e.kernels[key] = const
    return const, probe.inputs


def partial_names(e: Emitter, item: Pass) -> list[str]:
    """The fields of a pass's partial sums (one a sum), in the layout of its step: `bn1_mean_partials`."""
    return [e.temps(f"partials:{f.stmt.out.name}", f"{e.tensor(f.stmt.out)}_partials") for f in item.group.sums]
