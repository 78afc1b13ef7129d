"""The documentation a fresh clone carries: every relative link of README.md and docs/*.md points at a file of
the repository (and its #anchor at a heading of that file), and every `ddsl` example of the docs compiles."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import ROOT

from deepdsl import api
from deepdsl.errors import DslError, render

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|^\[[^\]]+\]:\s*(\S+)", re.M)  # [text](target), [ref]: target
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
CODE = re.compile(r"`[^`\n]*`")


def prose(text: str) -> str:
    """The text without code blocks and code spans, where brackets are not links."""
    return CODE.sub("", FENCE.sub("", text))


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, emphasis marks and punctuation dropped, spaces to hyphens; a code
    span keeps its text as written (`hard_swish` keeps its underscore)."""
    parts = re.split(r"(`[^`]*`)", heading.strip().lower())
    text = "".join(p.strip("`") if p.startswith("`") else re.sub(r"\*\*?|_(?=\w)|(?<=\w)_", "", p) for p in parts)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    for line in FENCE.sub("", path.read_text(encoding="utf-8")).splitlines():
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base, k = anchor(m[1]), 1
            name = base
            while name in found:  # GitHub numbers repeated headings: name, name-1, name-2, ...
                name, k = f"{base}-{k}", k + 1
            found.add(name)
    return found


def broken_links(doc: Path) -> list[str]:
    """Each relative link of `doc` whose file (inside the repository) or heading does not exist."""
    problems = []
    for m in LINK.finditer(prose(doc.read_text(encoding="utf-8"))):
        target = m[1] or m[2]
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...: not a file of the clone
            continue
        file, _, fragment = target.partition("#")
        path = (doc.parent / file).resolve() if file else doc
        if ROOT not in path.parents and path != ROOT:
            problems.append(f"{target}: outside the repository")
        elif not path.exists():
            problems.append(f"{target}: no such file")
        elif fragment and path.suffix == ".md" and fragment not in anchors(path):
            problems.append(f"{target}: no heading #{fragment} in {path.relative_to(ROOT)}")
    return problems


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(doc: Path) -> None:
    assert not broken_links(doc), f"{doc.relative_to(ROOT)}: " + "; ".join(broken_links(doc))


