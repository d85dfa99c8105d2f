"""The dropout keep-mask: 16 random bits per unit, kept with probability 1 - p."""
import numpy as np
import pytest

from npformer.functional.dropout import keep_mask


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


def test_a_32_bit_rng_is_refused():
    with pytest.raises(ValueError, match="MT19937"):
        keep_mask((4, 4), 0.1, np.random.Generator(np.random.MT19937(0)))
