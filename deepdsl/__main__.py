"""The `deepdsl` console script and `python -m deepdsl`: the command line (cli/), started so that a command that
computes nothing in BLAS (check, compile, memcheck, ir, import, export, data) does not pay for NumPy's OpenBLAS
threads, which spin for a while after they start (about 0.1 s of CPU a process, a tenth of a compile). `run`,
`eval` and `predict` keep every thread; a user's OPENBLAS_NUM_THREADS always wins."""

from __future__ import annotations

import os
import sys

NUMERIC_COMMANDS = frozenset({"run", "eval", "predict"})  # the commands that run the network on the NumPy runner


def main() -> None:
    command = next((a for a in sys.argv[1:] if not a.startswith("-")), None)
    if command not in NUMERIC_COMMANDS and "numpy" not in sys.modules:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from deepdsl.cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
