"""Fixtures of the security tests: the programs of security_env.PROGRAMS, compiled by one javac run."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from security_env import PROGRAMS, TINY


@pytest.fixture(scope="session")
def programs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from click.testing import CliRunner

    from deepdsl.cli import cli

    folder = tmp_path_factory.mktemp("poc")
    for cls, (file, include, data) in PROGRAMS.items():
        if include is not None:
            (folder / include).write_text("def twice(t) = relu(relu(t))\n")
        text = TINY.format(cls=cls, include=f'include "{include}"' if include else "",
                           apply="twice(fc(x))" if include else "fc(x)", data=data)  # fmt: skip
        (folder / file).write_text(text)
        r = CliRunner().invoke(cli, ["compile", str(folder / file), "-o", str(folder / "src")])
        assert r.exit_code == 0, r.output
    src = folder / "src"
    classes = [str(src / f"{cls}.java") for cls in PROGRAMS]  # the runtime classes they use come by -sourcepath
    r = subprocess.run(["javac", "-nowarn", "-d", str(folder / "build"), "-sourcepath", str(src), *classes],
                       capture_output=True, text=True, timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stderr[-4000:]
    return folder
