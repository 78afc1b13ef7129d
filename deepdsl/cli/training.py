"""The commands that run a network: `run` (training, on one rank or data-parallel), and `eval` and `predict` with
trained parameters; their options.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable
from typing import Any

import click

from deepdsl import api
from deepdsl.cli.options import (
    DETERMINISTIC,
    EXIT_USER,
    JSON_HELP,
    PRECISION,
    REPLACE_READONLY,
    WORKSPACE_LIMIT,
    bucketing,
    common,
    data_parallel_options,
    echo_warnings,
    file_name,
    parse_data,
)
from deepdsl.config import from_env
from deepdsl.errors import DslError, render
from deepdsl.summaries import json_text

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
    "--load", "load_path", type=click.Path(dir_okay=False), required=True, callback=file_name,
    help="The trained parameters (a .npz file of run --save or the Java program's --save).",
)  # fmt: skip


def _setting(ctx: click.Context, param: click.Parameter, value: str | None) -> float | int | None:
    """A numeric option of `run` in its range (run_settings.SETTING_RANGES, the Java program's too): a usage error
    else."""
    from deepdsl.run_settings import parse_setting

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


@click.command()
@common
@click.option("--iters", metavar="N", default=None, callback=_setting,
              help="Training steps (default: the train block's), at most 10,000,000.")  # fmt: skip
@click.option("--data", "data_flag", metavar="SOURCE", default=None, callback=parse_data,
              help="synthetic[:SEED] | mnist:DIR | cifar10:DIR | npz:FILE | text:FILE | images:DIR | csv:FILE "
              "(default: the train block's; "
              "SEED: the synthetic data's own seed, else the program's).")  # fmt: skip
@click.option("--load", "load_path", type=click.Path(dir_okay=False), default=None, callback=file_name,
              help="Start from this .npz file.")  # fmt: skip
@click.option("--save", "save_path", type=click.Path(dir_okay=False), default=None, callback=file_name,
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
@data_parallel_options
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
    from deepdsl import distributed, run_settings, running

    config = from_env()
    world = distributed.world_from_env(ranks=ranks, rank=rank)
    options = dataclasses.replace(options, workspace_limit=workspace_limit, deterministic=deterministic,
                                  precision=precision, sync_batch_norm=sync_batch_norm,
                                  buckets=bucketing(world.size, micro_batches, bucket_mb,
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
        echo_warnings(c)
    try:
        program = run_settings.with_settings(c.program, {k: v for k, v in optimizer.items() if v is not None})
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


@click.command("eval")
@common
@TRAINED
@click.option("--data", "data_flag", metavar="SOURCE", default=None, callback=parse_data,
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
    echo_warnings(c)
    report = None if as_json else lambda line: click.echo(line)
    result = running.evaluate(api.build(c.program, options), load_path, data_flag, device, report, kernels=kernels)
    if as_json:
        click.echo(json_text(result))


@click.command()
@common
@TRAINED
@click.option(
    "--data",
    "data_flag",
    metavar="SOURCE",
    default=None,
    callback=parse_data,
    help="The samples: npz:FILE (arrays named after the inputs), or synthetic, mnist:DIR, cifar10:DIR, images:DIR, "
    "csv:FILE.",
)
@click.option("-o", "output", type=click.Path(dir_okay=False), required=True, callback=file_name,
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
    echo_warnings(c)
    report = None if as_json else lambda line: click.echo(line)
    build = api.build(c.program, options)
    result = running.predict(build, load_path, output, data_flag, device, report, kernels=kernels,
                             replace_readonly=replace_readonly, split=split)  # fmt: skip
    if as_json:
        click.echo(json_text(result))
