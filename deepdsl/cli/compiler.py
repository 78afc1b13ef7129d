"""The commands that compile FILE and print or write what the compiler makes, running nothing: `check`, `ir`,
`memcheck` and `compile`.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from typing import Any

import click

from deepdsl import api
from deepdsl.cli.options import (
    DETERMINISTIC,
    EXIT_USER,
    JSON_HELP,
    PRECISION,
    REPLACE_READONLY,
    SYNC_BATCH_NORM,
    WORKSPACE_LIMIT,
    bucketing,
    common,
    data_parallel_options,
    echo_warnings,
    parse_pass,
)
from deepdsl.frontend.ast import format_node
from deepdsl.ir.printer import format_graph
from deepdsl.memory import format_plan
from deepdsl.summaries import check_json, check_text, json_text, memory_report, stats_json, stats_text


def _plot_path(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--plot FILE: a format matplotlib writes, in a folder that exists (checked before anything is compiled)."""
    import os

    from deepdsl.memory.report import PLOT_FORMATS

    if value is None:
        return None
    suffix = os.path.splitext(value)[1].lower().lstrip(".")
    if suffix not in PLOT_FORMATS:
        raise click.BadParameter(
            f"{value!r}: the file name must end in " + ", ".join(f".{f}" for f in PLOT_FORMATS), ctx, param
        )
    folder = os.path.dirname(os.path.abspath(value))
    if not os.path.isdir(folder):
        raise click.BadParameter(f"{value!r}: folder {folder!r} does not exist", ctx, param)
    return value


@click.command()
@common
@click.option("--json", "as_json", is_flag=True, help=JSON_HELP)
@click.option("--layers", is_flag=True, help="Also print every layer with its output shape and parameters.")
def check(c: api.Compilation, file: str, sets: dict, options: api.Options, as_json: bool, layers: bool) -> None:
    """Parse and shape-check FILE; print its inputs, outputs and parameter count."""
    api.compile_file(file, sets, c=c)
    assert c.program is not None
    echo_warnings(c)
    if as_json:
        click.echo(json_text(check_json(c.program)))
    else:
        click.echo(check_text(c.program, file, layers))


@click.command()
@common
@click.option("--stage", type=click.Choice(api.STAGES), default=None,
              help="Which stage to print (default: opt; with --stats, every stage).")  # fmt: skip
@click.option("--dump-after", "dump_after", metavar="PASS", default=None, callback=parse_pass,
              help="Also print the training program after this optimiser pass.")  # fmt: skip
@click.option("--stats", is_flag=True, help="Statements and kernels per stage and per pass instead of the program.")
@click.option("--json", "as_json", is_flag=True, help="With --stats: one JSON object (docs/formats.md, JSON outputs).")
@click.option("--data-parallel", "data_parallel", is_flag=True,
              help="The training program of one data-parallel rank (opt and plan stages): its gradient buckets' "
              "all-reduces (docs/distributed.md).")  # fmt: skip
@SYNC_BATCH_NORM
def ir(c: api.Compilation, file: str, sets: dict, options: api.Options, stage: str | None, dump_after: str | None,
       stats: bool, as_json: bool, data_parallel: bool, sync_batch_norm: bool | None) -> None:  # fmt: skip
    """Print FILE at one stage of the compiler, in a stable text form."""
    if sync_batch_norm and not data_parallel:
        raise click.UsageError("--sync-batch-norm synchronises the ranks of a data-parallel program: add "
                               "--data-parallel")  # fmt: skip
    options = dataclasses.replace(options, sync_batch_norm=sync_batch_norm)
    if data_parallel:
        options = dataclasses.replace(options, buckets=bucketing(1, 1, 25.0, always=True))
    if dump_after:

        def dump(name: str, g: Any) -> None:
            if name == dump_after:
                click.echo(f"# after {name}\n{format_graph(g)}", nl=False)

        options = dataclasses.replace(options, dump_after=dump)
    if stats:
        api.compile_file(file, sets, stop_at="opt", c=c, options=options)
        echo_warnings(c)
        click.echo(json_text(stats_json(c, stage)) if as_json else stats_text(stats_json(c, stage)))
        return
    stage = stage or "opt"
    api.compile_file(file, sets, stop_at=stage, c=c, options=options)
    if stage == "ast":
        assert c.module is not None
        click.echo(format_node(c.module))
        return
    assert c.program is not None
    echo_warnings(c)
    if stage == "plan":
        assert c.build is not None
        click.echo(format_plan(c.build.train_plan), nl=False)
        return
    graph = {"graph": c.program.graph, "train": c.train, "infer": c.infer, "opt": c.opt}[stage]
    assert graph is not None
    click.echo(format_graph(graph), nl=False)


