"""The text source (`data/text.py`): characters as ids, next-token targets, the splits, and its errors; and the
synthetic source's token ids for integer inputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from deepdsl.data import parse_data_flag
from deepdsl.data.named import Field, load_samples
from deepdsl.errors import DslProgramError

TOKENS = Field("tok", "input", (4,), 8)
NEXT = Field("nxt", "label", (4,), 8)


def test_parse_text_flag() -> None:
    assert parse_data_flag("text:input.txt") == ("text", {"file": "input.txt"})
    with pytest.raises(DslProgramError, match="--data text needs a file"):
        parse_data_flag("text")


def test_characters_become_ids_with_next_character_targets(tmp_path: Path) -> None:
    text = "abcabcabcabcabcabcabcabcabcabcabca"  # 34 characters: 31 training, the last 3 test
    (tmp_path / "t.txt").write_text(text, encoding="utf-8")
    s = load_samples("text", {"file": str(tmp_path / "t.txt")}, (TOKENS, NEXT), seed=1)
    ids = np.array(["abc".index(ch) for ch in text])  # sorted distinct characters: a=0, b=1, c=2
    assert s.size == (31 - 1) // 4 and s.test is None  # a test part of 3 holds no sample of 4 + 1
    np.testing.assert_array_equal(s.train["tok"], ids[: 7 * 4].reshape(7, 4))
    np.testing.assert_array_equal(s.train["nxt"], ids[1 : 7 * 4 + 1].reshape(7, 4))
    assert s.train["tok"].dtype == np.int64


def test_the_last_tenth_is_the_test_text(tmp_path: Path) -> None:
    text = "".join(chr(ord("a") + (k * 7) % 5) for k in range(100)) + "é"  # a non-ASCII character: one code point
    (tmp_path / "t.txt").write_text("\ufeff" + text, encoding="utf-8")  # the byte order mark is dropped
    s = load_samples("text", {"file": str(tmp_path / "t.txt")}, (NEXT, TOKENS), seed=1)
    vocab = sorted(set(text))
    ids = np.array([vocab.index(ch) for ch in text])
    assert len(vocab) == 6 and s.size == (91 - 1) // 4 and s.test_size == (10 - 1) // 4
    assert s.test is not None
    np.testing.assert_array_equal(s.test["tok"], ids[91 : 91 + 8].reshape(2, 4))
    np.testing.assert_array_equal(s.test["nxt"], ids[92 : 92 + 8].reshape(2, 4))


@pytest.mark.parametrize(
    "content, fields, message",
    [
        ("abcdefghij" * 3, (TOKENS, NEXT), "has 10 distinct characters, more than the 8 of the network's input tok"),
        ("abc", (TOKENS, NEXT), "its training part (3) is too short for one sample of 4 tokens"),
        (b"ab\xffcd", (TOKENS, NEXT), "is not UTF-8 text"),
        ("abcabc" * 5, (TOKENS,), "text data fills one token input"),
        ("abcabc" * 5, (TOKENS, NEXT, Field("x", "input", (3,))), "nothing for the network's input x : [N, 3]"),
        ("abcabc" * 5, (TOKENS, Field("nxt", "label", (5,), 8)), "takes [T] tokens per sample"),
    ],
)
def test_text_errors(tmp_path: Path, content: str | bytes, fields: tuple, message: str) -> None:
    path = tmp_path / "t.txt"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(DslProgramError) as e:
        load_samples("text", {"file": str(path)}, fields, seed=1)
    assert message in str(e.value)


def test_a_missing_text_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(DslProgramError, match="text data file not found: '.*nope.txt'"):
        load_samples("text", {"file": str(tmp_path / "nope.txt")}, (TOKENS, NEXT), seed=1)


def test_image_data_has_nothing_for_token_inputs(tmp_path: Path) -> None:
    with pytest.raises(DslProgramError, match="mnist data holds images, so it has nothing for the network's input tok"):
        load_samples("mnist", {"dir": str(tmp_path)}, (TOKENS, NEXT), seed=1)


def test_synthetic_token_ids_follow_the_class() -> None:
    s = load_samples("synthetic", {}, (TOKENS, Field("y", "label", (), 3)), seed=1)
    y = s.train["y"]
    assert s.train["tok"].dtype == np.int64 and s.train["tok"].shape == (s.size, 4)
    np.testing.assert_array_equal(s.train["tok"], (y[:, None] + np.arange(4)) % 8)
    # without a float input, the classes still come from the synthetic label stream
    only = load_samples("synthetic", {}, (TOKENS, NEXT), seed=1)
    np.testing.assert_array_equal(only.train["tok"][:, 0], only.train["nxt"][:, 0])


def test_npz_token_ids_must_be_integers_in_the_vocabulary(tmp_path: Path) -> None:
    path = tmp_path / "d.npz"
    np.savez(path, tok=np.zeros((3, 4), np.float32), nxt=np.zeros((3, 4), np.int64))
    with pytest.raises(DslProgramError, match="must hold integer token ids for the network's input tok : \\[N, 4\\]"):
        load_samples("npz", {"file": str(path)}, (TOKENS, NEXT), seed=1)
    np.savez(path, tok=np.full((3, 4), 8, np.int64), nxt=np.zeros((3, 4), np.int64))
    with pytest.raises(DslProgramError, match="label 8 of sample 0 is outside \\[0, 8\\)"):
        load_samples("npz", {"file": str(path)}, (TOKENS, NEXT), seed=1)
