"""Exact rendered diagnostics (DESIGN §2.6): every tests/golden/errors/<case>.ddsl against its <case>.err.

Each case is a small complete network with one mistake (two for `multi_error`). It is checked through the
in-process CLI, `deepdsl check <file>`, with the path relative to the repository root so the rendered
`file:line:col` prefixes are stable. `pytest --update-golden` rewrites the .err files from the current output.

Cases named `warn_*` are warnings, not errors: they compile (exit 0) and print the warning on stderr.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CASES_DIR = ROOT / "tests" / "golden" / "errors"
ERROR_CASES = sorted(p for p in CASES_DIR.glob("*.ddsl") if not p.name.startswith("warn_"))
WARNING_CASES = sorted(CASES_DIR.glob("warn_*.ddsl"))

# Extra command-line arguments for the cases whose mistake is on the command line.
EXTRA_ARGS: dict[str, tuple[str, ...]] = {
    "set_unknown_const": ("--set", "Q=3"),
    "set_zero_const": ("--set", "N=0"),
}


def _check(cli, monkeypatch: pytest.MonkeyPatch, case: Path):  # noqa: ANN001, ANN202
    monkeypatch.chdir(ROOT)
    rel = case.relative_to(ROOT).as_posix()
    return cli("check", rel, *EXTRA_ARGS.get(case.stem, ()))


def test_cases_exist() -> None:
    assert len(ERROR_CASES) >= 30, "the diagnostics cases are missing from tests/golden/errors/"
    assert WARNING_CASES


@pytest.mark.parametrize("case", ERROR_CASES, ids=lambda p: p.stem)
def test_error_diagnostic(case: Path, cli, golden, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    result = _check(cli, monkeypatch, case)
    assert "Traceback" not in result.stdout + result.stderr
    assert "internal error" not in result.stderr, result.stderr
    assert result.exit_code == 1, f"exit {result.exit_code}\n{result.stderr}"
    assert result.stdout == ""
    golden(case.with_suffix(".err"), result.stderr)


@pytest.mark.parametrize("case", WARNING_CASES, ids=lambda p: p.stem)
def test_warning_diagnostic(case: Path, cli, golden, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    result = _check(cli, monkeypatch, case)
    assert "Traceback" not in result.stdout + result.stderr
    assert result.exit_code == 0, f"exit {result.exit_code}\n{result.stderr}"
    assert "warning:" in result.stderr
    assert "error:" not in result.stderr
    assert result.stdout.startswith("network T")
    golden(case.with_suffix(".err"), result.stderr)


def test_every_error_is_rendered_with_location(monkeypatch: pytest.MonkeyPatch, cli) -> None:  # noqa: ANN001
    """Each error line (but the --set ones, which have no source) names its file, and carries a caret."""
    for case in ERROR_CASES:
        if case.stem == "set_unknown_const":
            continue
        result = _check(cli, monkeypatch, case)
        rel = case.relative_to(ROOT).as_posix()
        heads = [line for line in result.stderr.splitlines() if ": error: " in line or line.startswith("error:")]
        assert heads, f"{case.stem}: no error line\n{result.stderr}"
        for head in heads:
            assert head.startswith(f"{rel}:"), f"{case.stem}: {head!r} has no location"
        assert "^" in result.stderr, f"{case.stem}: no caret"


def test_errors_in_source_order(monkeypatch: pytest.MonkeyPatch, cli) -> None:  # noqa: ANN001
    result = _check(cli, monkeypatch, CASES_DIR / "multi_error.ddsl")
    heads = [line for line in result.stderr.splitlines() if ": error: " in line]
    assert len(heads) == 2
    positions = [tuple(int(n) for n in h.split(":")[1:3]) for h in heads]
    assert positions == sorted(positions)


def test_a_warning_is_not_an_error() -> None:
    """Warnings are collected on the program, never raised, and no `except DslError` can catch one."""
    from deepdsl import api
    from deepdsl.errors import Diagnostic, Diagnostics, DslError, DslShapeError, DslWarning

    assert not issubclass(DslWarning, DslError) and not issubclass(DslWarning, BaseException)
    assert issubclass(DslWarning, Diagnostic) and issubclass(DslError, Diagnostic)
    case = CASES_DIR / "warn_unused_param.ddsl"
    warnings = api.compile_file(case).program.warnings
    assert warnings and all(type(w) is DslWarning for w in warnings)
    diags = Diagnostics()
    diags.add(warnings[0])
    diags.raise_if_errors()  # a warning alone stops nothing
    diags.add(DslShapeError("bad", warnings[0].span))
    with pytest.raises(DslShapeError):
        diags.raise_if_errors()
    assert diags.warnings == [warnings[0]]