@click.command()
@common
@click.option("--gpu-mem", "gpu_mem", metavar="SIZE", default=None, help="A budget such as 16GiB: does it fit, and the "
              "largest batch that does.")  # fmt: skip
@click.option("--layers", "table", flag_value="layers", default=True, help="A row per layer (the default).")
@click.option("--statements", "table", flag_value="statements", help="A row per statement of the schedule.")
@click.option("--totals", "table", flag_value="totals", help="Totals only.")
@click.option(
    "--plot",
    "plot_path",
    metavar="FILE",
    default=None,
    callback=_plot_path,
    help="Also draw live memory over the schedule, peak marked, into FILE (.png/.svg/.pdf; needs matplotlib).",
)
@REPLACE_READONLY
@WORKSPACE_LIMIT
@data_parallel_options
@PRECISION
@click.option("--json", "as_json", is_flag=True, help=JSON_HELP)
def memcheck(c: api.Compilation, file: str, sets: dict, options: api.Options, gpu_mem: str | None, table: str,
             plot_path: str | None, replace_readonly: bool, workspace_limit: int | None, ranks: int | None,
             micro_batches: int, bucket_mb: float, sync_batch_norm: bool | None, precision: str | None,
             as_json: bool) -> None:  # fmt: skip
    """The static memory plan of one training step of FILE: what is allocated, freed and live, and the peak. With
    --ranks or --micro-batches: one rank's plan of data-parallel training (its gradient buckets held until
    reduced)."""
    options = dataclasses.replace(options, workspace_limit=workspace_limit, precision=precision,
                                  buckets=bucketing(ranks or 1, micro_batches, bucket_mb),
                                  sync_batch_norm=sync_batch_norm)  # fmt: skip
    from deepdsl.memory.report import MissingDependency, format_report, over_budget, parse_size, plot

    if plot_path is not None:  # before the work
        from deepdsl.files import check_replaceable

        try:
            check_replaceable(plot_path, replace_readonly=replace_readonly)
        except OSError as exc:
            click.echo(f"error: cannot write the plot {plot_path!r}: {exc.strerror or exc}", err=True)
            sys.exit(EXIT_USER)
    budget = None
    if gpu_mem is not None:
        try:
            budget = parse_size(gpu_mem)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--gpu-mem") from None
    b, r = memory_report(c, file, sets, options, budget, per_statement=table == "statements",
                         micro_batches=micro_batches)  # fmt: skip
    echo_warnings(c)
    if options.buckets is not None:
        from deepdsl.passes.sync_batch_norm import refuse_micro_batches

        train = b.program.train
        refuse_micro_batches(b.train, micro_batches, train.sync_batch_norm_at if train.sync_batch_norm else None)
        from deepdsl.summaries import data_parallel_report, data_parallel_text

        r["data_parallel"] = data_parallel_report(b, file, sets, options, ranks or 1, micro_batches)
    if plot_path is not None:
        try:
            plot(b.train_plan, r, plot_path, replace_readonly)
        except MissingDependency as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(EXIT_USER)
        except OSError as exc:
            click.echo(f"error: cannot write the plot {plot_path!r}: {exc.strerror or exc}", err=True)
            sys.exit(EXIT_USER)
    click.echo(json_text(r) if as_json else format_report(r, table != "totals"))
    if "data_parallel" in r and not as_json:
        click.echo(data_parallel_text(r["data_parallel"]))
    if plot_path is not None:
        click.echo(f"plot: wrote {plot_path}", err=as_json)
    if budget is not None and not r["fits"]:
        raise over_budget(b.train_plan, r)


