"""The command line: outputs, --json, exit codes, --help."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers import NETWORKS, ROOT

LENET = str(ROOT / "networks" / "lenet.ddsl")


def test_check_prints_the_summary(cli) -> None:  # noqa: ANN001
    r = cli("check", LENET)
    assert r.exit_code == 0, r.output
    assert "network LeNet" in r.stdout
    assert "parameters  431,080 (1.64 MiB)" in r.stdout
    assert "predict     f32[64,10]" in r.stdout


def test_check_layers_table(cli) -> None:  # noqa: ANN001
    r = cli("check", LENET, "--layers")
    rows = [line.split() for line in r.stdout.splitlines() if line.startswith("  cv") or line.startswith("  fc")]
    assert rows == [
        ["cv1", "conv", "f32[64,20,24,24]", "520"],
        ["cv2", "conv", "f32[64,50,8,8]", "25,050"],
        ["fc1", "full", "f32[64,500]", "400,500"],
        ["fc2", "full", "f32[64,10]", "5,010"],
    ]


def test_check_json_is_one_object_with_the_design_fields(cli) -> None:  # noqa: ANN001
    r = cli("check", LENET, "--json", "--set", "N=8")
    obj = json.loads(r.stdout)
    assert obj["network"] == "LeNet"
    assert obj["parameters"] == 431_080 and obj["parameter_bytes"] == 4 * 431_080
    assert obj["inputs"] == {"x": [8, 1, 28, 28], "y": [8]}
    assert obj["outputs"] == {"loss": [], "predict": [8, 10]}
    assert obj["precision"] == "fp32"  # the train block's
    assert obj["layers"][0] == {"name": "cv1", "op": "conv", "output": [8, 20, 24, 24], "parameters": 520}
    assert sum(row["parameters"] for row in obj["layers"]) == 431_080


@pytest.mark.parametrize("stage", ["ast", "graph"])
def test_ir_prints_a_stage(cli, stage: str) -> None:  # noqa: ANN001
    r = cli("ir", LENET, "--stage", stage)
    assert r.exit_code == 0
    assert ("Module(" if stage == "ast" else "graph LeNet") in r.stdout


def test_usage_errors_exit_2(cli) -> None:  # noqa: ANN001
    assert cli("check").exit_code == 2
    assert cli("check", "no/such/file.ddsl").exit_code == 2
    assert cli("ir", LENET, "--stage", "nope").exit_code == 2
    assert cli("check", LENET, "--set", "N").exit_code == 2
    assert cli("check", LENET, "--set", "N=abc").exit_code == 2
    assert cli("frobnicate").exit_code == 2


def test_unknown_set_name_is_a_user_error_with_a_hint(cli) -> None:  # noqa: ANN001
    r = cli("check", LENET, "--set", "n=4")
    assert r.exit_code == 1
    assert "error: --set n: the network has no const 'n'" in r.stderr
    assert "did you mean 'N'?" in r.stderr


def test_user_error_exit_1_with_a_rendered_diagnostic(cli, tmp_path) -> None:  # noqa: ANN001
    f = tmp_path / "bad.ddsl"
    f.write_text("network Bad\ninput x : [2, 4]\nloss = mse(relux(x), x)\n")
    r = cli("check", str(f))
    assert r.exit_code == 1
    assert r.stderr.splitlines()[0] == f"{f}:3:12: error: unknown name 'relux'"
    assert "hint: did you mean 'relu'?" in r.stderr


def test_help_on_every_command(cli) -> None:  # noqa: ANN001
    for args in ([], ["check"], ["ir"]):
        r = cli(*args, "--help")
        assert r.exit_code == 0 and "Usage:" in r.stdout


def test_internal_errors_exit_3_and_ask_for_a_report(cli, monkeypatch) -> None:  # noqa: ANN001
    import deepdsl.api

    def broken(*a, **k):  # noqa: ANN002, ANN003, ANN202
        raise RuntimeError("boom")

    monkeypatch.setattr(deepdsl.api, "compile_file", broken)
    r = cli("check", LENET)
    assert r.exit_code == 3
    assert "internal error: RuntimeError: boom" in r.stderr and "Please report it" in r.stderr


def test_console_script_runs_as_a_module() -> None:
    r = subprocess.run([sys.executable, "-m", "deepdsl", "check", str(NETWORKS[0]), "--json"],
                       capture_output=True, text=True, check=False)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["parameters"] > 0


def test_unreadable_sources_are_user_errors(cli, tmp_path) -> None:  # noqa: ANN001
    binary = tmp_path / "bin.ddsl"
    binary.write_bytes(b"\xff\xfe")
    r = cli("check", str(binary))
    assert r.exit_code == 1 and "is not UTF-8 text" in r.stderr
    main = tmp_path / "main.ddsl"
    main.write_text('network A\ninclude "/dev/zero"\ninclude "bin.ddsl"\ninput x : [2, 3]\nloss = mse(x, x)\n')
    r = cli("check", str(main))
    assert r.exit_code == 1
    assert "cannot include '/dev/zero': '/dev/zero' is not a regular file" in r.stderr
    assert "cannot include 'bin.ddsl'" in r.stderr and "is not UTF-8 text (byte 0)" in r.stderr


def test_compile_ptx_writes_one_module_per_arch(cli, tmp_path) -> None:  # noqa: ANN001
    pytest.importorskip("deepdsl.backends.cuda.nvrtc")
    from deepdsl.backends.cuda.nvrtc import NoCudaCompiler, ptx

    try:
        ptx('extern "C" __global__ void k() {}', "sm_80")
    except NoCudaCompiler:
        pytest.skip("no NVRTC or nvcc here (the test extra installs NVRTC)")
    net = str(ROOT / "networks" / "mlp.ddsl")
    r = cli("compile", net, "--set", "N=2", "-o", str(tmp_path), "--ptx", "--arch", "sm_90,sm_80")
    assert r.exit_code == 0, r.output
    for arch in ("sm_90", "sm_80"):
        text = (tmp_path / f"MLP.{arch}.ptx").read_text()
        assert f".target {arch}" in text and ".version 8." in text and ".entry" in text
    assert cli("compile", net, "-o", str(tmp_path), "--ptx", "--arch", "sm90").exit_code == 2
    r = cli("compile", net, "--set", "N=2", "-o", str(tmp_path / "new"), "--ptx", "--arch", "sm_90,sm_999")
    assert r.exit_code == 2 and "does not compile for sm_999; it knows " in r.stderr and "sm_90" in r.stderr
    assert "internal error" not in r.stderr and not (tmp_path / "new").exists()


def _blas_threads(args: list[str], env: dict[str, str] | None = None) -> str:
    """What OPENBLAS_NUM_THREADS the console script's `main` left for NumPy when run with `args`."""
    code = ("import atexit, os, sys; atexit.register(lambda: print('threads', os.environ.get('OPENBLAS_NUM_THREADS')))"
            f"; sys.argv = ['deepdsl', *{args!r}]; from deepdsl.__main__ import main; main()")  # fmt: skip
    clean = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**clean, **(env or {})},
                       cwd=ROOT, timeout=120, check=False)  # fmt: skip
    return r.stdout.splitlines()[-1]


def test_commands_that_compute_nothing_in_blas_start_numpy_with_one_thread() -> None:
    net = str(ROOT / "networks" / "mlp.ddsl")
    assert _blas_threads(["check", net]) == "threads 1"  # OpenBLAS's spinning threads: a tenth of a compile's CPU
    assert _blas_threads(["run", net, "--iters", "0", "--data", "synthetic"]) == "threads None"  # the NumPy runner
    assert _blas_threads(["check", net], {"OPENBLAS_NUM_THREADS": "3"}) == "threads 3"  # the user's setting wins
    r = subprocess.run([sys.executable, "-c", "import sys, deepdsl; print('numpy' in sys.modules)"],
                       capture_output=True, text=True, cwd=ROOT, timeout=60, check=True)  # fmt: skip
    assert r.stdout.strip() == "False"  # the package loads no NumPy before __main__ has set the threads
