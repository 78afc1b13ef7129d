"""Bit-reproducible parameter initialisation, shared with the Java runtime (DESIGN.md 2.4).

Every parameter draws from its own SplitMix64 stream, seeded with ``seed XOR fnv1a64(name)``
(``name`` is the parameter's name of DESIGN.md 9, e.g. ``cv1.W``; ``seed`` is taken mod 2^64).

The stream
    SplitMix64 as published (Steele, Lea, Flood 2014; Vigna's ``splitmix64.c``)::

        state += 0x9E3779B97F4A7C15
        z = state
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
        z = (z ^ (z >> 27)) * 0x94D049BB133111EB
        return z ^ (z >> 31)                # all arithmetic mod 2^64, shifts unsigned

    The k-th output (k = 0, 1, ...) is therefore ``mix(state0 + (k + 1) * gamma)``, which is what
    the vectorised numpy path computes for many k at once.

Uniforms
    ``uniform() = (next() >>> 40) * 2^-24``: 24 random bits, a float in [0, 1) that float32
    represents exactly.

Normals
    Box–Muller on two consecutive uniforms, *one normal per pair* (the sine half is discarded,
    so element i of a tensor depends on draws 2i and 2i+1 only)::

        normal = sqrt(-2 * ln(1 - u1)) * cos((2 * pi) * u2)      # float64 throughout

    ``1 - u1`` lies in (0, 1], so the logarithm is always finite. In Java:
    ``Math.sqrt(-2.0 * StrictMath.log(1.0 - u1)) * StrictMath.cos(2.0 * Math.PI * u2)``.

Initialisers (element i of the parameter in C / row-major order)
    ``he()``          ``normal_i * sqrt(2 / fan_in)``
    ``xavier()``      ``a * (2 * u_i - 1)`` with ``a = sqrt(6 / (fan_in + fan_out))``
    ``gaussian(std)`` ``normal_i * std``
    ``uniform(a)``    ``a * (2 * u_i - 1)``
    ``constant(v)``   ``v`` (draws nothing)

    Values are computed in float64 and rounded once to the parameter's dtype (float32).

On bit-identity
    The stream, the uniforms and every multiplication are exact or correctly rounded IEEE
    operations, identical in any language. ``log`` and ``cos`` come from a math library, and
    libraries may disagree in the last float64 bit (numpy's SIMD ``log`` does, against glibc, on
    about 0.3% of inputs). After the final rounding to float32 such a disagreement changes the
    result only when the float64 value lies within one float64 ulp of a float32 rounding
    boundary, about one chance in 2^28 per element, so initial parameters agree bit for bit in
    practice (an AlexNet has ~60M parameters: an expected 0.001 differing elements).

Test vector
    For ``name = "cv1.W"`` and ``seed = 1``:

    - ``fnv1a64("cv1.W") = 0x719c94bf31634354``; stream seed ``0x719c94bf31634355``
    - first three ``next()``: ``0xc0d9c6be86fb3ecd``, ``0xc39ab565bac66e63``, ``0x6fbd1fe4d5e6b470``
    - first three ``uniform()``: ``0.75332296``, ``0.7640794``, ``0.4364795``
      (exactly 12638662 / 2^24, 12819125 / 2^24, 7322911 / 2^24)
    - first three ``he()`` values with ``fan_in = 25`` (float32, shortest repr):
      ``0.0418091``, ``0.18186393``, ``0.4434315``

    (``he`` element 0 uses the uniforms 0 and 1, element 1 uses uniforms 2 and 3, ...)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .errors import DslProgramError

__all__ = [
    "FNV_OFFSET",
    "FNV_PRIME",
    "GAMMA",
    "KINDS",
    "SplitMix64",
    "fnv1a64",
    "init_array",
    "init_scratch_bytes",
    "normal_array",
    "splitmix64_array",
    "stream_seed",
    "uniform_array",
]

MASK64 = (1 << 64) - 1
FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
GAMMA = 0x9E3779B97F4A7C15
_MUL1 = 0xBF58476D1CE4E5B9
_MUL2 = 0x94D049BB133111EB
_TWO_PI = 2.0 * math.pi
_U24 = 2.0**-24

#: initialiser kind -> number of arguments it takes
KINDS = {"he": 0, "xavier": 0, "gaussian": 1, "uniform": 1, "constant": 1}

# Elements generated per numpy chunk: bounds the temporaries (a few uint64 arrays of this size).
_CHUNK = 1 << 21
# The float64 and uint64 scratch one chunk of init_array takes, per element (he and gaussian: two uint64 and two
# float64 draws and their transforms; measured 56 bytes with tracemalloc): what memory/footprint.py counts.
_SCRATCH_PER_ELEMENT = 64


def init_scratch_bytes(count: int) -> int:
    """The most scratch `init_array` takes beside its result for a parameter of `count` elements."""
    return _SCRATCH_PER_ELEMENT * min(count, _CHUNK)


def fnv1a64(s: str) -> int:
    """64-bit FNV-1a hash of the UTF-8 bytes of `s`."""
    h = FNV_OFFSET
    for byte in s.encode("utf-8"):
        h = ((h ^ byte) * FNV_PRIME) & MASK64
    return h


def stream_seed(name: str, seed: int) -> int:
    """The SplitMix64 seed of parameter `name`: ``seed XOR fnv1a64(name)`` (seed taken mod 2^64)."""
    return (seed & MASK64) ^ fnv1a64(name)


def _mix(z: int) -> int:
    z = ((z ^ (z >> 30)) * _MUL1) & MASK64
    z = ((z ^ (z >> 27)) * _MUL2) & MASK64
    return z ^ (z >> 31)


class SplitMix64:
    """The scalar reference generator; `splitmix64_array` produces the same numbers in bulk."""

    def __init__(self, seed: int):
        self.state = seed & MASK64

    def next(self) -> int:
        """The next raw output, an unsigned 64-bit int."""
        self.state = (self.state + GAMMA) & MASK64
        return _mix(self.state)

    def uniform(self) -> float:
        """``(next() >> 40) * 2^-24``: a float in [0, 1), exact in float32."""
        return (self.next() >> 40) * _U24

    def normal(self) -> float:
        """A standard normal from two uniforms (Box–Muller, cosine half only), in float64."""
        u1 = self.uniform()
        u2 = self.uniform()
        return math.sqrt(-2.0 * math.log(1.0 - u1)) * math.cos(_TWO_PI * u2)


def splitmix64_array(seed: int, count: int, start: int = 0) -> np.ndarray:
    """Outputs ``start .. start+count-1`` of the stream seeded with `seed`, as uint64 (no chunking)."""
    k = np.arange(start + 1, start + count + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = k * np.uint64(GAMMA)  # wraps mod 2^64
        z += np.uint64(seed & MASK64)
        z ^= z >> np.uint64(30)
        z *= np.uint64(_MUL1)
        z ^= z >> np.uint64(27)
        z *= np.uint64(_MUL2)
        z ^= z >> np.uint64(31)
    return z


def _uniforms(seed: int, count: int, start: int) -> np.ndarray:
    raw = splitmix64_array(seed, count, start)
    raw >>= np.uint64(40)
    return raw.astype(np.float64) * _U24


def uniform_array(seed: int, count: int, start: int = 0) -> np.ndarray:
    """Uniforms ``start .. start+count-1`` of the stream, float64 (exact float32 values)."""
    out = np.empty(count, dtype=np.float64)
    for lo in range(0, count, _CHUNK):
        hi = min(count, lo + _CHUNK)
        out[lo:hi] = _uniforms(seed, hi - lo, start + lo)
    return out


def normal_array(seed: int, count: int, start: int = 0) -> np.ndarray:
    """Normals ``start .. start+count-1`` of the stream (normal i uses uniforms 2i, 2i+1), float64."""
    out = np.empty(count, dtype=np.float64)
    for lo in range(0, count, _CHUNK):
        hi = min(count, lo + _CHUNK)
        u = _uniforms(seed, 2 * (hi - lo), 2 * (start + lo))
        u1, u2 = u[0::2], u[1::2]
        r = np.sqrt(-2.0 * np.log(1.0 - u1))
        out[lo:hi] = r * np.cos(_TWO_PI * u2)
    return out


def init_array(
    name: str,
    shape: Sequence[int],
    kind: str,
    args: Sequence[float],
    fan_in: int,
    fan_out: int,
    seed: int,
    dtype: np.dtype | type = np.float32,
) -> np.ndarray:
    """The initial value of parameter `name` (see the module docstring for the exact recipe)."""
    shape = tuple(int(d) for d in shape)
    if any(d < 0 for d in shape):
        raise DslProgramError(f"parameter '{name}' has a negative dimension in shape {list(shape)}")
    if kind not in KINDS:
        known = ", ".join(f"{k}()" for k in KINDS)
        raise DslProgramError(f"unknown initialiser '{kind}' for parameter '{name}' (known: {known})")
    args = tuple(float(a) for a in args)
    if len(args) != KINDS[kind]:
        raise DslProgramError(
            f"initialiser {kind}() for parameter '{name}' takes {KINDS[kind]} argument(s), got {len(args)}"
        )
    count = math.prod(shape)
    s = stream_seed(name, seed)
    if kind == "constant":
        return np.full(shape, args[0], dtype=dtype)  # (v rounded once to dtype, as float64 then astype did)
    if kind == "he":
        if fan_in <= 0:
            raise DslProgramError(f"he() for parameter '{name}' needs a positive fan_in, got {fan_in}")
        scale = math.sqrt(2.0 / fan_in)
        chunk = lambda lo, n: normal_array(s, n, lo) * scale  # noqa: E731
    elif kind == "gaussian":
        std = args[0]
        chunk = lambda lo, n: normal_array(s, n, lo) * std  # noqa: E731
    else:
        if kind == "xavier":
            if fan_in + fan_out <= 0:
                raise DslProgramError(
                    f"xavier() for parameter '{name}' needs fan_in + fan_out > 0, got {fan_in} + {fan_out}"
                )
            a = math.sqrt(6.0 / (fan_in + fan_out))
        else:
            a = args[0]
        chunk = lambda lo, n: a * (2.0 * uniform_array(s, n, lo) - 1.0)  # noqa: E731
    # chunk by chunk into the parameter's dtype: the float64 temporaries are those of one chunk (INIT_SCRATCH_BYTES),
    # never of the whole tensor. The chunks start at multiples of _CHUNK, as normal_array's and uniform_array's own do,
    # so every numpy call is the one the whole-tensor computation made: the values are bit for bit the same.
    out = np.empty(count, dtype=dtype)
    for lo in range(0, count, _CHUNK):
        n = min(_CHUNK, count - lo)
        out[lo : lo + n] = chunk(lo, n)
    return out.reshape(shape)
