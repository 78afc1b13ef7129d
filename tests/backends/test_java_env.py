"""java_env.javac compiles the runtime once a run and reuses its classes: only for the same source text."""

from __future__ import annotations

from pathlib import Path

import pytest
from java_env import JAVA_MARKS, java, javac, runtime_classes

pytestmark = JAVA_MARKS

RUNTIME = """package deepdsl.runtime;

public final class Answer {
  public static int get() {
    return %d;
  }
}
"""
MAIN = """public final class Main {
  public static void main(String[] a) {
    System.out.println(deepdsl.runtime.Answer.get());
  }
}
"""


def _program(folder: Path, answer: int) -> list[Path]:
    (folder / "deepdsl" / "runtime").mkdir(parents=True)
    (folder / "deepdsl" / "runtime" / "Answer.java").write_text(RUNTIME % answer)
    (folder / "Main.java").write_text(MAIN)
    return [folder / "Main.java", folder / "deepdsl" / "runtime" / "Answer.java"]


@pytest.mark.slow  # 3 s (the default suite's four minutes)
def test_the_runtime_is_compiled_once_per_text(tmp_path: Path) -> None:
    seen = []
    for k, answer in enumerate((1, 1, 2)):  # two programs with the same runtime, then one whose runtime changed
        folder = tmp_path / f"p{k}"
        sources = _program(folder, answer)
        javac(folder, sources, folder / "build")
        assert (folder / "build" / "deepdsl" / "runtime" / "Answer.class").is_file()  # the build runs alone
        if k != 1:  # the second build is the first's classes again
            r = java(folder / "build", "Main")
            assert r.returncode == 0 and r.stdout.strip() == str(answer), r.stderr
        seen.append(runtime_classes(sources[1:]))
    assert seen[0] == seen[1] != seen[2]  # the changed runtime was compiled again, not served from the cache


def test_a_runtime_that_does_not_compile_fails_the_test(tmp_path: Path) -> None:
    sources = _program(tmp_path, 3)
    sources[1].write_text(RUNTIME.replace("%d", "nothing"))
    with pytest.raises(AssertionError, match="cannot find symbol"):
        javac(tmp_path, sources, tmp_path / "build")
