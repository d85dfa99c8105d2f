"""Element-wise activations: ReLU and GELU (the exact, erf-based one, as PyTorch's default).

Derivation: docs/backprop.md#activations.
"""
import math

import numba
import numpy as np

# NumPy has no erf; this compiled ufunc is math.erf applied element-wise.
_erf = numba.vectorize(["float32(float32)", "float64(float64)"], cache=True)(lambda z: math.erf(z))

_INV_SQRT2 = 1.0 / math.sqrt(2.0)
_INV_SQRT2PI = 1.0 / math.sqrt(2.0 * math.pi)


def relu_forward(x):
    """y = max(x, 0). Shape preserved."""
    y = np.maximum(x, 0)
    return y, y


def relu_backward(dy, cache):
    """dy/dx = 1 where x > 0, else 0 (the output carries that information: y > 0 iff x > 0)."""
    y = cache
    return dy * (y > 0)


def gelu_forward(x):
    """y = x * Phi(x), Phi the standard normal CDF = (1 + erf(x / sqrt 2)) / 2. Shape preserved."""
    cdf = 0.5 * (1.0 + _erf(x * x.dtype.type(_INV_SQRT2)))
    return x * cdf, (x, cdf)


def gelu_backward(dy, cache):
    """d/dx [x Phi(x)] = Phi(x) + x phi(x), phi the standard normal density."""
    x, cdf = cache
    pdf = np.exp(-0.5 * x * x) * x.dtype.type(_INV_SQRT2PI)
    return dy * (cdf + x * pdf)


ACTIVATIONS = {
    "relu": (relu_forward, relu_backward),
    "gelu": (gelu_forward, gelu_backward),
}
