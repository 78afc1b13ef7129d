"""The parser's tables are kept in the user's cache folder between runs; a kept copy parses exactly as a built
one, and a damaged, shared or disabled cache only means building the tables again."""

from __future__ import annotations

import os
from pathlib import Path

import lark
import pytest

from deepdsl import config
from deepdsl.frontend import parser
from deepdsl.frontend.transformer import ToAst

NETWORKS = sorted(Path(__file__).resolve().parents[2].joinpath("networks").glob("*.ddsl"))
GRAMMAR = parser.grammar_path().read_text()


def _modules(p: lark.Lark) -> list:
    return [ToAst(str(f)).transform(p.parse(f.read_text())) for f in NETWORKS]


def _no_building(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("the tables were built, not loaded")

    monkeypatch.setattr(parser, "Lark", type("NoBuild", (), {"__new__": refuse, "load": lark.Lark.load}))


def test_kept_tables_parse_every_network_as_built_ones(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tables = tmp_path / "cache" / "grammar.lark"
    built = parser.load_or_build(GRAMMAR, tables)
    assert tables.is_file()
    assert oct(tables.parent.stat().st_mode & 0o777) == oct(0o700)
    _no_building(monkeypatch)
    loaded = parser.load_or_build(GRAMMAR, tables)
    # the same modules, spans included (line and column of every node)
    assert _modules(loaded) == _modules(built)
    assert repr(_modules(loaded)[0]) == repr(_modules(built)[0])


def test_a_damaged_copy_is_built_again_and_replaced(tmp_path: Path) -> None:
    tables = tmp_path / "grammar.lark"
    tables.write_bytes(b"not a pickle of any parser")
    p = parser.load_or_build(GRAMMAR, tables)
    assert _modules(p)[0].network
    assert tables.read_bytes() != b"not a pickle of any parser"
    parser.load_or_build(GRAMMAR, tables)  # the replaced copy loads


def test_a_folder_others_can_write_is_not_used(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    planted = shared / "grammar.lark"
    planted.write_bytes(b"whatever another user left here")
    parser.load_or_build(GRAMMAR, planted)
    assert planted.read_bytes() == b"whatever another user left here"  # neither loaded nor replaced
    assert [f.name for f in shared.iterdir()] == ["grammar.lark"]


def test_the_cache_folder_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DEEPDSL_CACHE", "0")
    assert parser._tables_file(GRAMMAR) is None
    monkeypatch.setenv("DEEPDSL_CACHE", str(tmp_path))
    assert parser._tables_file(GRAMMAR).parent == tmp_path
    monkeypatch.delenv("DEEPDSL_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert config.from_env().cache_dir == str(tmp_path / "xdg" / "deepdsl")
    # another grammar, another file: an edited grammar never reads the old tables
    assert parser._tables_file(GRAMMAR + "\n") != parser._tables_file(GRAMMAR)
