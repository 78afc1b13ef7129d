"""Settings and outputs of `deepdsl` and of the Java program it compiles (issue 36, items 9 and 10 and the new
user's list): out-of-range or non-finite settings are refused the same way by both (one list of bad values, run
through `deepdsl run` and, in one JVM, through the Java program); a NaN or infinity is never saved; every --json
is strict JSON; `cosine(total=0)` is an error; a batch larger than the data warns once; no CUDA line when the CPU
was asked for; help texts cite only documents in the repository; `run --iters 0 --save` reads no data; errors
are said once."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from helpers import JAVAC
from security_env import ROOT

from deepdsl.run_settings import SETTING_RANGES, parse_setting

NET = """network Lim
const N = 4
input x : [N, 4]
label y : [N] classes 2
layer f = full(2)
loss = softmax_cross_entropy(f(x), y)
predict = f(x)
train {{
  data = npz("absent.npz")
  optimizer = sgd(lr=0.01, momentum=0.9)
  iterations = 2{extra}
}}
"""

# (flag, value): each refused by `deepdsl run` and by the Java program, with the same message
BAD = [
    ("--iters", "2147483647"), ("--iters", "10000001"), ("--iters", "-1"), ("--iters", "1e3"), ("--iters", "x"),
    ("--threads", "2147483647"), ("--threads", "100000"), ("--threads", "0"), ("--threads", "-3"),
    ("--lr", "1e39"), ("--lr", "-1"), ("--lr", "nan"), ("--lr", "inf"), ("--lr", "-inf"), ("--lr", "0x1p3"),
    ("--lr", "1f"), ("--lr", ""), ("--momentum", "1"), ("--momentum", "1e39"), ("--momentum", "-0.1"),
    ("--weight-decay", "1e39"), ("--weight-decay", "-0.5"), ("--weight-decay", "NaN"), ("--beta1", "1"),
    ("--beta2", "2"), ("--eps", "1e39"), ("--eps", "-1e-8"), ("--clip", "-1"), ("--clip", "Infinity"),
    ("--alpha", "1"), ("--alpha", "-0.5"),  # [optim] RMSprop's
]  # fmt: skip


def takes(flag: str, value: str) -> str:
    """What both say of a bad value: `--lr takes a number in [0, 3.4e+38], not '1e39'` (run_settings.SETTING_RANGES)."""
    with pytest.raises(ValueError) as err:
        parse_setting(flag, value)
    return str(err.value)


def test_the_table_holds_every_flag_and_the_messages_name_the_range() -> None:
    assert takes("--lr", "1e39") == "--lr takes a number in [0, 3.4e+38], not '1e39'"
    assert takes("--momentum", "1") == "--momentum takes a number in [0, 1), not '1'"
    assert takes("--iters", "2147483647") == "--iters takes a whole number in [0, 10000000], not '2147483647'"
    assert takes("--threads", "100000") == "--threads takes a whole number in [1, 1024], not '100000'"
    assert {f for f, _ in BAD} == set(SETTING_RANGES)
    assert parse_setting("--lr", "3.4e38") == 3.4e38 and parse_setting("--momentum", "0.99") == 0.99
    assert parse_setting("--iters", "10000000") == 10_000_000 and parse_setting("--threads", "1024") == 1024


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("inputs")
    (folder / "lim.ddsl").write_text(NET.format(extra=""))
    rng = np.random.default_rng(0)
    np.savez(folder / "two.npz", x=rng.uniform(-1, 1, (2, 4)).astype(np.float32), y=np.array([0, 1]),
             x_test=rng.uniform(-1, 1, (3, 4)).astype(np.float32), y_test=np.array([0, 1, 0]))  # fmt: skip
    return folder


@pytest.mark.parametrize(("flag", "value"), [b for b in BAD if b[0] != "--threads"])
def test_run_refuses_each_bad_setting(cli, folder: Path, flag: str, value: str) -> None:  # noqa: ANN001
    r = cli("run", str(folder / "lim.ddsl"), flag, value)
    assert r.exit_code == 2, (flag, value, r.output)
    message = takes(flag, value).removeprefix(f"{flag} ")
    assert f"Invalid value for '{flag}': {message}" in r.stderr, r.stderr
    assert "Traceback" not in r.output


def test_a_setting_the_optimizer_has_not_is_a_usage_error(cli, folder: Path) -> None:  # noqa: ANN001
    r = cli("run", str(folder / "lim.ddsl"), "--beta1", "0.5", "--data", "synthetic")
    assert r.exit_code == 2 and "has no setting 'beta1' (it has lr, momentum, weight_decay)" in r.stderr, r.output


def test_the_language_refuses_what_the_flags_refuse(cli, tmp_path: Path) -> None:  # noqa: ANN001
    """The optimizer's arguments and the train block: the same ranges (a float32 must stay finite)."""
    sgd = "optimizer = sgd(lr=0.01, momentum=0.9)"
    cases = [
        (sgd, "optimizer = sgd(lr=1e39)", "must be at most 3.40282e+38"),
        (sgd, "optimizer = sgd(weight_decay=1e39)", "must be at most 3.40282e+38"),
        (sgd, "optimizer = adam(eps=1e39)", "must be at most 3.40282e+38"),
        (sgd, "optimizer = sgd(momentum=1)", "must be less than 1"),
        (sgd, "optimizer = sgd()\n  lr = cosine(1e39)", "must be at most 3.40282e+38"),
        (sgd, "optimizer = sgd()\n  lr = 1e39", "'lr' must be a number in [0, 3.4e+38]"),
        ("iterations = 2", "iterations = 10000001", "'iterations' must be at most 10,000,000"),
    ]
    for old, new, says in cases:
        (tmp_path / "n.ddsl").write_text(NET.format(extra="").replace(old, new))
        r = cli("check", str(tmp_path / "n.ddsl"))
        assert r.exit_code == 1 and says in r.stderr, (new, r.output)


