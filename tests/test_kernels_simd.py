"""The explicit-vector helpers of kernels/_simd.py that pass over what a loop does not need:
``vmax`` and ``vmax_lanes`` (a row's maximum at vector speed), ``vmask_ge`` (which lanes reach a
float64 threshold, compared exactly) and ``lowest_bit`` (visiting those lanes in order), on
float32 and float64, with NaN, infinities and thresholds a float32 rounding would move."""
import numpy as np
import pytest
from numba import njit

from npformer import backend

S = backend.load("numba")._simd
L = S.LANES


@njit(cache=True)
def _row_max(x):
    acc = S.vload(x, 0)
    for j in range(L, x.shape[0], L):
        acc = S.vmax(S.vload(x, j), acc)
    return S.vmax_lanes(acc)


@njit(cache=True)
def _lanes(x, at, low):
    """The lanes of x[at:at + 16] not below low, visited through lowest_bit, in order."""
    mask = S.vmask_ge(S.vload(x, at), low)
    out = []
    while mask:
        out.append(S.lowest_bit(mask))
        mask &= mask - 1
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_vmax_and_vmax_lanes_give_the_largest_entry(dtype):
    rng = np.random.default_rng(0)
    for n in (L, 2 * L, 37 * L):
        x = (rng.standard_normal(n) * 100).astype(dtype)
        assert _row_max(x) == x.max()
        x[rng.integers(0, n, 3)] = -np.inf
        assert _row_max(x) == x.max()
        x[n // 2] = np.inf
        assert _row_max(x) == np.inf
    x = np.full(L, -np.inf, dtype=dtype)
    assert _row_max(x) == -np.inf
    x = np.arange(3 * L, dtype=dtype)
    x[5] = np.nan                                       # a NaN lane is passed over
    assert _row_max(x) == 3 * L - 1


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_vmask_ge_sets_exactly_the_lanes_not_below_the_threshold(dtype):
    rng = np.random.default_rng(1)
    for _ in range(50):
        x = rng.standard_normal(2 * L).astype(dtype)
        low = float(rng.standard_normal())
        for at in (0, 3, L):
            assert _lanes(x, at, low) == np.flatnonzero(x[at:at + L] >= low).tolist()
    x = np.arange(L, dtype=dtype)
    x[2], x[4] = np.nan, -np.inf
    assert _lanes(x, 0, -np.inf) == [j for j in range(L) if j != 2]
    assert _lanes(x, 0, np.inf) == []
    assert _lanes(x, 0, float(L - 1)) == [L - 1]


def test_vmask_ge_compares_float32_lanes_with_a_float64_threshold_exactly():
    """A float32 lane just above a float64 threshold that rounds up to it in float32, and one
    just below a threshold that rounds down to it: a comparison in float32 would get both wrong."""
    x = np.zeros(L, dtype=np.float32)
    x[1] = np.float32(0.1)                              # 0.100000001490116...
    x[2] = np.float32(0.3)                              # 0.300000011920928...
    assert float(x[1]) > 0.1 and float(x[2]) > 0.3
    assert _lanes(x, 0, 0.1) == [1, 2]                  # x[1] >= 0.1 holds in float64
    assert _lanes(x, 0, float(x[2]) + 1e-12) == []      # rounds to x[2] in float32, yet above
    assert _lanes(x, 0, float(x[2]) - 1e-12) == [2]


def test_lowest_bit():
    for mask in (1, 2, 6, 1 << 15, (1 << 16) - 1, 1 << 62):
        bits = []
        m = mask
        while m:
            bits.append(int(_lowest(m)))
            m &= m - 1
        assert bits == [j for j in range(64) if mask >> j & 1]
    assert _lowest(0) == 64


@njit(cache=True)
def _lowest(m):
    return S.lowest_bit(np.int64(m))
