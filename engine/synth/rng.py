"""A deterministic random stream whose values never depend on the numpy version.

numpy promises a stable raw bit stream from its bit generators but not stable
floats from Generator methods, so synthetic models (whose bytes are hashed and
compared against stored llama.cpp references) derive their floats here from a
counter-based SplitMix64: value i of a stream is mix(key + (i + 1) * GAMMA).
Being counter-based, any slice of a stream can be produced on its own (large
tensors are generated in chunks, tensors independently of each other).

Uniforms are exact (53 random bits). Normals use Box-Muller with log and cos
evaluated here by polynomials built only from IEEE-exact operations (+, *, /,
sqrt, frexp, floor): numpy's own log/cos may use different SIMD code on
different machines and builds, these give the same bits everywhere.
"""
from __future__ import annotations

import hashlib

import numpy as np

_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
_S11 = np.uint64(11)
_MASK64 = (1 << 64) - 1
_BLOCK = 1 << 15


def _mix(z: np.ndarray) -> np.ndarray:
    # SplitMix64 finaliser; uint64 arithmetic wraps modulo 2**64 by definition.
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


_LN2 = 0.6931471805599453
_SQRT_HALF = 0.7071067811865476


def _log(x: np.ndarray) -> np.ndarray:
    """Natural log of x > 0: x = m * 2**e, m in [sqrt(1/2), sqrt(2)), then
    log(m) = 2 atanh(s), s = (m-1)/(m+1), |s| < 0.172, by its odd series."""
    m, e = np.frexp(x)
    low = m < _SQRT_HALF
    m[low] *= 2.0
    e[low] -= 1
    s = (m - 1.0) / (m + 1.0)
    s2 = s * s
    acc = np.full_like(s, 2.0 / 25.0)
    for k in range(11, -1, -1):  # terms to s**25: below 1e-19 relative
        acc *= s2
        acc += 2.0 / (2 * k + 1)
    acc *= s
    acc += e * _LN2
    return acc


# Horner coefficients: cos phi = 1 - p2/(2*1) (1 - p2/(4*3) (1 - ...)), likewise sin phi / phi.
_COS_C = [-1.0 / (n * (n - 1)) for n in range(20, 0, -2)]
_SIN_C = [-1.0 / ((n + 1) * n) for n in range(20, 0, -2)]


def _cos_turns(u: np.ndarray) -> np.ndarray:
    """cos(2*pi*u) for u in [0, 1): quadrant q, then cos or sin of phi in
    [0, pi/2) by Taylor series (first omitted terms below 2e-17)."""
    t = u * 4.0  # exact
    q = np.floor(t)
    phi = t - q
    phi *= np.pi / 2
    p2 = phi * phi
    c = np.ones_like(phi)
    sn = np.ones_like(phi)
    for kc, ks in zip(_COS_C, _SIN_C):
        c *= p2
        c *= kc
        c += 1.0
        sn *= p2
        sn *= ks
        sn += 1.0
    sn *= phi
    return np.select([q == 0, q == 1, q == 2], [c, -sn, -c], sn)


def key_of(*parts: object) -> int:
    """A 64-bit stream key from any printable parts (seed, tensor name...)."""
    text = "\x1f".join(str(p) for p in parts).encode("utf-8")
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "little")


class Stream:
    """Counter-based random stream. ``Stream(seed, "name")`` keys it by all parts."""

    def __init__(self, *parts: object):
        self.key = key_of(*parts) if not (len(parts) == 1 and isinstance(parts[0], int)) \
            else parts[0] & _MASK64

    def raw(self, n: int, start: int = 0) -> np.ndarray:
        """n uint64 values: positions start .. start+n-1 of the stream."""
        idx = np.arange(start + 1, start + n + 1, dtype=np.uint64)
        with np.errstate(over="ignore"):
            return _mix(np.uint64(self.key) + idx * _GAMMA)

    def uniform(self, n: int, start: int = 0) -> np.ndarray:
        """n float64 uniforms in [0, 1), 53 bits each."""
        return (self.raw(n, start) >> _S11).astype(np.float64) * (1.0 / (1 << 53))

    def normal(self, n: int, start: int = 0) -> np.ndarray:
        """n standard normals; normal i uses raw values 2i and 2i+1 (Box-Muller)."""
        out = np.empty(n, np.float64)
        for a in range(0, n, _BLOCK):  # cache-sized blocks: the series are memory-bound
            b = min(n, a + _BLOCK)
            u = self.uniform(2 * (b - a), 2 * (start + a))
            u1 = 1.0 - u[0::2]  # in (0, 1]: log is finite
            out[a:b] = np.sqrt(-2.0 * _log(u1)) * _cos_turns(u[1::2])
        return out

    def student_t(self, n: int, df: int, start: int = 0) -> np.ndarray:
        """n Student-t draws with integer df, scaled to unit variance (df > 2).

        t = Z / sqrt(chi2_df / df), chi2_df a sum of df squared normals taken from
        an independent sub-stream; heavy tails make realistic weight outliers.
        """
        if df <= 2:
            raise ValueError("student_t needs df > 2 for a finite variance")
        z = self.normal(n, start)
        chi = Stream(self.key, "chi2").normal(n * df, start * df).reshape(n, df)
        acc = np.zeros(n)
        for j in range(df):  # a fixed summation order: np.sum's may vary
            acc += chi[:, j] * chi[:, j]
        t = z / np.sqrt(acc / df)
        return t * np.sqrt((df - 2) / df)
