"""Shared fixtures: the --update-golden switch, the networks, the session's compile cache, the run's folder of
native builds made once, an in-process CLI runner, a check that no test leaves javac or JVM droppings in the
repository, and the removal of the shared memory that MPI ranks the tests kill leave behind."""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import ROOT, SHM, remove_orphans

# every test verifies what the driver builds: the graph after every pass and rematerialisation, and every plan
os.environ["DEEPDSL_VERIFY"] = "1"

# NumPy's BLAS on one thread in the test processes (not in the processes they launch: the variable is left alone).
# xdist runs a worker per core, and the tests' products are small: a second BLAS thread per worker only waits for a
# core, spinning, while the other worker holds it (LeNet's five steps on the NumPy runner took 2-4 s of CPU with two
# BLAS threads on a busy two-core machine, 0.3 s with one). $OPENBLAS_NUM_THREADS, where set, wins.
if "OPENBLAS_NUM_THREADS" not in os.environ:
    import numpy  # noqa: F401  (threadpoolctl limits the BLAS libraries loaded so far)

    try:
        from threadpoolctl import threadpool_limits  # scikit-learn's dependency (the test extra)
    except ImportError:  # only slower without it
        pass
    else:
        BLAS_LIMIT = threadpool_limits(limits=1, user_api="blas")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", help="rewrite the golden files from the current output")


# the run's folder of native builds made once (tests/backends/built_once.py), removed by the process that named it
BUILDS = pytest.StashKey[str]()
BUILDS_PREFIX = "deepdsl-test-builds-"


def pytest_configure(config: pytest.Config) -> None:
    """A fresh folder for the run's builds, named here in the process pytest started, before xdist starts its
    workers, which inherit the variable (as do the processes the tests launch), so that they all share it; the first
    build makes it (a run that builds nothing leaves nothing). A run that was killed never removes its folder: the
    folders a day old, whoever left them, are removed first (no run lasts a day)."""
    if not os.environ.get("DEEPDSL_TEST_BUILDS"):
        temp = Path(tempfile.gettempdir())
        for old in temp.glob(f"{BUILDS_PREFIX}*"):
            try:
                if time.time() - old.stat().st_mtime > 86400:
                    shutil.rmtree(old, ignore_errors=True)
            except OSError:
                continue
        folder = str(temp / f"{BUILDS_PREFIX}{os.getpid()}-{secrets.token_hex(8)}")
        os.environ["DEEPDSL_TEST_BUILDS"] = config.stash[BUILDS] = folder


def pytest_unconfigure(config: pytest.Config) -> None:
    folder = config.stash.get(BUILDS, None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
        del os.environ["DEEPDSL_TEST_BUILDS"]


# what a failing javac (javac.DATE.args) or a crashing JVM (hs_err_pid*.log) leaves in its working directory
STRAY = ("javac.*.args", "hs_err_pid*.log", "replay_pid*.log")


def stray_files() -> set[Path]:
    return {p for pattern in STRAY for p in ROOT.glob(pattern)}


@pytest.fixture(scope="session", autouse=True)
def no_stray_files_in_the_repository():  # noqa: ANN201
    """Every javac and java a test runs works in a temporary folder; this fails the session where one did not."""
    before = stray_files()
    yield
    new = sorted(p.name for p in stray_files() - before)
    assert not new, f"a test ran javac or java in the repository, which left {new} there: give it cwd=tmp_path"


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


@pytest.fixture(scope="session")
def compiled():  # noqa: ANN201
    """compiled(net, sets, stop_at, options): the session's one compilation of a network (see helpers.CompileCache)."""
    from helpers import CompileCache

    return CompileCache()


@pytest.fixture
def cli():  # noqa: ANN201
    """Run the deepdsl CLI in-process: cli(args) -> click Result (exit_code, stdout, stderr)."""
    from deepdsl.cli import cli as group

    runner = CliRunner()

    def run(*args: str):  # noqa: ANN202
        return runner.invoke(group, list(args), catch_exceptions=True)

    return run


# the shared-memory segments of MPICH's ranks, and of Open MPI's (its sm transport: sm_segment.HOST.UID.JOB.RANK)
SEGMENTS = ("mpich_shm_*", "sm_segment.*")


def _segments() -> set[Path]:
    return {path for pattern in SEGMENTS for path in SHM.glob(pattern)}


@pytest.fixture(scope="session", autouse=True)
def no_shared_memory_left_by_killed_ranks():  # noqa: ANN201
    """MPI's ranks unlink their shared-memory segments (/dev/shm/mpich_shm_*, Open MPI's sm_segment.*) at
    MPI_Finalize; those the tests kill never do (MPICH's are 1-4 MB each: over a day of test runs, 3 GB of a
    machine's memory; Open MPI's about 100 kB). At the end of the session those that appeared during it and no
    process maps any longer are removed; a segment written in its last seconds is too young then, so each session
    first removes the unmapped ones ten minutes old, whoever left them: a segment nobody maps is of no use to
    anyone."""
    remove_orphans(_segments(), min_age=600)
    before = _segments()
    yield
    remove_orphans(_segments() - before)
