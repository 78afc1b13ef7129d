"""The staged driver shared by the CLI and the tests: text -> AST -> forward graph -> train/infer programs -> Build.

Each stage is one function; `compile_source` / `compile_file` run them up to `stop_at`, recording what they made
in a `Compilation` (and the text of every file read, so that errors can be rendered). `build` is the rest of the
pipeline, written once: the training program optimised, rematerialised and planned, and the inference program
optimised and planned, as one frozen `Build` that the trainer, `memcheck` and the backends consume.
Errors are raised as `DslError`.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import deepdsl.ops  # noqa: F401 — fills the op registry
from deepdsl.autodiff import eval_program, infer_program, train_program
from deepdsl.build import Build, Options
from deepdsl.errors import DslError, DslProgramError
from deepdsl.frontend import ast
from deepdsl.frontend.declarations import MAX_INCLUDE_DEPTH, include_path
from deepdsl.frontend.elaborate import Elaborator
from deepdsl.frontend.parser import parse_text
from deepdsl.frontend.program import Program
from deepdsl.ir import Graph
from deepdsl.ir.verify import check_graph
from deepdsl.memory import Plan, plan
from deepdsl.memory.check import check_plan
from deepdsl.memory.remat import LEVELS, rematerialise
from deepdsl.memory.report import flops, report, total_peak
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
    passes: tuple[PassStat, ...] = ()
    build: Build | None = None  # the `plan` stage: both programs planned

    @property
    def plan(self) -> Plan | None:
        """The training program's plan, once the `plan` stage ran."""
        return self.build.train_plan if self.build is not None else None


def optimise(g: Graph, options: Options, train: bool = False) -> tuple[Graph, tuple[PassStat, ...]]:
    """`g` through the pass pipeline at `options.precision` (resolved by `resolved` before: never None here); the
    data-parallel pass (Options.buckets) on a training program only."""
    buckets = options.buckets if train else None
    if buckets is not None and options.sync_batch_norm:
        buckets = dataclasses.replace(buckets, sync_batch_norm=True)
    # under rematerialisation (a memory budget) the updates stay beside their gradients: the multi-tensor launch
    # keeps every gradient live to the end of the backward pass, which is memory a budget cannot spare
    disabled = options.disabled + (("multi_tensor",) if options.remat not in (None, "none") else ())
    return run_pipeline(g, options.level, disabled, options.verify, options.dump_after, buckets,
                        precision=options.precision or "fp32")  # fmt: skip


def resolved(program: Program, options: Options) -> Options:
    """`options` with its precision and sync_batch_norm decided: the flags, else the train block's."""
    if options.precision is None:
        options = dataclasses.replace(options, precision=program.train.precision)
    if options.sync_batch_norm is None:
        options = dataclasses.replace(options, sync_batch_norm=program.train.sync_batch_norm)
    return options


def parse_stage(text: str, file: str, c: Compilation) -> ast.Module:
    c.sources[file] = text
    return parse_text(text, file)


def load_includes(module: ast.Module, c: Compilation) -> dict[str, ast.Module | DslError]:
    """Parse every file the module includes, transitively; a failure is kept for the include's site."""
    found: dict[str, ast.Module | DslError] = {}
    todo = deque([(module, 0)])  # breadth first: each file at the depth of its shortest chain
    while todo:
        m, depth = todo.popleft()
        if depth >= MAX_INCLUDE_DEPTH:  # what it includes is too deep: the elaborator says so at its include
            continue
        for item in m.items:
            if not isinstance(item, ast.Include):
                continue
            path = include_path(m.file, item.path)
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
                if not path.endswith(".ddsl"):  # never echo a line of what may be any file (/etc/shadow)
                    c.sources.pop(path, None)
                    line = f" (a syntax error on line {err.span.line})" if err.span else ""
                    err = DslProgramError(f"cannot include '{item.path}': it is not .ddsl text{line}", item.span)
                found[path] = err
                continue
            found[path] = sub
            todo.append((sub, depth + 1))
    return found


def elaborate_stage(module: ast.Module, includes: dict, sets: dict[str, int | float]) -> Program:
    return Elaborator(module, includes, sets).run()


def compile_source(
    text: str, file: str = "<input>", sets: dict[str, int | float] | None = None, stop_at: str = "graph",
    c: Compilation | None = None, options: Options | None = None, seed: int | None = None,
) -> Compilation:  # fmt: skip
    """Run the stages up to `stop_at`; `seed` overrides the train block's (from the `train` stage on)."""
    c = c if c is not None else Compilation()
    c.module = parse_stage(text, file, c)
    if stop_at == "ast":
        return c
    c.program = elaborate_stage(c.module, load_includes(c.module, c), sets or {})
    options = resolved(c.program, options or Options())
    if stop_at in ("train", "opt", "plan"):
        c.train = train_stage(c.program, seed)
    if stop_at in ("opt", "plan"):
        c.opt, c.passes = optimise(c.train, options, train=True)
    if stop_at == "plan":
        assert c.opt is not None
        c.build = build_stage(c.program, c.opt, c.passes, options, seed)
    elif stop_at == "infer":
        c.infer = infer_program(c.program.graph)
    return c


