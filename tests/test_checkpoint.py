"""Parameter files: atomic writes, np.load compatibility, and the checks a load makes."""

from __future__ import annotations

import os
import zipfile

import numpy as np
import pytest

from deepdsl.checkpoint import load_npz, save_npz
from deepdsl.errors import DslProgramError

F32 = np.dtype(np.float32)
I64 = np.dtype(np.int64)


def arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "cv1.W": rng.standard_normal((4, 1, 3, 3)).astype(np.float32),
        "cv1.b": np.zeros(4, np.float32),
        "bn.running_mean": np.ones(4, np.float32),
        "opt/cv1.W/momentum": np.full((4, 1, 3, 3), 0.5, np.float32),
        "opt/cv1.b/momentum": np.zeros(4, np.float32),
        "opt/step": np.array(17, np.int64),
        "file": np.ones(2, np.float32),  # would clash with np.savez's own parameter
    }


def expected_of(a: dict[str, np.ndarray]) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    return {k: (v.shape, v.dtype) for k, v in a.items()}


def test_round_trip_with_dots_and_slashes(tmp_path):
    a = arrays()
    path = tmp_path / "params.npz"
    save_npz(path, a)
    assert os.listdir(tmp_path) == ["params.npz"]  # no temp file left behind
    # np.load reads it, names unchanged and in order; the entries are stored uncompressed
    with np.load(path) as z:
        assert z.files == list(a)
        assert np.array_equal(z["opt/cv1.W/momentum"], a["opt/cv1.W/momentum"])
    with zipfile.ZipFile(path) as zf:
        assert [i.filename for i in zf.infolist()] == [k + ".npy" for k in a]
        assert {i.compress_type for i in zf.infolist()} == {zipfile.ZIP_STORED}
    loaded = load_npz(path, expected_of(a))
    assert list(loaded) == list(a)
    for k in a:
        assert loaded[k].dtype == a[k].dtype and np.array_equal(loaded[k], a[k])
    # and np.savez's own files load too
    np.savez(tmp_path / "np.npz", **{k: v for k, v in a.items() if k != "file"})
    b = {k: v for k, v in a.items() if k != "file"}
    assert list(load_npz(tmp_path / "np.npz", expected_of(b))) == list(b)


def test_save_replaces_atomically_and_cleans_up(tmp_path, monkeypatch):
    path = tmp_path / "p.npz"
    save_npz(path, {"a.W": np.zeros(2, np.float32)})
    save_npz(path, {"a.W": np.ones(2, np.float32)})
    assert load_npz(path, {"a.W": ((2,), F32)})["a.W"].tolist() == [1, 1]

    def broken(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np.lib.format, "write_array", broken)
    with pytest.raises(DslProgramError, match="cannot write parameter file .*No space left"):
        save_npz(path, {"a.W": np.full(2, 7, np.float32)})
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ["p.npz"]  # the old file is intact, the temp file gone
    assert load_npz(path, {"a.W": ((2,), F32)})["a.W"].tolist() == [1, 1]
    with pytest.raises(DslProgramError, match="folder .* does not exist"):
        save_npz(tmp_path / "no" / "p.npz", {"a.W": np.zeros(1)})
    with pytest.raises(DslProgramError, match="cannot save an array under the name ''"):
        save_npz(path, {"": np.zeros(1)})


def test_optimizer_state_is_optional_as_a_group(tmp_path):
    a = arrays()
    params = {k: v for k, v in a.items() if "/" not in k}
    path = tmp_path / "p.npz"
    save_npz(path, params)
    loaded = load_npz(path, expected_of(a))
    assert list(loaded) == list(params)  # no opt/ entries: the optimizer starts fresh
    partial = dict(params, **{"opt/cv1.W/momentum": a["opt/cv1.W/momentum"]})
    save_npz(path, partial)
    with pytest.raises(DslProgramError, match="has no optimizer state 'opt/cv1.b/momentum'"):
        load_npz(path, expected_of(a))


def test_load_errors(tmp_path):
    a = arrays()
    exp = expected_of(a)
    path = tmp_path / "p.npz"
    with pytest.raises(DslProgramError, match="parameter file not found: '.*p.npz'"):
        load_npz(path, exp)
    save_npz(path, {k: v for k, v in a.items() if k != "cv1.b"})
    with pytest.raises(DslProgramError, match="has no array 'cv1.b'"):
        load_npz(path, exp)
    save_npz(path, dict(a, **{"cv1.W": np.zeros((4, 3, 3, 3), np.float32)}))
    with pytest.raises(
        DslProgramError, match=r"'cv1.W' has shape \[4, 3, 3, 3\], but the network expects \[4, 1, 3, 3\]"
    ):
        load_npz(path, exp)
    save_npz(path, dict(a, extra=np.zeros(1)))
    with pytest.raises(DslProgramError, match="has an entry 'extra' that the network does not have"):
        load_npz(path, exp)
    save_npz(path, dict(a, **{"cv1.b": np.zeros(4, np.int32)}))
    with pytest.raises(DslProgramError, match="'cv1.b' holds int32, but the network expects float32"):
        load_npz(path, exp)
    # the first mismatch in the expected order is the one reported
    save_npz(path, dict(a, **{"cv1.W": np.zeros(1, np.float32), "cv1.b": np.zeros(1, np.float32)}))
    with pytest.raises(DslProgramError, match="'cv1.W' has shape"):
        load_npz(path, exp)
    # float64 and int32 convert within their kind
    save_npz(path, dict(a, **{"cv1.b": np.ones(4), "opt/step": np.array(3, np.int32)}))
    loaded = load_npz(path, exp)
    assert loaded["cv1.b"].dtype == F32 and loaded["opt/step"].dtype == I64 and int(loaded["opt/step"]) == 3
    path.write_bytes(b"not an archive")
    with pytest.raises(DslProgramError, match="cannot read parameter file"):
        load_npz(path, exp)


def test_other_optimizers_state(tmp_path):
    path = tmp_path / "p.npz"
    params = {"f.W": np.zeros((2, 3), np.float32)}
    save_npz(path, dict(params, **{"opt/f.W/m": np.zeros((2, 3), np.float32), "opt/step": np.array(1)}))
    sgd = {"f.W": ((2, 3), F32), "opt/f.W/momentum": ((2, 3), F32), "opt/step": ((), I64)}
    with pytest.raises(DslProgramError, match="has no optimizer state 'opt/f.W/momentum'"):
        load_npz(path, sgd)
    inference = {"f.W": ((2, 3), F32)}
    with pytest.raises(DslProgramError, match="entry 'opt/f.W/m' .*different optimizer"):
        load_npz(path, inference)
    assert list(load_npz(path, inference, ignore_optimizer_state=True)) == ["f.W"]