def test_cosine_total_zero_is_an_error_and_left_out_is_the_iterations(cli, tmp_path: Path) -> None:  # noqa: ANN001
    base = NET.format(extra="").replace("sgd(lr=0.01, momentum=0.9)", "sgd(momentum=0.9)")
    (tmp_path / "z.ddsl").write_text(base.replace("iterations = 2", "iterations = 2\n  lr = cosine(0.1, total=0)"))
    r = cli("check", str(tmp_path / "z.ddsl"))
    assert r.exit_code == 1 and "argument 'total' of cosine must be at least 1, got 0" in r.stderr, r.output
    (tmp_path / "d.ddsl").write_text(base.replace("iterations = 2", "iterations = 4\n  lr = cosine(0.1)"))
    r = cli("run", str(tmp_path / "d.ddsl"), "--data", "synthetic", "--device", "cpu", "--json")
    assert r.exit_code == 0, r.output
    rates = json.loads(r.stdout)["learning_rates"]  # over the block's 4 iterations: cos(pi k / 4)
    assert np.allclose(rates, [0.1 * (1 + math.cos(math.pi * k / 4)) / 2 for k in range(4)], rtol=1e-6)
    # --lr under a schedule sets its base rate (as the Java program's --lr does)
    r = cli("run", str(tmp_path / "d.ddsl"), "--data", "synthetic", "--device", "cpu", "--json", "--lr", "0.2")
    assert r.exit_code == 0, r.output
    assert np.allclose(json.loads(r.stdout)["learning_rates"], [2 * x for x in rates], rtol=1e-6)


def test_a_batch_larger_than_the_data_warns_once(cli, folder: Path) -> None:  # noqa: ANN001
    r = cli("run", str(folder / "lim.ddsl"), "--data", f"npz:{folder / 'two.npz'}", "--device", "cpu", "--iters",
            "1", "--json")  # fmt: skip
    assert r.exit_code == 0, r.output
    lines = r.stderr.splitlines()
    assert lines.count("warning: the batch of 4 is larger than the 2 training samples of the npz data: each batch "
                       "repeats samples") == 1, r.stderr  # fmt: skip
    assert lines.count("warning: the batch of 4 is larger than the 3 test samples of the npz data: each batch "
                       "repeats samples") == 1, r.stderr  # fmt: skip
    json.loads(r.stdout)  # the warnings are not on stdout


