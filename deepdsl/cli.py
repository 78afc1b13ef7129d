"""The command line: parses options, calls the driver (`api`), hands its Build to the trainer and the backends,
renders. No compiler logic here.

Exit codes: 0 ok, 1 an error in the user's input, 2 a usage error, 3 an internal error.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
import traceback
from collections.abc import Callable
from functools import wraps
from typing import Any

import click

from deepdsl import __version__, api
from deepdsl.config import from_env
from deepdsl.errors import DslError, did_you_mean, render
from deepdsl.frontend.ast import format_node
from deepdsl.ir.printer import format_graph
from deepdsl.memory import format_plan
from deepdsl.passes import PASS_NAMES
from deepdsl.summaries import check_json, check_text, json_text, memory_report, stats_json, stats_text

EXIT_USER, EXIT_USAGE, EXIT_INTERNAL = 1, 2, 3
# where the --json objects are described (tests/security/test_cli_inputs.py: every document a help text cites exists)
JSON_HELP = "Print one JSON object (docs/formats.md, JSON outputs) and nothing else."


def _parse_set(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, int | float]:
    out: dict[str, int | float] = {}
    for item in values:
        name, eq, raw = item.partition("=")
        if not eq or not name.strip().isidentifier():
            raise click.BadParameter(f"expected NAME=VALUE, got {item!r}", ctx, param)
        try:
            value: int | float = int(raw)
        except ValueError:
            try:
                value = float(raw)
            except ValueError:
                raise click.BadParameter(f"{name}: {raw!r} is not a number", ctx, param) from None
        out[name.strip()] = value
    return out


def _parse_passes(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple[str, ...]:
    for name in values:
        if name not in PASS_NAMES:
            hint = did_you_mean(name, PASS_NAMES)
            known = f" (passes: {', '.join(PASS_NAMES)})"
            raise click.BadParameter(f"no pass named {name!r}" + (f"; {hint}" if hint else known), ctx, param)
    return values


def _parse_pass(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    return _parse_passes(ctx, param, (value,))[0] if value else None


def _parse_limit(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    from deepdsl.memory.report import parse_size

    if value is None:
        return None
    try:
        return parse_size(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _parse_data(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A malformed --data source is a usage error (exit 2), found before anything is compiled or allocated."""
    from deepdsl.data import parse_data_flag

    if value is not None:
        try:
            parse_data_flag(value)
        except DslError as exc:
            raise click.BadParameter(exc.message, ctx, param) from None
    return value


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


