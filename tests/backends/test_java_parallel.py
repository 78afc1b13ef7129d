"""The Java runtime's thread team (deepdsl/runtime/Parallel.java), through tests/backends/java/ParallelCheck.java.

The check runs on a JVM told it has four processors, so that the team has three workers whatever the machine:
every piece once with its bounds, several threads taking part, a failing piece's exception at the caller and
the team usable after it, a loop inside a loop kept on its thread, and two threads running loops at once.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import JAVAC

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.java,
    pytest.mark.skipif(
        shutil.which("javac") is None or shutil.which("java") is None,
        reason="javac and java (JDK 17+) are not on PATH",
    ),
]


def test_the_team_runs_every_piece_once_and_reports_failures(tmp_path: Path) -> None:
    check = ROOT / "tests" / "backends" / "java" / "ParallelCheck.java"
    built = subprocess.run(
        [*JAVAC, "-sourcepath", str(ROOT), "-d", str(tmp_path), str(check)],
        cwd=tmp_path,  # not the repository: a failing javac writes javac.DATE.args into its cwd
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stderr
    ran = subprocess.run(
        ["java", "-XX:ActiveProcessorCount=4", "-cp", str(tmp_path), "deepdsl.runtime.ParallelCheck"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "ok"
