"""Gradient tests for your own layer: copy this file into your project's tests/ and adapt it.

It checks a hand-written layer, y = x * sigmoid(x) @ W (SiLU, then a linear map), three ways:
  1. one fixed example, every entry (``assert_gradients``);
  2. many random shapes and scales, in the fast mode (Hypothesis + npformer.testing's strategies);
  3. that the check would catch a mistake: a wrong backward must fail.
Run it with ``python -m pytest example_test_gradients.py`` (needs ``pip install "npformer[test]"``).
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npformer.testing import assert_gradients, float_arrays, shapes


def silu_linear_forward(x, w):
    """x (..., D_in), w (D_out, D_in) -> y (..., D_out), y = silu(x) @ w.T."""
    s = 1.0 / (1.0 + np.exp(-x))                   # sigmoid
    h = x * s                                      # silu
    return h @ w.T, (x, s, h, w)


def silu_linear_backward(dy, cache):
    """dh = dy @ w; dw = dy^T h over every row; dx = dh * (s + x s (1 - s))."""
    x, s, h, w = cache
    dh = dy @ w
    dw = dy.reshape(-1, dy.shape[-1]).T @ h.reshape(-1, h.shape[-1])
    dx = dh * (s + x * s * (1.0 - s))
    return dx, dw


def layer(x, w):
    """The form the checker takes: the output and a closure from dout to one gradient per input."""
    y, cache = silu_linear_forward(x, w)
    return y, lambda dy: silu_linear_backward(dy, cache)


def test_every_entry_on_one_example():
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((2, 3, 4)), rng.standard_normal((5, 4))   # float64, small
    assert_gradients(layer, [x, w], names=["x", "w"])


@settings(max_examples=20, deadline=None)      # no deadline: the first call may compile kernels
@given(data=st.data(), shape=shapes(min_dims=1, max_dims=3, max_side=4), d_out=st.integers(1, 4))
def test_random_shapes_and_scales_fast(data, shape, d_out):
    x = data.draw(float_arrays(shape))                         # bounded scale, mixed rows, zeros
    w = data.draw(float_arrays((d_out, shape[-1])))
    assert_gradients(layer, [x, w], names=["x", "w"], fast=True)


def test_a_wrong_backward_is_caught_by_the_checker_itself():
    """Forget the product rule's second term (dx = dh * s): the check must fail, naming x."""
    def wrong(x, w):
        y, cache = silu_linear_forward(x, w)

        def backward(dy):
            dx, dw = silu_linear_backward(dy, cache)
            return dh_times_sigmoid(dy, cache), dw
        return y, backward

    def dh_times_sigmoid(dy, cache):
        x, s, h, w = cache
        return (dy @ w) * s

    rng = np.random.default_rng(1)
    with pytest.raises(AssertionError, match=r"x\s+WRONG"):
        assert_gradients(wrong, [rng.standard_normal((3, 4)), rng.standard_normal((2, 4))],
                         names=["x", "w"])
