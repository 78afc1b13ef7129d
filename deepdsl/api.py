"""The staged driver shared by the CLI and the tests: text -> AST -> forward graph -> train/infer programs.

Each stage is one function; `compile_source` / `compile_file` run them up to `stop_at`. Errors are
raised as `DslError`; `sources` collects the text of every file read so they can be rendered.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import deepdsl.ops  # noqa: F401 — fills the op registry
from deepdsl.autodiff import infer_program, train_program
from deepdsl.config import from_env
from deepdsl.errors import DslError, DslProgramError
from deepdsl.frontend import ast
from deepdsl.frontend.elaborate import Elaborator
from deepdsl.frontend.parser import parse_text
from deepdsl.frontend.program import Program
from deepdsl.ir import Graph
from deepdsl.ir.verify import check_graph
from deepdsl.memory import Plan, plan
from deepdsl.memory.check import check_plan
from deepdsl.passes import PassStat, run_pipeline

STAGES = ("ast", "graph", "train", "infer", "opt", "plan")


@dataclass
class Compilation:
    """What a run of the driver produced so far, and the source texts for rendering diagnostics."""

    sources: dict[str, str] = field(default_factory=dict)
    module: ast.Module | None = None
    program: Program | None = None
    train: Graph | None = None
    infer: Graph | None = None
    opt: Graph | None = None  # the optimised training program
    plan: Plan | None = None  # its memory plan (of the program rematerialised at level `remat`)
    remat: str = "none"
    extra_flops: int = 0  # what rematerialisation recomputes
    passes: tuple[PassStat, ...] = ()


@dataclass(frozen=True)
class Options:
    """How to optimise: the -O level, passes switched off, and a callback after each pass."""

    level: int = 2
    disabled: tuple[str, ...] = ()
    # check the graph after every pass and rematerialisation (ir/verify.py) and every plan (memory/check.py);
    # default: DEEPDSL_VERIFY (the test suite sets it)
    verify: bool = field(default_factory=lambda: from_env().verify)
    dump_after: Callable[[str, Graph], None] | None = None
    remat: str | None = None  # none, cheap or full; None: none, or with a budget the least that fits
    workspace_limit: int | None = None  # the most scratch one statement's kernel may take (None: any)


def optimise(g: Graph, options: Options) -> tuple[Graph, tuple[PassStat, ...]]:
    return run_pipeline(g, options.level, options.disabled, options.verify, options.dump_after)


def parse_stage(text: str, file: str, c: Compilation) -> ast.Module:
    c.sources[file] = text
    return parse_text(text, file)


def load_includes(module: ast.Module, c: Compilation) -> dict[str, ast.Module | DslError]:
    """Parse every file the module includes, transitively; a failure is kept for the include's site."""
    found: dict[str, ast.Module | DslError] = {}
    todo = [module]
    while todo:
        m = todo.pop()
        for item in m.items:
            if not isinstance(item, ast.Include):
                continue
            path = str((Path(m.file).parent / item.path).resolve())
            if path in found:
                continue
            try:
                text = read_source(path)
            except DslError as err:
                found[path] = DslProgramError(f"cannot include '{item.path}': {err.message}", item.span)
                continue
            try:
                sub = parse_stage(text, path, c)
            except DslError as err:
                found[path] = err
                continue
            found[path] = sub
            todo.append(sub)
    return found


def elaborate_stage(module: ast.Module, includes: dict, sets: dict[str, int | float]) -> Program:
    return Elaborator(module, includes, sets).run()


def compile_source(
    text: str, file: str = "<input>", sets: dict[str, int | float] | None = None, stop_at: str = "graph",
    c: Compilation | None = None, options: Options | None = None,
) -> Compilation:  # fmt: skip
    c = c if c is not None else Compilation()
    c.module = parse_stage(text, file, c)
    if stop_at == "ast":
        return c
    c.program = elaborate_stage(c.module, load_includes(c.module, c), sets or {})
    if stop_at in ("train", "opt", "plan"):
        c.train = train_program(c.program.graph, c.program.train.optimizer, c.program.train.seed)
    if stop_at in ("opt", "plan"):
        c.opt, c.passes = optimise(c.train, options or Options())
    if stop_at == "plan":
        options = options or Options()
        plan_stage(c, options.remat or "none", options.workspace_limit, options.verify)
    elif stop_at == "infer":
        c.infer = infer_program(c.program.graph)
    return c


