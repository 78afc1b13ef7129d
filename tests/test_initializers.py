"""The reproducible initialisers: the published test vector, numpy == scalar, and the statistics."""

from __future__ import annotations

import math

import numpy as np
import pytest

from deepdsl.errors import DslProgramError
from deepdsl.initializers import (
    SplitMix64,
    fnv1a64,
    init_array,
    normal_array,
    splitmix64_array,
    stream_seed,
    uniform_array,
)


def test_fnv1a64_reference_values():
    assert fnv1a64("") == 0xCBF29CE484222325
    assert fnv1a64("a") == 0xAF63DC4C8601EC8C
    assert fnv1a64("foobar") == 0x85944171F73967E8


def test_splitmix64_reference_values():
    # Vigna's splitmix64.c seeded with 1234567 (the values quoted with the reference code)
    g = SplitMix64(1234567)
    assert [g.next() for _ in range(5)] == [
        6457827717110365317,
        3203168211198807973,
        9817491932198370423,
        4593380528125082431,
        16408922859458223821,
    ]


def test_test_vector_from_the_docstring():
    s = stream_seed("cv1.W", 1)
    assert fnv1a64("cv1.W") == 0x719C94BF31634354
    assert s == 0x719C94BF31634355
    g = SplitMix64(s)
    assert [g.next() for _ in range(3)] == [0xC0D9C6BE86FB3ECD, 0xC39AB565BAC66E63, 0x6FBD1FE4D5E6B470]
    g = SplitMix64(s)
    u = [g.uniform() for _ in range(3)]
    assert u == [12638662 / 2**24, 12819125 / 2**24, 7322911 / 2**24]
    assert [str(np.float32(x)) for x in u] == ["0.75332296", "0.7640794", "0.4364795"]
    w = init_array("cv1.W", (3,), "he", (), 25, 0, 1)
    assert w.dtype == np.float32
    assert [str(x) for x in w] == ["0.0418091", "0.18186393", "0.4434315"]
    # the docstring carries the same numbers
    import deepdsl.initializers as mod

    for text in ("0x719c94bf31634354", "0xc0d9c6be86fb3ecd", "0.7640794", "0.18186393", "0.4434315"):
        assert text in mod.__doc__


@pytest.mark.parametrize("seed", [0, 1, 0xFFFFFFFFFFFFFFFF, 0x9E3779B97F4A7C15 * 3 & (2**64 - 1)])
def test_vectorised_stream_equals_scalar(seed):
    g = SplitMix64(seed)
    raw = [g.next() for _ in range(1000)]
    assert splitmix64_array(seed, 1000).tolist() == raw
    assert splitmix64_array(seed, 10, start=500).tolist() == raw[500:510]
    g = SplitMix64(seed)
    assert uniform_array(seed, 1000).tolist() == [g.uniform() for _ in range(1000)]
    g = SplitMix64(seed)
    scalar = np.array([g.normal() for _ in range(1000)])
    vec = normal_array(seed, 1000)
    # log/cos may differ in the last float64 bit between numpy's SIMD loops and libm
    np.testing.assert_allclose(vec, scalar, rtol=1e-14, atol=1e-15)
    assert np.array_equal(vec.astype(np.float32), scalar.astype(np.float32))
    np.testing.assert_allclose(normal_array(seed, 7, start=100), scalar[100:107], rtol=1e-14, atol=1e-15)


def test_chunked_generation_matches_one_piece(monkeypatch):
    import deepdsl.initializers as mod

    whole = mod.normal_array(9, 1000)
    monkeypatch.setattr(mod, "_CHUNK", 77)
    assert np.array_equal(mod.normal_array(9, 1000), whole)
    assert np.array_equal(mod.uniform_array(9, 1000) * 2**24, mod.splitmix64_array(9, 1000) >> np.uint64(40))


def test_he_statistics_and_row_major_order():
    fan_in = 50
    w = init_array("big.W", (400, 50, 5), "he", (), fan_in, 10, seed=7)
    assert w.shape == (400, 50, 5) and w.dtype == np.float32
    std = math.sqrt(2 / fan_in)
    assert abs(float(w.std()) / std - 1) < 0.01
    assert abs(float(w.mean())) < 0.01 * std
    flat = normal_array(stream_seed("big.W", 7), w.size) * std
    assert np.array_equal(w.ravel(), flat.astype(np.float32))


def test_xavier_uniform_gaussian_constant():
    u = init_array("f.W", (1000, 100), "xavier", (), 100, 50, 3)
    a = math.sqrt(6 / 150)
    assert float(np.abs(u).max()) <= a and float(np.abs(u).max()) > 0.99 * a
    assert abs(float(u.std()) - a / math.sqrt(3)) < 0.01 * a
    ref = a * (2 * uniform_array(stream_seed("f.W", 3), u.size) - 1)
    assert np.array_equal(u.ravel(), ref.astype(np.float32))
    v = init_array("f.W", (1000, 100), "uniform", (0.25,), 1, 1, 3)
    assert float(np.abs(v).max()) <= 0.25
    g = init_array("g", (100000,), "gaussian", (0.5,), 1, 1, 3)
    assert abs(float(g.std()) - 0.5) < 0.01
    c = init_array("f.b", (4, 2), "constant", (0.5,), 1, 1, 3)
    assert c.dtype == np.float32 and (c == 0.5).all() and c.shape == (4, 2)
    assert init_array("x", (3,), "constant", (1.0,), 1, 1, 3, dtype=np.float64).dtype == np.float64
    assert init_array("x", (0, 3), "he", (), 1, 1, 3).shape == (0, 3)


def test_name_and_seed_select_the_stream():
    a = init_array("cv1.W", (10,), "he", (), 9, 9, 1)
    assert np.array_equal(a, init_array("cv1.W", (10,), "he", (), 9, 9, 1))
    assert not np.array_equal(a, init_array("cv2.W", (10,), "he", (), 9, 9, 1))
    assert not np.array_equal(a, init_array("cv1.W", (10,), "he", (), 9, 9, 2))


def test_bad_initialisers():
    with pytest.raises(DslProgramError, match="unknown initialiser 'kaiming'"):
        init_array("w", (2,), "kaiming", (), 1, 1, 1)
    with pytest.raises(DslProgramError, match=r"gaussian\(\) .* takes 1 argument"):
        init_array("w", (2,), "gaussian", (), 1, 1, 1)
    with pytest.raises(DslProgramError, match="positive fan_in"):
        init_array("w", (2,), "he", (), 0, 1, 1)