@click.command("compile")
@common
@click.option("-o", "--output", "output", metavar="PATH", default=None,
              help="Where to write the Java class: DIR, or DIR/Name.java (Name is the network's); the runtime goes "
                   "under DIR/deepdsl/runtime/.")  # fmt: skip
@click.option(
    "--maven",
    "maven",
    metavar="DIR",
    default=None,
    help="Also (or instead) write a Maven project that `mvn -q package` builds into a runnable jar.",
)
@WORKSPACE_LIMIT
@DETERMINISTIC
@click.option(
    "--ptx",
    "ptx",
    is_flag=True,
    help="Also compile every kernel to PTX with NVRTC or nvcc, beside the class (Name.sm_90.ptx, ...).",
)
@click.option("--arch", "archs", metavar="SM,...", default="sm_90,sm_80", show_default=True,
              help="The GPU architectures --ptx compiles for.")  # fmt: skip
@click.option("--data-parallel", "data_parallel", is_flag=True,
              help="Compile the data-parallel pass in: the program then trains on any number of ranks (mpiexec, "
              "torchrun, srun) and accumulates --micro-batches (docs/distributed.md).")  # fmt: skip
@click.option("--bucket-mb", "bucket_mb", type=click.FloatRange(min=0, min_open=True), default=25.0,
              show_default=True, metavar="MB",
              help="With --data-parallel: the size at which a gradient bucket closes (the first at 1 MB or less).",
              )  # fmt: skip
@SYNC_BATCH_NORM
@REPLACE_READONLY
@PRECISION
def compile_(c: api.Compilation, file: str, sets: dict, options: api.Options, output: str | None, maven: str | None,
             workspace_limit: int | None, deterministic: bool, ptx: bool, archs: str, data_parallel: bool,
             bucket_mb: float, sync_batch_norm: bool | None, replace_readonly: bool,
             precision: str | None) -> None:  # fmt: skip
    """Compile FILE to a Java training program (one readable class plus the runtime it needs)."""
    from deepdsl import compiling
    from deepdsl.backends.java import DEFAULT_WORKSPACE_LIMIT

    if output is None and maven is None:
        raise click.UsageError("say where to write the program: -o DIR, -o DIR/Name.java or --maven DIR")
    if sync_batch_norm and not data_parallel:
        raise click.UsageError("--sync-batch-norm synchronises the ranks of a data-parallel program: add "
                               "--data-parallel")  # fmt: skip
    wanted = tuple(a.strip() for a in archs.split(",") if a.strip()) if ptx else ()
    if ptx and (not wanted or any(not re.fullmatch(r"sm_[0-9]{2,3}", a) for a in wanted)):
        raise click.BadParameter(f"{archs!r} is not a list such as sm_90,sm_80", param_hint="--arch")
    limit = DEFAULT_WORKSPACE_LIMIT if workspace_limit is None else workspace_limit
    # the plan follows the limit: convolutions allowed scratch get it in the arena
    options = dataclasses.replace(options, workspace_limit=limit, deterministic=deterministic, precision=precision,
                                  sync_batch_norm=sync_batch_norm)  # fmt: skip
    if data_parallel:
        options = dataclasses.replace(options, buckets=bucketing(1, 1, bucket_mb, always=True))
    api.compile_file(file, sets, stop_at="plan", c=c, options=options)
    assert c.build is not None
    echo_warnings(c)
    try:
        for line in compiling.write_program(c.build, output, maven, limit, wanted, replace_readonly):
            click.echo(line)
    except compiling.BadTarget as exc:
        if exc.option == "-o":
            raise click.UsageError(exc.message) from None
        raise click.BadParameter(exc.message, param_hint=exc.option) from None
