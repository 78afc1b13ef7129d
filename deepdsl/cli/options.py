"""What the commands share: the options' parsers (a bad value is a usage error, exit 2, found before anything is
compiled), the options several commands take, `common` (the compiling commands' options and the error handling that
gives the exit codes) and the printing of a program's warnings.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable
from functools import wraps
from typing import Any

import click

from deepdsl import api
from deepdsl.config import from_env
from deepdsl.errors import DslError, did_you_mean, render
from deepdsl.passes import PASS_NAMES

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


def parse_pass(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    return _parse_passes(ctx, param, (value,))[0] if value else None


def _parse_limit(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    from deepdsl.memory.report import parse_size

    if value is None:
        return None
    try:
        return parse_size(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def parse_data(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A malformed --data source is a usage error (exit 2), found before anything is compiled or allocated."""
    from deepdsl.data import parse_data_flag

    if value is not None:
        try:
            parse_data_flag(value)
        except DslError as exc:
            raise click.BadParameter(exc.message, ctx, param) from None
    return value


def file_name(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
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


def data_parallel_options(fn: Callable[..., Any]) -> Callable[..., Any]:
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


def bucketing(ranks: int, micro_batches: int, bucket_mb: float, always: bool = False) -> Any:
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


def echo_warnings(c: api.Compilation) -> None:
    if c.program is not None:
        for w in c.program.warnings:
            click.echo(render(w, c.sources), err=True)