def test_the_link_check_catches_broken_links(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above can fail: a missing file, a missing heading and a path out of the clone are caught,
    good links, external links and brackets in code are not."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (tmp_path / "README.md").write_text("# Top\n## The `ir` command\n## The `hard_swish` op\n")
    doc = docs / "x.md"
    doc.write_text(
        "# A heading\n[ok](../README.md) [ok](#a-heading) [ok](../README.md#the-ir-command) [ok](https://x.org)\n"
        "[ok](../README.md#the-hard_swish-op) [bad](../README.md#the-hardswish-op)\n"
        "`[not](a-link.md)`\n```\n[not](a-link.md)\n```\n"
        "[bad](missing.md) [bad](#no-such) [bad](../README.md#nope) [bad](../../shared/DESIGN.md)\n"
    )
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    assert broken_links(doc) == [
        "../README.md#the-hardswish-op: no heading #the-hardswish-op in README.md",
        "missing.md: no such file",
        "#no-such: no heading #no-such in docs/x.md",
        "../README.md#nope: no heading #nope in README.md",
        "../../shared/DESIGN.md: outside the repository",
    ]


EXAMPLES = [
    (doc, n, block)
    for doc in DOCS
    for n, block in enumerate(re.findall(r"^```ddsl\n(.*?)^```", doc.read_text(encoding="utf-8"), re.M | re.S))
]


def test_the_docs_have_examples() -> None:
    assert len([e for e in EXAMPLES if e[0].name == "language.md"]) >= 4


@pytest.mark.parametrize("doc, n, block", EXAMPLES, ids=[f"{d.stem}-{n}" for d, n, _ in EXAMPLES])
def test_every_example_compiles(doc: Path, n: int, block: str) -> None:
    c = api.Compilation()
    try:
        api.compile_source(block, f"{doc.stem}-example{n}.ddsl", {"N": 2} if "const N" in block else None, c=c)
    except DslError as err:
        pytest.fail(f"example {n} of {doc.relative_to(ROOT)} does not compile:\n{render(err, c.sources)}")


def unnamed_modules(text: str, root: Path) -> list[str]:
    """The modules of `root/deepdsl` (every .py, and every .java of deepdsl/runtime) that `text` does not name.
    A Python module is named by its path, or by any shorter tail of its path that no other module shares
    (`cuda/kernels.py`, `parser.py`; `kernels.py` alone names neither of two); a Java class by its name."""
    package = root / "deepdsl"
    modules = sorted(p.relative_to(package).as_posix() for p in package.rglob("*.py"))
    tails = [m.split("/") for m in modules]
    owners: dict[str, int] = {}
    for parts in tails:
        for k in range(len(parts)):
            tail = "/".join(parts[k:])
            owners[tail] = owners.get(tail, 0) + 1

    def named(parts: list[str]) -> bool:
        return any(
            (k == 0 or owners["/".join(parts[k:])] == 1)
            and re.search(r"(?:(?<![\w/.])|(?<=deepdsl/))" + re.escape("/".join(parts[k:])) + r"(?![\w/])", text)
            for k in range(len(parts))
        )

    missing = [m for m, parts in zip(modules, tails) if not named(parts)]
    classes = sorted(p.stem for p in (package / "runtime").glob("*.java"))
    return missing + [f"runtime/{c}.java" for c in classes if not re.search(rf"\b{c}\b", text)]


def test_the_architecture_names_every_module() -> None:
    """docs/architecture.md names every Python module of the package and every class of the Java runtime."""
    missing = unnamed_modules((ROOT / "docs" / "architecture.md").read_text(encoding="utf-8"), ROOT)
    assert not missing, "docs/architecture.md does not name: " + ", ".join(missing)


def test_the_module_check_can_fail(tmp_path: Path) -> None:
    """A module named nowhere, one named only by a file name two modules share, and a runtime class are caught;
    a module named by its path, with or without `deepdsl/`, or by a tail of its own is not."""
    for path in ("deepdsl/a/kernels.py", "deepdsl/b/kernels.py", "deepdsl/a/only.py", "deepdsl/runtime/Gemm.java"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("")
    missing = ["a/kernels.py", "b/kernels.py", "runtime/Gemm.java"]
    assert unnamed_modules("`kernels.py` and `only.py`", tmp_path) == missing
    assert unnamed_modules("`a/kernels.py`, `deepdsl/b/kernels.py`, `only.py`; `Gemm`", tmp_path) == []


def readme_commands() -> list[str]:
    """The README's two commands: the `sh` blocks of its section "Two commands" (set up and train; the tests)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Two commands") :]
    section = section[: section.index("\n## ", 1)]
    return re.findall(r"^```sh\n(.*?)^```", section, re.M | re.S)


def test_the_readme_is_an_entry_point() -> None:
    """At most 250 lines, its two commands first: the first installs deepdsl without the test extras and builds with
    Maven (OpenBLAS) where mvn is present, else javac; the second installs the test extras itself."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines"
    setup, tests = readme_commands()
    assert "pip install -e . " in setup and "[test]" not in setup
    assert "command -v mvn" in setup and "--maven" in setup and "javac" in setup
    assert 'pip install -e ".[test]"' in tests and tests.rstrip().endswith("pytest")


def test_ci_runs_the_readme_test_command() -> None:
    """.ci/run runs each step of the README's test command, in its order (between them it may do more)."""
    _, tests = readme_commands()
    steps = [s.strip() for s in tests.strip().split("&&")]
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()]
    at = 0
    for step in steps:
        if step.startswith("python3 -m venv"):  # CI makes the same virtual environment
            step = "python3 -m venv .venv"
        assert step in ci[at:], f".ci/run does not run '{step}' of the README's test command (after line {at})"
        at = ci.index(step, at) + 1


def test_every_benchmark_names_its_command_date_and_commit() -> None:
    """docs/benchmarks.md: each section of figures says the command behind them, when and at which commit."""
    text = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    sections = re.split(r"^## ", text, flags=re.M)[1:]
    figures = [s for s in sections if not s.startswith("The scripts")]
    assert len(figures) >= 5
    for section in figures:
        title = section.splitlines()[0]
        command = r"`(python3? scripts/|bash scripts/|deepdsl |/usr/bin/time |python3 -m venv |pytest)"
        assert re.search(command, section), f"{title}: no command"
        assert re.search(r"\b20\d\d-\d\d-\d\d\b", section), f"{title}: no date"
        assert re.search(r"`[0-9a-f]{7}`", section), f"{title}: no commit"