def test_iters_0_save_reads_no_data(cli, folder: Path) -> None:  # noqa: ANN001
    """The train block names a file that is not there: --iters 0 --save writes the initial state all the same."""
    out = folder / "init.npz"
    r = cli("run", str(folder / "lim.ddsl"), "--iters", "0", "--save", str(out), "--device", "cpu")
    assert r.exit_code == 0, r.output
    assert "data none (no iterations)" in r.stdout
    with np.load(out) as z:
        assert "f.W" in z.files or any(n.startswith("f.") for n in z.files)


def nan_params(folder: Path) -> Path:
    """The initial state of lim.ddsl with a NaN in its first float parameter."""
    init = folder / "init.npz"
    if not init.exists():  # (test_iters_0_save_reads_no_data writes it, unless this test runs alone)
        from click.testing import CliRunner

        from deepdsl.cli import cli

        r = CliRunner().invoke(cli, ["run", str(folder / "lim.ddsl"), "--iters", "0", "--save", str(init)])
        assert r.exit_code == 0, r.output
    with np.load(init) as z:
        arrays = {k: z[k].copy() for k in z.files}
    first = next(k for k, a in arrays.items() if a.dtype.kind == "f" and "/" not in k)
    arrays[first].flat[0] = np.nan
    path = folder / "nan.npz"
    np.savez(path, **arrays)
    return path


def test_a_nan_is_never_saved(cli, folder: Path) -> None:  # noqa: ANN001
    bad = nan_params(folder)
    out = folder / "out.npz"
    r = cli("run", str(folder / "lim.ddsl"), "--load", str(bad), "--iters", "0", "--save", str(out), "--device",
            "cpu")  # fmt: skip
    assert r.exit_code == 1 and "holds a NaN or an infinity" in r.stderr, r.output
    assert not out.exists()


def strict(text: str) -> dict:
    def refuse(name: str) -> None:
        raise ValueError(f"not JSON: {name}")

    obj = json.loads(text, parse_constant=refuse)
    assert isinstance(obj, dict)
    return obj


def test_every_json_is_strict_json(cli, folder: Path, tmp_path: Path) -> None:  # noqa: ANN001
    net = str(folder / "lim.ddsl")
    syn = ("--data", "synthetic", "--device", "cpu")
    nan = nan_params(folder)
    init = str(folder / "init.npz")
    for args in (("check", net), ("memcheck", net), ("ir", net, "--stats"), ("run", net, "--iters", "2", *syn),
                 ("eval", net, "--load", init, *syn), ("predict", net, "--load", init, "-o", str(tmp_path / "p.npz"),
                 *syn)):  # fmt: skip
        r = cli(*args, "--json")
        assert r.exit_code == 0, (args, r.output)
        assert "nonfinite" not in strict(r.stdout)
    # NaN parameters: the test loss is NaN, written null and named
    r = cli("eval", net, "--load", str(nan), *syn, "--json")
    assert r.exit_code == 0, r.output
    obj = strict(r.stdout)
    assert obj["test_loss"] is None and obj["nonfinite"] == ["test_loss"], obj


def test_no_cuda_line_when_the_cpu_was_asked_for(cli, folder: Path) -> None:  # noqa: ANN001
    net = str(folder / "lim.ddsl")
    nan_params(folder)  # (and init.npz)
    for args in (("run", net, "--iters", "1", "--device", "cpu"), ("run", net, "--iters", "1", "--float64"),
                 ("eval", net, "--load", str(folder / "init.npz"), "--device", "cpu")):  # fmt: skip
        r = cli(*args, "--data", "synthetic")
        assert r.exit_code == 0 and "CUDA" not in r.output, (args, r.output)