def compile_file(
    path: str | Path,
    sets: dict[str, int | float] | None = None,
    stop_at: str = "graph",
    c: Compilation | None = None,
    options: Options | None = None,
    seed: int | None = None,
) -> Compilation:
    return compile_source(read_source(path), str(path), sets, stop_at, c, options, seed)


MAX_SOURCE_BYTES = 16 * 2**20


def read_source(path: str | Path) -> str:
    """The text of a .ddsl file (without a UTF-8 byte order mark); a missing, special, huge or non-UTF-8 file is
    a user error."""
    p = Path(path)
    try:
        if p.is_symlink():
            p.stat()  # a symlink loop: OSError (ELOOP), reported below
        if not p.is_file():
            raise DslProgramError(f"'{path}' is not a regular file" if p.exists() else f"file not found: '{path}'")
        if p.stat().st_size > MAX_SOURCE_BYTES:
            raise DslProgramError(f"'{path}' is larger than {MAX_SOURCE_BYTES // 2**20} MiB; is it a .ddsl file?")
        return p.read_bytes().decode("utf-8-sig")  # a byte order mark is not text
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


def train_stage(program: Program, seed: int | None = None) -> Graph:
    """The training program (forward + backward + update) with the train block's seed, or `seed`."""
    cfg = program.train
    return train_program(program.graph, cfg.optimizer, cfg.seed if seed is None else seed, cfg.lr is not None,
                         freeze=cfg.freeze, lr_mult=cfg.lr_mult)  # fmt: skip


def build(program: Program, options: Options | None = None, seed: int | None = None) -> Build:
    """`program` compiled for training and inference (see `Build`); `seed` overrides the train block's."""
    options = resolved(program, options or Options())
    opt, passes = optimise(train_stage(program, seed), options, train=True)
    return build_stage(program, opt, passes, options, seed)


def build_stage(
    program: Program, opt: Graph, passes: tuple[PassStat, ...], options: Options, seed: int | None = None
) -> Build:
    """The Build of an optimised training program `opt`: it rematerialised at `options.remat` and planned, and the
    inference program (where the network has `predict`) and the test program (`loss` and `predict` in inference
    semantics) optimised like it and planned."""
    infer = infer_plan = None
    if any(name == "predict" for name, _ in program.graph.outputs):  # --dump-after shows the training program only
        infer = optimise(infer_program(program.graph), dataclasses.replace(options, dump_after=None))[0]
        infer_plan = planned(infer, options.workspace_limit, options.verify)
    quiet = dataclasses.replace(options, dump_after=None)
    test = optimise(eval_program(program.graph), quiet)[0]
    test_plan = planned(test, options.workspace_limit, options.verify)
    level = options.remat or "none"
    train_plan, extra = remat_plan(opt, level, options.workspace_limit, options.verify)
    seed = program.train.seed if seed is None else seed
    precision = options.precision or program.train.precision
    return Build(program, options, seed, opt, passes, train_plan, infer, infer_plan, level, extra, test, test_plan,
                 precision)  # fmt: skip


def planned(g: Graph, workspace_limit: int | None = None, verify: bool = False) -> Plan:
    """The memory plan of `g`, checked (memory/check.py) when `verify`."""
    p = plan(g, workspace_limit)
    return check_plan(p) if verify else p


def remat_plan(opt: Graph, level: str, workspace_limit: int | None, verify: bool = False) -> tuple[Plan, int]:
    """The plan of `opt` rematerialised at `level` (both checked when `verify`), and the FLOPs the
    rematerialisation adds to a step."""
    g = rematerialise(opt, level)
    if verify and g is not opt:
        check_graph(g)
    return planned(g, workspace_limit, verify), (flops(g) - flops(opt) if g is not opt else 0)


def with_remat(b: Build, level: str) -> Build:
    """`b` with its training program rematerialised at `level` (none, cheap or full) and planned again."""
    if level == b.remat:
        return b
    options = dataclasses.replace(b.options, remat=level, dump_after=None)
    opt = b.train
    if (level == "none") != (b.remat == "none"):  # optimise: the multi-tensor launch only without rematerialisation
        opt = optimise(train_stage(b.program, b.seed), options, train=True)[0]
    train_plan, extra = remat_plan(opt, level, b.options.workspace_limit, b.options.verify)
    return dataclasses.replace(b, train=opt, train_plan=train_plan, remat=level, extra_flops=extra)


def plan_within(b: Build, budget: int) -> Build:
    """`b` with the least rematerialisation whose peak fits `budget`; when none fits, the level with the least peak
    (the less rematerialisation of two equal ones). More rematerialisation is not always less memory: `full` keeps
    checkpoints and recomputes segments whose values may then outweigh what `cheap` saved (gpt_tiny at T=256)."""
    best: tuple[int, Build] | None = None
    for level in LEVELS:
        b = with_remat(b, level)
        peak = total_peak(b.train_plan)
        if peak <= budget:
            return b
        if best is None or peak < best[0]:
            best = (peak, b)
    assert best is not None
    return best[1]


def peak_bytes(path: str | Path, sets: dict[str, int | float], options: Options | None = None) -> int:
    """The planned peak of one training step (persistent storage + inputs + arena)."""
    c = compile_file(path, sets, stop_at="plan", options=options)
    assert c.build is not None
    return int(report(c.build.train_plan)["peak_bytes"])
