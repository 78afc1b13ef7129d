"""Token inputs and the image ops in the generated Java program: the text source read as `data/text.py` reads it,
synthetic token ids, the embedding's kernels, the per-position loss, conv_transpose, upsample and divided indices
give the NumPy runner's losses."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from java_env import JAVA_MARKS, java_json, javac
from sequence_nets import BIGRAM, CLASSIFIER, DIVIDED, IMAGES, story

pytestmark = [*JAVA_MARKS, pytest.mark.slow]  # one javac run of four programs (about 20 s)


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from click.testing import CliRunner

    from deepdsl.cli import cli

    folder = tmp_path_factory.mktemp("tokens")
    (folder / "story.txt").write_text(story(), encoding="utf-8")
    for name, text in (("bigram", BIGRAM), ("classifier", CLASSIFIER), ("images", IMAGES), ("divided", DIVIDED)):
        (folder / f"{name}.ddsl").write_text(text)
        r = CliRunner().invoke(cli, ["compile", str(folder / f"{name}.ddsl"), "-o", str(folder / "src")])
        assert r.exit_code == 0, r.output
    src = folder / "src"
    javac(src, [*src.glob("*.java"), *(src / "deepdsl" / "runtime").glob("*.java")], folder / "build")
    return folder


@pytest.mark.parametrize(
    "name, cls, data",
    [
        ("bigram", "Bigram", None),
        ("classifier", "TokenClassifier", "synthetic"),
        ("images", "Images", "synthetic"),
        ("divided", "Divided", "synthetic"),
    ],
)
def test_losses_equal_the_numpy_runner(cli, programs: Path, name: str, cls: str, data: str | None) -> None:
    flags = ["--data", data] if data else []
    r = cli("run", str(programs / f"{name}.ddsl"), "--iters", "12", *flags, "--json")
    assert r.exit_code == 0, r.output
    want = json.loads(r.stdout)
    got = java_json(programs / "build", cls, "--iters", "12", "--device", "cpu", *flags, cwd=programs)
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-4)
    assert got["test_loss"] == pytest.approx(want["test_loss"], rel=1e-4)
    if name == "bigram":  # the loss falls on the text
        assert want["losses"][-1] < want["losses"][0] - 0.1


def test_java_text_errors_are_worded_as_in_python(cli, programs: Path, tmp_path: Path) -> None:
    (tmp_path / "wide.txt").write_text("".join(chr(ord("A") + k) for k in range(30)) * 3)
    r = cli("run", str(programs / "bigram.ddsl"), "--data", f"text:{tmp_path / 'wide.txt'}", "--iters", "1")
    assert r.exit_code == 1
    from java_env import java

    j = java(programs / "build", "Bigram", "--data", f"text:{tmp_path / 'wide.txt'}", "--iters", "1", cwd=programs)
    assert j.returncode != 0
    message = "has 30 distinct characters, more than the 24 of the network's input tok : [N, 16] int vocab 24"
    assert message in r.output and message in j.stderr
