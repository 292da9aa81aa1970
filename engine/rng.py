"""A deterministic random stream whose values never depend on the numpy version.

numpy promises a stable raw bit stream from its bit generators but not stable
floats from Generator methods, so synthetic models (whose bytes are hashed and
compared against stored llama.cpp references) derive their floats here from a
counter-based SplitMix64: value i of a stream is mix(key + (i + 1) * GAMMA).
Being counter-based, any slice of a stream can be produced on its own (large
tensors are generated in chunks, tensors independently of each other).

Uniforms are exact (53 random bits). Normals use Box-Muller in float64; numpy's
log/cos may differ by an ulp between builds, which vanishes when the values are
rounded to float32 or narrower as every synthetic tensor is.
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


def _mix(z: np.ndarray) -> np.ndarray:
    # SplitMix64 finaliser; uint64 arithmetic wraps modulo 2**64 by definition.
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


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
        u = self.uniform(2 * n, 2 * start)
        u1 = 1.0 - u[0::2]  # in (0, 1]: log is finite
        return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u[1::2])

    def student_t(self, n: int, df: int, start: int = 0) -> np.ndarray:
        """n Student-t draws with integer df, scaled to unit variance (df > 2).

        t = Z / sqrt(chi2_df / df), chi2_df a sum of df squared normals taken from
        an independent sub-stream; heavy tails make realistic weight outliers.
        """
        if df <= 2:
            raise ValueError("student_t needs df > 2 for a finite variance")
        z = self.normal(n, start)
        chi = Stream(self.key, "chi2").normal(n * df, start * df).reshape(n, df)
        t = z / np.sqrt((chi * chi).sum(axis=1) / df)
        return t * np.sqrt((df - 2) / df)
