"""The dropout keep-mask: 16 random bits per unit, kept with probability 1 - p."""
import numpy as np
import pytest

from npformer.functional.dropout import keep_mask, mask_words
from npformer.kernels.dropout import keep_mask as kernel_keep_mask


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5, 0.9])
def test_keep_fraction_is_one_minus_p(p):
    keep = keep_mask((400, 500), p, np.random.default_rng(0))
    # 200,000 Bernoulli draws: the standard error of the mean is <= 0.0012; allow 5 of them.
    assert keep.dtype == bool and keep.shape == (400, 500)
    assert abs(keep.mean() - (1 - p)) < 0.006


@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 5), (1, 1, 1, 1), (0, 4)])
def test_any_shape_and_sizes_not_divisible_by_four(shape):
    keep = keep_mask(shape, 0.2, np.random.default_rng(1))
    assert keep.shape == shape


def test_same_seed_same_mask_and_the_rng_advances():
    a, b = np.random.default_rng(5), np.random.default_rng(5)
    first = keep_mask((64, 33), 0.25, a)
    np.testing.assert_array_equal(first, keep_mask((64, 33), 0.25, b))
    assert not np.array_equal(first, keep_mask((64, 33), 0.25, a))


def test_p_near_one_keeps_almost_nothing_without_overflow():
    keep = keep_mask((1000,), 0.999999, np.random.default_rng(2))
    assert keep.sum() <= 2


def test_units_are_independent_within_each_64_bit_word():
    # four neighbouring units share one random word; their keep decisions must not correlate
    keep = keep_mask((200_000, 4), 0.5, np.random.default_rng(3)).astype(float)
    corr = np.corrcoef(keep.T)
    assert np.abs(corr[np.triu_indices(4, 1)]).max() < 0.01


@pytest.mark.parametrize("bit_generator", [np.random.PCG64, np.random.MT19937, np.random.Philox])
def test_any_generator_serves_and_advances_by_one_draw(bit_generator):
    rng, twin = np.random.Generator(bit_generator(4)), np.random.Generator(bit_generator(4))
    keep_mask((1000, 3), 0.1, rng)
    twin.integers(0, 1 << 64, dtype=np.uint64)              # the mask's one draw (its key)
    assert rng.integers(1 << 30) == twin.integers(1 << 30)


def test_the_first_words_are_splitmix64s():
    # SplitMix64 seeded with 1234567 (Vigna's splitmix64.c) gives 6457827717110365317 first
    # and 3203168211198807973 second
    words = mask_words(np.uint64(1234567), 2)
    assert words.tolist() == [6457827717110365317, 3203168211198807973]


@pytest.mark.parametrize("shape", [(7,), (3, 5), (0, 4), (2, 3, 5, 7), (1, 1), (64, 128, 192),
                                   (16, 4, 128, 129)])
@pytest.mark.parametrize("p", [0.1, 0.5, 0.999999])
def test_numba_twin_draws_the_same_bits(shape, p):
    # (16, 4, 128, 129): a partial last word in a large mask
    want = keep_mask(shape, p, np.random.default_rng(9))
    got = kernel_keep_mask(shape, p, np.random.default_rng(9))
    assert got.dtype == bool and got.shape == shape
    np.testing.assert_array_equal(got, want)
