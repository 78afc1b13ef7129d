"""The commands that bring files in and send them out: `data` (a data set downloaded), `import` (an ONNX model as a
network) and `export` (a network as an ONNX model).
"""

from __future__ import annotations

import sys

import click

from deepdsl import api
from deepdsl.cli.options import EXIT_USER, REPLACE_READONLY, common, file_name
from deepdsl.config import from_env
from deepdsl.errors import DslError, render


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


@click.command("data")
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
            batch: int | None, no_loss: bool, replace_readonly: bool, share: bool) -> None:  # fmt: skip
    from deepdsl import interop

    for line in interop.import_onnx(file, output, params, batch, not no_loss, replace_readonly, share):
        click.echo(line)


@click.command("import")
@click.argument("model", type=click.Path(exists=True, dir_okay=False))
@click.option("-o", "--output", "output", metavar="NET.ddsl", required=True, callback=file_name,
              help="Where to write the network.")  # fmt: skip
@click.option(
    "--params",
    "params",
    metavar="F.npz",
    default=None,
    callback=file_name,
    help="Where to write the initialisers as a parameter file (default: NET.npz beside the network).",
)
@click.option("--batch", type=click.IntRange(min=1), default=None,
              help="The batch N (default: the model's, or 1 where it is symbolic).")  # fmt: skip
@click.option("--no-loss", "no_loss", is_flag=True,
              help="No label and classification loss: the output may have any shape (a regression loss against "
                   "an input `target` stands in, as the language needs a loss).")  # fmt: skip
@click.option("--no-share", "no_share", is_flag=True,
              help="A copy of the weights for each node, also where nodes read the very same initialisers (by "
                   "default one layer, called for each: a module applied twice).")  # fmt: skip
@REPLACE_READONLY
def import_(model: str, output: str, params: str | None, batch: int | None, no_loss: bool, no_share: bool,
            replace_readonly: bool) -> None:  # fmt: skip
    """Import the ONNX model MODEL as a readable .ddsl network and its weights as a parameter file."""
    # common's error handling and exit codes, without its compiler options
    common(_import)(model, {}, 2, (), None, False, output=output, params=params, batch=batch, no_loss=no_loss,
                    replace_readonly=replace_readonly, share=not no_share)  # fmt: skip


@click.command()
@common
@click.option("-o", "--output", "output", metavar="NET.onnx", required=True, callback=file_name,
              help="Where to write the ONNX model.")  # fmt: skip
@click.option(
    "--load",
    "load_path",
    type=click.Path(dir_okay=False),
    default=None,
    callback=file_name,
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