def compile_file(
    path: str | Path,
    sets: dict[str, int | float] | None = None,
    stop_at: str = "graph",
    c: Compilation | None = None,
    options: Options | None = None,
) -> Compilation:
    return compile_source(read_source(path), str(path), sets, stop_at, c, options)


MAX_SOURCE_BYTES = 16 * 2**20


def read_source(path: str | Path) -> str:
    """The text of a .ddsl file; a missing, special, huge or non-UTF-8 file is a user error."""
    p = Path(path)
    try:
        if not p.is_file():
            raise DslProgramError(f"'{path}' is not a regular file" if p.exists() else f"file not found: '{path}'")
        if p.stat().st_size > MAX_SOURCE_BYTES:
            raise DslProgramError(f"'{path}' is larger than {MAX_SOURCE_BYTES // 2**20} MiB; is it a .ddsl file?")
        return p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DslProgramError(f"'{path}' is not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise DslProgramError(f"cannot read '{path}': {exc.strerror or exc}") from None


def has_const(c: Compilation, name: str) -> bool:
    return c.module is not None and any(isinstance(i, ast.Const) and i.name == name for i in c.module.items)


def literal_const(c: Compilation, name: str) -> int | float | None:
    """The value of const `name` when the file gives it as a plain number, else None."""
    assert c.module is not None
    for i in c.module.items:
        if isinstance(i, ast.Const) and i.name == name and isinstance(i.value, (ast.IntLit, ast.FloatLit)):
            return i.value.value
    return None


def planned(g: Graph, workspace_limit: int | None = None, verify: bool = False) -> Plan:
    """The memory plan of `g`, checked (memory/check.py) when `verify`."""
    p = plan(g, workspace_limit)
    return check_plan(p) if verify else p


def rematerialised(g: Graph, level: str, verify: bool = False) -> Graph:
    """`g` rematerialised at `level`, checked (ir/verify.py) when `verify`."""
    from deepdsl.memory.remat import rematerialise

    r = rematerialise(g, level)
    return check_graph(r) if verify and r is not g else r


def plan_stage(c: Compilation, remat: str, workspace_limit: int | None = None, verify: bool = False) -> Plan:
    """Rematerialise the optimised program at level `remat` and plan it."""
    from deepdsl.memory.report import flops

    assert c.opt is not None
    g = rematerialised(c.opt, remat, verify)
    c.plan, c.remat = planned(g, workspace_limit, verify), remat
    c.extra_flops = flops(g) - flops(c.opt) if g is not c.opt else 0
    return c.plan


def infer_plan(c: Compilation, options: Options, workspace_limit: int | None = None) -> Plan | None:
    """The plan of the inference program (optimised like the training one), or None without `predict`."""
    assert c.program is not None
    if not any(name == "predict" for name, _ in c.program.graph.outputs):
        return None
    return planned(optimise(infer_program(c.program.graph), options)[0], workspace_limit, options.verify)


def plan_within(c: Compilation, budget: int, workspace_limit: int | None = None, verify: bool = False) -> Plan:
    """The plan with the least rematerialisation whose peak fits `budget` (the `full` one when none does)."""
    from deepdsl.memory.remat import LEVELS
    from deepdsl.memory.report import total_peak

    for level in LEVELS:
        p = plan_stage(c, level, workspace_limit, verify)
        if total_peak(p) <= budget:
            break
    return p


def peak_bytes(path: str | Path, sets: dict[str, int | float], options: Options | None = None) -> int:
    """The planned peak of one training step (persistent storage + inputs + arena)."""
    from deepdsl.memory.report import report

    c = compile_file(path, sets, stop_at="plan", options=options)
    assert c.plan is not None
    return int(report(c.plan)["peak_bytes"])