def test_help_texts_cite_only_documents_that_exist(cli) -> None:  # noqa: ANN001
    from deepdsl.cli import cli as group

    texts = [cli("--help").output] + [cli(name, "--help").output for name in group.commands]
    cited = set()
    for text in texts:
        flat = " ".join(text.split())  # click wraps lines
        assert "DESIGN" not in flat and "§" not in flat, flat
        cited |= set(re.findall(r"[\w./-]+\.md\b", flat))
    assert "docs/formats.md" in cited
    for path in cited:
        assert (ROOT / path).is_file(), path


def test_each_error_is_said_once(cli, folder: Path, tmp_path: Path) -> None:  # noqa: ANN001
    net = str(folder / "lim.ddsl")
    (tmp_path / "twice.ddsl").write_text(NET.format(extra="\n  seed = 1\n  seed = 2"))
    cases = [
        ("run", net, "--load", str(tmp_path / "none.npz"), "--data", "synthetic"),
        ("run", net, "--iters", "1"),  # the train block's data file is not there
        ("run", net, "--save", str(tmp_path / "no" / "x.npz"), "--data", "synthetic"),
        ("run", net, "--lr", "1e39"),
        ("eval", net, "--load", str(tmp_path / "none.npz")),
        ("check", str(tmp_path / "twice.ddsl")),
        ("data", "mnist", str(tmp_path / "m"), "--url", "http://127.0.0.1:9/"),
        ("data", "mnist", str(tmp_path / "m"), "--url", ""),
    ]
    for args in cases:
        r = cli(*args)
        assert r.exit_code in (1, 2), (args, r.output)
        said = [line for line in r.stderr.splitlines() if re.search(r"(error|warning|hint|note|Error):", line)]
        assert said and len(said) == len(set(said)), (args, r.stderr)  # (a caret line may well repeat)
        assert "Traceback" not in r.output


# ---- the Java program: every call in one JVM (a harness calls Network.run once per argument line) ----

HARNESS = """import deepdsl.runtime.Network;
import java.io.ByteArrayOutputStream;
import java.io.PrintStream;
import java.lang.reflect.Field;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.function.Supplier;

public class Harness {
  public static void main(String[] a) throws Exception {
    Class<?> c = Class.forName(a[0]);
    Field f = c.getDeclaredField("SETTINGS");
    f.setAccessible(true);
    Network.Settings settings = (Network.Settings) f.get(null);
    Supplier<Network> make = () -> {
      try {
        return (Network) c.getConstructor().newInstance();
      } catch (ReflectiveOperationException e) {
        throw new IllegalStateException(e);
      }
    };
    List<String> lines = Files.readAllLines(Path.of(a[1]), StandardCharsets.UTF_8);
    PrintStream out0 = System.out, err0 = System.err;
    for (int k = 0; k < lines.size(); k++) {
      String[] args = lines.get(k).split("\\t", -1);
      ByteArrayOutputStream out = new ByteArrayOutputStream(), err = new ByteArrayOutputStream();
      System.setOut(new PrintStream(out, true, StandardCharsets.UTF_8));
      System.setErr(new PrintStream(err, true, StandardCharsets.UTF_8));
      int rc;
      try {
        rc = Network.run(args, settings, make);
      } catch (Throwable t) {
        t.printStackTrace();
        rc = 99;
      } finally {
        System.setOut(out0);
        System.setErr(err0);
      }
      Files.writeString(Path.of(a[2], k + ".rc"), Integer.toString(rc));
      Files.write(Path.of(a[2], k + ".out"), out.toByteArray());
      Files.write(Path.of(a[2], k + ".err"), err.toByteArray());
    }
  }
}
"""