def _parse_url(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A --url that is not an http(s) URL with a host (an empty one included) is a usage error."""
    from deepdsl.data.download import check_url

    if value is not None:
        try:
            check_url(value)
        except DslError as exc:
            raise click.BadParameter(exc.message.removeprefix(f"--url {value!r} ").removeprefix("--url "), ctx,
                                     param) from None  # fmt: skip
    return value


def _file_name(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None and not value.strip():
        raise click.BadParameter("needs a file name", ctx, param)
    return value


REPLACE_READONLY = click.option(
    "--replace-readonly", "replace_readonly", is_flag=True,
    help="Replace a read-only file at a path this command writes (refused otherwise). A symbolic link there is "
    "always refused: deepdsl never writes through a link (docs/formats.md).",
)  # fmt: skip
WORKSPACE_LIMIT = click.option(
    "--workspace-limit", "workspace_limit", metavar="SIZE", default=None, callback=_parse_limit,
    help="The most scratch one statement's kernel may take (e.g. 64MiB; 0: none): larger needs use a kernel "
    "without scratch (a direct convolution instead of im2col + GEMM). Default: no limit (compile: 1GiB).",
)  # fmt: skip
DETERMINISTIC = click.option(
    "--deterministic", "deterministic", is_flag=True,
    help="On the GPU: cuDNN's heuristic, deterministic convolution algorithms (the same bits every run) instead of "
    "the fastest, found by timing each at the start (which may be nondeterministic).",
)  # fmt: skip


SYNC_BATCH_NORM = click.option(
    "--sync-batch-norm/--no-sync-batch-norm", "sync_batch_norm", default=None,
    help="Data-parallel: every batch norm normalises with the global batch's statistics (small blocking "
    "all-reduces per batch norm; not with --micro-batches). Default: the train block's `sync_batch_norm`, else off.",
)  # fmt: skip


def _data_parallel_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--ranks, --micro-batches, --bucket-mb, --sync-batch-norm: data-parallel training and gradient accumulation
    (docs/distributed.md)."""
    fn = SYNC_BATCH_NORM(fn)
    fn = click.option("--bucket-mb", "bucket_mb", type=click.FloatRange(min=0, min_open=True), default=25.0,
                      show_default=True, metavar="MB",
                      help="Data-parallel: the size at which a gradient bucket closes (the first closes at "
                      "1 MB or less).")(fn)  # fmt: skip
    fn = click.option("--micro-batches", "micro_batches", type=click.IntRange(1, 65536), default=1,
                      show_default=True, metavar="M",
                      help="Sum the gradients of M batches of N before each update (gradient accumulation: the "
                      "global batch is M x N per rank).")(fn)  # fmt: skip
    fn = click.option("--ranks", type=click.IntRange(1, 65536), default=None, metavar="R",
                      help="Data-parallel ranks (default: the launcher's environment, torchrun / mpiexec / srun, "
                      "else 1).")(fn)  # fmt: skip
    return fn


def _bucketing(ranks: int, micro_batches: int, bucket_mb: float, always: bool = False) -> Any:
    """The data-parallel pass's setting for these flags: None for one rank and one micro-batch (unless `always`)."""
    from deepdsl.passes.data_parallel import MIB, Bucketing

    if ranks == 1 and micro_batches == 1 and not always:
        return None
    size = max(1, int(bucket_mb * MIB))
    return Bucketing(size, min(size, MIB))


PRECISION = click.option(
    "--precision", type=click.Choice(["fp32", "tf32", "bf16"]), default=None,
    help="fp32; tf32 (fp32 storage, TF32 tensor-op GEMMs and convolutions on the GPU's cuBLAS and cuDNN); bf16 "
    "(mixed precision: activations and their gradients bf16 where the op allows, fp32 weights, optimizer, "
    "statistics and losses). Default: the train block's `precision`, else fp32 (docs/running.md).",
)  # fmt: skip


def common(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The options every compiling command shares, and the error handling that gives exit codes."""

    @click.argument("file", type=click.Path(exists=True, dir_okay=False))
    @click.option("--set", "sets", multiple=True, callback=_parse_set, metavar="NAME=VALUE",
                  help="Override a const of the network (repeatable).")  # fmt: skip
    @click.option("-O", "level", type=click.IntRange(0, 2), default=2, show_default=True,
                  help="Optimisation level: -O0 none, -O1 simplify/cse/dce, -O2 everything.")  # fmt: skip
    @click.option("--no-pass", "no_pass", multiple=True, callback=_parse_passes, metavar="NAME",
                  help=f"Switch one optimiser pass off (repeatable): {', '.join(PASS_NAMES)}.")  # fmt: skip
    @click.option("--remat", type=click.Choice(["none", "cheap", "full"]), default=None,
                  help="Recompute forward values in the backward pass instead of keeping them: cheap (element-wise, "
                  "batch-norm apply, ReLU) or full (also checkpointed segments). Default none; with --gpu-mem, the "
                  "least that fits.")  # fmt: skip
    @click.option("--verify", is_flag=True, help="Check the program after every pass and every memory plan (a "
                  "failure is an internal error, exit 3). Also on with DEEPDSL_VERIFY=1.")  # fmt: skip
    @wraps(fn)
    def run(
        file: str, sets: dict[str, int | float], level: int, no_pass: tuple[str, ...], remat: str | None,
        verify: bool, **kw: Any,
    ) -> None:  # fmt: skip
        c = api.Compilation()
        try:
            options = api.Options(level, no_pass, remat=remat, **({"verify": True} if verify else {}))
            fn(c, file, sets, options, **kw)
        except DslError as err:
            click.echo(render(err, c.sources), err=True)
            sys.exit(EXIT_USER)
        except click.exceptions.Exit:
            raise
        except click.ClickException:
            raise
        except BrokenPipeError:  # the reader went away (`deepdsl run ... | head`): stop quietly
            sys.stderr.close()
            sys.exit(0)
        except Exception as exc:  # noqa: BLE001 — anything else is our bug
            if from_env().debug:
                traceback.print_exc()
            click.echo(
                f"internal error: {type(exc).__name__}: {exc}\n"
                "This is a bug in deepdsl. Please report it with the input file and this command line "
                "(DEEPDSL_DEBUG=1 shows the traceback).",
                err=True,
            )
            sys.exit(EXIT_INTERNAL)

    return run


def _warnings(c: api.Compilation) -> None:
    if c.program is not None:
        for w in c.program.warnings:
            click.echo(render(w, c.sources), err=True)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="deepdsl")
def cli() -> None:
    """deepdsl: compile deep networks written in .ddsl to checked, optimised programs."""


@cli.command()
@common
@click.option("--json", "as_json", is_flag=True, help=JSON_HELP)
@click.option("--layers", is_flag=True, help="Also print every layer with its output shape and parameters.")
def check(c: api.Compilation, file: str, sets: dict, options: api.Options, as_json: bool, layers: bool) -> None:
    """Parse and shape-check FILE; print its inputs, outputs and parameter count."""
    api.compile_file(file, sets, c=c)
    assert c.program is not None
    _warnings(c)
    if as_json:
        click.echo(json_text(check_json(c.program)))
    else:
        click.echo(check_text(c.program, file, layers))


@cli.command()
@common
@click.option("--stage", type=click.Choice(api.STAGES), default=None,
              help="Which stage to print (default: opt; with --stats, every stage).")  # fmt: skip
@click.option("--dump-after", "dump_after", metavar="PASS", default=None, callback=_parse_pass,
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
        options = dataclasses.replace(options, buckets=_bucketing(1, 1, 25.0, always=True))
    if dump_after:

        def dump(name: str, g: Any) -> None:
            if name == dump_after:
                click.echo(f"# after {name}\n{format_graph(g)}", nl=False)

        options = dataclasses.replace(options, dump_after=dump)
    if stats:
        api.compile_file(file, sets, stop_at="opt", c=c, options=options)
        _warnings(c)
        click.echo(json_text(stats_json(c, stage)) if as_json else stats_text(stats_json(c, stage)))
        return
    stage = stage or "opt"
    api.compile_file(file, sets, stop_at=stage, c=c, options=options)
    if stage == "ast":
        assert c.module is not None
        click.echo(format_node(c.module))
        return
    assert c.program is not None
    _warnings(c)
    if stage == "plan":
        assert c.build is not None
        click.echo(format_plan(c.build.train_plan), nl=False)
        return
    graph = {"graph": c.program.graph, "train": c.train, "infer": c.infer, "opt": c.opt}[stage]
    assert graph is not None
    click.echo(format_graph(graph), nl=False)


@cli.command()
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
@_data_parallel_options
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
                                  buckets=_bucketing(ranks or 1, micro_batches, bucket_mb),
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
    _warnings(c)
    if options.buckets is not None:
        from deepdsl.passes.data_parallel import refuse_micro_batches

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


DEVICE = click.option(
    "--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
    help="Where to run: the NumPy runner (cpu) or the PyCUDA runner (cuda).",
)  # fmt: skip
KERNELS = click.option(
    "--kernels", type=click.Choice(["auto", "vendor", "own"]), default="auto", show_default=True,
    help="On the GPU: vendor libraries (cuBLAS) where an op has one, or our kernels only (own); auto: vendor "
         "where the libraries load.",
)  # fmt: skip
TRAINED = click.option(
    "--load", "load_path", type=click.Path(dir_okay=False), required=True, callback=_file_name,
    help="The trained parameters (a .npz file of run --save or the Java program's --save).",
)  # fmt: skip


def _setting(ctx: click.Context, param: click.Parameter, value: str | None) -> float | int | None:
    """A numeric option of `run` in its range (running.SETTING_RANGES, the Java program's too): a usage error else."""
    from deepdsl.running import parse_setting

    if value is None:
        return None
    try:
        return parse_setting(param.opts[0], value)
    except ValueError as exc:
        raise click.BadParameter(str(exc).removeprefix(f"{param.opts[0]} "), ctx, param) from None


def _optimizer_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--lr, --momentum, ...: the optimizer's hyperparameters, as the Java program's flags of the same names."""
    for flag in reversed(("--lr", "--momentum", "--weight-decay", "--beta1", "--beta2", "--eps", "--clip", "--alpha")):
        fn = click.option(flag, metavar="X", default=None, callback=_setting,
                          help=f"The optimizer's {flag[2:].replace('-', ' ')} instead of the train block's"
                          + (" (with a schedule: its base rate)." if flag == "--lr" else "."))(fn)  # fmt: skip
    return fn


@cli.command()
@common
@click.option("--iters", metavar="N", default=None, callback=_setting,
              help="Training steps (default: the train block's), at most 10,000,000.")  # fmt: skip
@click.option("--data", "data_flag", metavar="SOURCE", default=None, callback=_parse_data,
              help="synthetic[:SEED] | mnist:DIR | cifar10:DIR | npz:FILE | text:FILE | images:DIR | csv:FILE "
              "(default: the train block's; "
              "SEED: the synthetic data's own seed, else the program's).")  # fmt: skip
@click.option("--load", "load_path", type=click.Path(dir_okay=False), default=None, callback=_file_name,
              help="Start from this .npz file.")  # fmt: skip
@click.option("--save", "save_path", type=click.Path(dir_okay=False), default=None, callback=_file_name,
              help="Write the final state here.")  # fmt: skip
@REPLACE_READONLY
@DEVICE
@KERNELS
@click.option("--seed", type=int, default=None, help="Override the train block's seed.")
@click.option("--float64", "double", is_flag=True, help="Run in float64 (the reference precision for checks).")
@WORKSPACE_LIMIT
@DETERMINISTIC
@click.option("--graph/--no-graph", "graphs", default=True, show_default=True,
              help="On the GPU: replay the train step as a CUDA graph from its second iteration on.")  # fmt: skip
@PRECISION
@_optimizer_options
@_data_parallel_options
@click.option("--rank", type=click.IntRange(0, 65535), default=None, metavar="R",
              help="This process's rank (default: the launcher's environment).")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help=JSON_HELP)
def run(
    c: api.Compilation, file: str, sets: dict, options: api.Options, iters: int | None, data_flag: str | None,
    load_path: str | None, save_path: str | None, replace_readonly: bool, device: str, kernels: str,
    seed: int | None, double: bool, workspace_limit: int | None, deterministic: bool, graphs: bool,
    precision: str | None, ranks: int | None, micro_batches: int, bucket_mb: float, sync_batch_norm: bool | None,
    rank: int | None, as_json: bool, **optimizer: float | None,
) -> None:  # fmt: skip
    """Train FILE for a few iterations with the reference runner and report the losses. Under mpiexec / mpirun /
    srun (or with --ranks), each process trains one rank of a data-parallel run (docs/distributed.md)."""
    from deepdsl import distributed, running

    config = from_env()
    world = distributed.world_from_env(ranks=ranks, rank=rank)
    options = dataclasses.replace(options, workspace_limit=workspace_limit, deterministic=deterministic,
                                  precision=precision, sync_batch_norm=sync_batch_norm,
                                  buckets=_bucketing(world.size, micro_batches, bucket_mb,
                                                     always=config.dp_force and device == "cuda"))  # fmt: skip
    session = None
    if options.buckets is not None:
        if device == "cuda":  # the PyCUDA runner: NCCL on the local rank's GPU (auto: the NumPy runner over MPI)

            def report_failure(line: str) -> None:
                click.echo(f"error: {line}", err=True)
                sys.stderr.flush()

            session = distributed.open_gpu_session(world, micro_batches, config.dp_timeout, config.dp_fault,
                                                   report_failure, force=config.dp_force)  # fmt: skip
        else:
            device = "cpu"
            session = distributed.open_session(world, micro_batches, config.dp_timeout, config.dp_fault)
    lead = world.rank == 0  # rank 0 alone prints, writes --json and saves
    api.compile_file(file, sets, c=c)
    assert c.program is not None
    if lead:
        _warnings(c)
    try:
        program = running.with_settings(c.program, {k: v for k, v in optimizer.items() if v is not None})
    except DslError as exc:
        raise click.UsageError(exc.message) from None
    report = None if as_json or not lead else lambda line: click.echo(line)
    try:
        result = running.run_training(
            api.build(program, options, seed), iters=iters, data_flag=data_flag, load=load_path, save=save_path,
            device=device, double=double, report=report, kernels=kernels, graphs=graphs,
            replace_readonly=replace_readonly,
            warn=(lambda line: click.echo(f"warning: {line}", err=True)) if lead else None, session=session,
        )  # fmt: skip
    except distributed.DistributedError as err:
        if err.abort and session is not None:  # the others may be stuck in a reduction: stop them all
            click.echo(render(err, c.sources), err=True)
            sys.stderr.flush()
            session.abort()
            os._exit(EXIT_USER)  # MPI_Abort may return before the launcher ends this process
        raise
    finally:
        if session is not None:
            session.close()
    if as_json and lead:
        click.echo(json_text(result))


@cli.command("eval")
@common
@TRAINED
@click.option("--data", "data_flag", metavar="SOURCE", default=None, callback=_parse_data,
              help="synthetic | mnist:DIR | cifar10:DIR | npz:FILE | text:FILE | images:DIR | csv:FILE "
              "(default: the train block's).")  # fmt: skip
@DEVICE
@KERNELS
@click.option("--json", "as_json", is_flag=True, help=JSON_HELP)
def eval_(c: api.Compilation, file: str, sets: dict, options: api.Options, load_path: str, data_flag: str | None,
          device: str, kernels: str, as_json: bool) -> None:  # fmt: skip
    """The test loss (and accuracy, for a classifier) of FILE with the parameters of --load; no training."""
    from deepdsl import running

    api.compile_file(file, sets, c=c)
    assert c.program is not None
    _warnings(c)
    report = None if as_json else lambda line: click.echo(line)
    result = running.evaluate(api.build(c.program, options), load_path, data_flag, device, report, kernels=kernels)
    if as_json:
        click.echo(json_text(result))


@cli.command()
@common
@TRAINED
@click.option(
    "--data",
    "data_flag",
    metavar="SOURCE",
    default=None,
    callback=_parse_data,
    help="The samples: npz:FILE (arrays named after the inputs), or synthetic, mnist:DIR, cifar10:DIR, images:DIR, "
    "csv:FILE.",
)
@click.option("-o", "output", type=click.Path(dir_okay=False), required=True, callback=_file_name,
              help="Where to write the predictions (.npz, the array `predict`).")  # fmt: skip
@click.option("--split", type=click.Choice(["test", "train"]), default=None,
              help="Which samples: the data's test split (the default where it has one) or its training split "
              "(the default for data without a test split, such as an npz file of inputs).")  # fmt: skip
@REPLACE_READONLY
@DEVICE
@KERNELS
@click.option("--json", "as_json", is_flag=True, help=JSON_HELP)
def predict(c: api.Compilation, file: str, sets: dict, options: api.Options, load_path: str, data_flag: str | None,
            output: str, split: str | None, replace_readonly: bool, device: str, kernels: str,
            as_json: bool) -> None:  # fmt: skip
    """`predict` of FILE with the parameters of --load for every sample of --data, written to -o."""
    from deepdsl import running

    api.compile_file(file, sets, c=c)
    assert c.program is not None
    _warnings(c)
    report = None if as_json else lambda line: click.echo(line)
    build = api.build(c.program, options)
    result = running.predict(build, load_path, output, data_flag, device, report, kernels=kernels,
                             replace_readonly=replace_readonly, split=split)  # fmt: skip
    if as_json:
        click.echo(json_text(result))


@cli.command("compile")
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
        options = dataclasses.replace(options, buckets=_bucketing(1, 1, bucket_mb, always=True))
    api.compile_file(file, sets, stop_at="plan", c=c, options=options)
    assert c.build is not None
    _warnings(c)
    try:
        for line in compiling.write_program(c.build, output, maven, limit, wanted, replace_readonly):
            click.echo(line)
    except compiling.BadTarget as exc:
        if exc.option == "-o":
            raise click.UsageError(exc.message) from None
        raise click.BadParameter(exc.message, param_hint=exc.option) from None


@cli.command("data")
@click.argument("name", type=click.Choice(["mnist", "cifar10"]))
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--url", "base_url", metavar="URL", default=None, callback=_parse_url,
              help="Download from this base URL instead of the canonical one (a mirror); the checksums stay the "
              "canonical files'. Also DEEPDSL_DATA_URL.")  # fmt: skip
@click.option("--deadline", type=click.FloatRange(min=0, min_open=True), default=3600, show_default=True,
              metavar="SECONDS", help="Give up when the whole download takes longer.")  # fmt: skip
@click.option("--min-rate", "min_rate", type=click.FloatRange(min=0), default=16384, show_default=True,
              metavar="BYTES", help="Give up on a file that averages fewer bytes a second, 30 s after its "
              "request.")  # fmt: skip
def data_(name: str, directory: str, base_url: str | None, deadline: float, min_rate: float) -> None:
    """Download data set NAME (mnist or cifar10) into DIRECTORY, each file checked against its published SHA-256
    and written atomically; files already there and correct are kept. Progress goes to stderr. A failure leaves
    no partial file and no folder this command made."""
    from deepdsl.data.download import Limits, download
    from deepdsl.memory.report import size

    shown = {"name": "", "percent": -1}

    def progress(file: str, done: int, total: int) -> None:
        percent = 100 * done // max(total, 1)
        if file == shown["name"] and percent == shown["percent"]:
            return
        shown.update(name=file, percent=percent)
        bar = "#" * (percent * 24 // 100)
        click.echo(f"\r{file:<28} [{bar:.<24}] {percent:>3}%  {size(done)} of {size(total)}", err=True, nl=False)
        if done >= total:
            click.echo("", err=True)
            shown["name"] = ""

    try:
        url = base_url if base_url is not None else from_env().data_url  # --url "": an error, not the default
        paths = download(name, directory, url, progress, limits=Limits(deadline=deadline, min_rate=min_rate))
    except DslError as err:
        if shown["name"]:  # end the bar's line before the error
            click.echo("", err=True)
        click.echo(render(err, {}), err=True)
        sys.exit(EXIT_USER)
    click.echo(f"{name}: {len(paths)} files in {directory}; train on them with --data {name}:{directory}")


def _import(c: api.Compilation, file: str, sets: dict, options: api.Options, output: str, params: str | None,
            batch: int | None, no_loss: bool, replace_readonly: bool) -> None:  # fmt: skip
    from deepdsl import interop

    for line in interop.import_onnx(file, output, params, batch, not no_loss, replace_readonly):
        click.echo(line)


@cli.command("import")
@click.argument("model", type=click.Path(exists=True, dir_okay=False))
@click.option("-o", "--output", "output", metavar="NET.ddsl", required=True, callback=_file_name,
              help="Where to write the network.")  # fmt: skip
@click.option(
    "--params",
    "params",
    metavar="F.npz",
    default=None,
    callback=_file_name,
    help="Where to write the initialisers as a parameter file (default: NET.npz beside the network).",
)
@click.option("--batch", type=click.IntRange(min=1), default=None,
              help="The batch N (default: the model's, or 1 where it is symbolic).")  # fmt: skip
@click.option("--no-loss", "no_loss", is_flag=True,
              help="No label and classification loss: the output may have any shape (a regression loss against "
                   "an input `target` stands in, as the language needs a loss).")  # fmt: skip
@REPLACE_READONLY
def import_(model: str, output: str, params: str | None, batch: int | None, no_loss: bool,
            replace_readonly: bool) -> None:  # fmt: skip
    """Import the ONNX model MODEL as a readable .ddsl network and its weights as a parameter file."""
    # common's error handling and exit codes, without its compiler options
    common(_import)(model, {}, 2, (), None, False, output=output, params=params, batch=batch, no_loss=no_loss,
                    replace_readonly=replace_readonly)  # fmt: skip


@cli.command()
@common
@click.option("-o", "--output", "output", metavar="NET.onnx", required=True, callback=_file_name,
              help="Where to write the ONNX model.")  # fmt: skip
@click.option(
    "--load",
    "load_path",
    type=click.Path(dir_okay=False),
    default=None,
    callback=_file_name,
    help="Export these parameters (a .npz of deepdsl run --save) instead of the initial ones.",
)
@click.option("--opset", type=int, default=None, help="The ONNX opset (default 17; 11 to the newest onnx knows).")
@REPLACE_READONLY
def export(c: api.Compilation, file: str, sets: dict, options: api.Options, output: str, load_path: str | None,
           opset: int | None, replace_readonly: bool) -> None:  # fmt: skip
    """Export the inference program (predict) of FILE as an ONNX model, parameters and state as initialisers."""
    from deepdsl import interop

    opset = opset or interop.DEFAULT_OPSET
    for line in interop.export_onnx(c, file, sets, load_path, output, opset, replace_readonly):
        click.echo(line)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the `deepdsl` console script."""
    cli.main(args=argv, prog_name="deepdsl")
