"""The command line: parses options, calls the driver (`api`), hands its Build to the trainer and the backends,
renders. No compiler logic here. This module is the click group and the console script's entry point; the commands
are in `compiler.py` (check, ir, memcheck, compile), `training.py` (run, eval, predict) and `interchange.py` (data,
import, export), what they share in `options.py`.

Exit codes: 0 ok, 1 an error in the user's input, 2 a usage error, 3 an internal error.
"""

from __future__ import annotations

import click

from deepdsl import __version__
from deepdsl.cli.compiler import check, compile_, ir, memcheck
from deepdsl.cli.interchange import data_, export, import_
from deepdsl.cli.training import eval_, predict, run


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="deepdsl")
def cli() -> None:
    """deepdsl: compile deep networks written in .ddsl to checked, optimised programs."""


for command in (check, ir, memcheck, run, eval_, predict, compile_, data_, import_, export):
    cli.add_command(command)  # `deepdsl --help` lists them by name


def main(argv: list[str] | None = None) -> None:
    """Entry point of the `deepdsl` console script."""
    cli.main(args=argv, prog_name="deepdsl")
