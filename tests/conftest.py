"""Shared fixtures: the --update-golden switch, the networks, and an in-process CLI runner."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

ROOT = Path(__file__).resolve().parent.parent
NETWORKS = sorted((ROOT / "networks").glob("*.ddsl"))
GOLDEN = ROOT / "tests" / "golden"

# every test verifies what the driver builds: the graph after every pass and rematerialisation, and every plan
os.environ["DEEPDSL_VERIFY"] = "1"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", help="rewrite the golden files from the current output")


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden"))


@pytest.fixture
def golden(update_golden: bool):  # noqa: ANN201
    """golden(path, text): compare `text` with the file, or rewrite the file under --update-golden."""

    def check(path: Path, text: str) -> None:
        if update_golden or not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            if not update_golden:
                pytest.fail(f"golden file {path.relative_to(ROOT)} was missing and has been written; review it")
        assert text == path.read_text(), f"output differs from {path.relative_to(ROOT)} (run pytest --update-golden)"

    return check


@pytest.fixture
def cli():  # noqa: ANN201
    """Run the deepdsl CLI in-process: cli(args) -> click Result (exit_code, stdout, stderr)."""
    from deepdsl.cli import cli as group

    runner = CliRunner()

    def run(*args: str):  # noqa: ANN202
        return runner.invoke(group, list(args), catch_exceptions=True)

    return run