@pytest.mark.slow  # a Java build and a dozen JVM starts (11 s)
@pytest.mark.java
@pytest.mark.skipif(shutil.which("javac") is None or shutil.which("java") is None, reason="no JDK on PATH")
def test_the_java_program_refuses_and_reports_as_deepdsl_does(cli, folder: Path) -> None:  # noqa: ANN001
    r = cli("compile", str(folder / "lim.ddsl"), "-o", str(folder / "src"))
    assert r.exit_code == 0, r.output
    (folder / "src" / "Harness.java").write_text(HARNESS)
    build = folder / "build"
    done = subprocess.run([*JAVAC, "-encoding", "UTF-8", "-nowarn", "-d", str(build), "-sourcepath",
                           str(folder / "src"), str(folder / "src" / "Lim.java"), str(folder / "src" / "Harness.java")],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    nan = nan_params(folder)
    syn = ["--data", "synthetic", "--device", "cpu"]
    calls: list[list[str]] = [[flag, value, *syn] for flag, value in BAD]
    named = {
        "no setting": ["--beta1", "0.5", *syn],
        "iters 0": ["--iters", "0", "--save", str(folder / "java_init.npz"), "--device", "cpu"],
        "nan save": ["--load", str(nan), "--iters", "0", "--save", str(folder / "java_out.npz"), "--device", "cpu"],
        "nan eval": ["--eval", "--load", str(nan), *syn, "--json"],
        "json": ["--iters", "2", "--lr", "0.5", *syn, "--json"],
        "small data": ["--iters", "1", "--data", f"npz:{folder / 'two.npz'}", "--device", "cpu", "--json"],
        "threads": ["--iters", "1", "--threads", "2", *syn],
    }
    order = list(named)
    calls += [named[k] for k in order]
    (folder / "calls.txt").write_text("\n".join("\t".join(c) for c in calls) + "\n")
    results = folder / "results"
    results.mkdir()
    done = subprocess.run(["java", "-cp", str(build), "Harness", "Lim", str(folder / "calls.txt"), str(results)],
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]

    def got(k: int) -> tuple[int, str, str]:
        return (int((results / f"{k}.rc").read_text()), (results / f"{k}.out").read_text(),
                (results / f"{k}.err").read_text())  # fmt: skip

    for k, (flag, value) in enumerate(BAD):
        rc, out, err = got(k)
        assert rc == 2, (flag, value, rc, err)
        assert f"error: {takes(flag, value)}" in err.splitlines(), (flag, value, err)
    first = len(BAD)
    result = {name: got(first + i) for i, name in enumerate(order)}
    rc, _, err = result["no setting"]
    assert rc == 2 and "has no setting 'beta1' (it has lr, momentum, weight_decay)" in err, err
    rc, out, err = result["iters 0"]
    assert rc == 0 and "data none (no iterations)" in out and (folder / "java_init.npz").exists(), (out, err)
    rc, out, err = result["nan save"]
    assert rc == 1 and "holds a NaN or an infinity" in err and not (folder / "java_out.npz").exists(), (out, err)
    rc, out, err = result["nan eval"]
    assert rc == 0, err
    obj = strict(out)
    assert obj["test_loss"] is None and obj["nonfinite"] == ["test_loss"], obj
    rc, out, err = result["json"]
    assert rc == 0, err
    java_losses = strict(out)["losses"]
    r = cli("run", str(folder / "lim.ddsl"), "--iters", "2", "--lr", "0.5", *syn, "--json")
    assert r.exit_code == 0, r.output
    assert np.allclose(java_losses, json.loads(r.stdout)["losses"], rtol=1e-4), (java_losses, r.stdout)
    rc, out, err = result["small data"]
    assert rc == 0, err
    strict(out)
    assert err.count("warning: the batch of 4 is larger than the 2 training samples of the npz data") == 1, err
    rc, out, err = result["threads"]
    assert rc == 0 and "CUDA" not in out + err, (out, err)
    # the threads property the flag sets, given by hand past the flag's bound: Parallel bounds it (a team of 2^31
    # threads would exit 3 after minutes)
    done = subprocess.run(["java", "-Ddeepdsl.threads=2147483647", "-cp", str(build), "Lim", "--iters", "1", *syn],
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
