"""Element-wise activations: ReLU, GELU (the exact, erf-based one, as PyTorch's default) and the
tanh approximation of GELU that GPT-2 was trained with (Hugging Face's "gelu_new", PyTorch's
``gelu(approximate="tanh")``). The two GELUs differ by up to ~5e-4: a model keeps the one it was
trained with.

Derivation: docs/backprop.md#activations.
"""
import math

import numba
import numpy as np

# NumPy has no erf; this compiled ufunc is math.erf applied element-wise.
_erf = numba.vectorize(["float32(float32)", "float64(float64)"], cache=True)(lambda z: math.erf(z))

_INV_SQRT2 = 1.0 / math.sqrt(2.0)
_INV_SQRT2PI = 1.0 / math.sqrt(2.0 * math.pi)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_GELU_TANH_C = 0.044715


def relu_forward(x):
    """y = max(x, 0). Shape preserved."""
    y = np.maximum(x, 0)
    return y, y


def relu_backward(dout, cache):
    """dy/dx = 1 where x > 0, else 0 (the output carries that information: y > 0 iff x > 0)."""
    y = cache
    return dout * (y > 0)


def gelu_forward(x):
    """y = x * Phi(x), Phi the standard normal CDF = (1 + erf(x / sqrt 2)) / 2. Shape preserved."""
    cdf = 0.5 * (1.0 + _erf(x * x.dtype.type(_INV_SQRT2)))
    return x * cdf, (x, cdf)


def gelu_backward(dout, cache):
    """d/dx [x Phi(x)] = Phi(x) + x phi(x), phi the standard normal density."""
    x, cdf = cache
    pdf = np.exp(-0.5 * x * x) * x.dtype.type(_INV_SQRT2PI)
    return dout * (cdf + x * pdf)


def gelu_tanh_forward(x):
    """y = x/2 * (1 + tanh(u)), u = sqrt(2/pi) * (x + 0.044715 x^3). Shape preserved."""
    c = x.dtype.type
    u = c(_SQRT_2_OVER_PI) * (x + c(_GELU_TANH_C) * x * x * x)
    t = np.tanh(u)
    return c(0.5) * x * (c(1.0) + t), (x, t)


def gelu_tanh_backward(dout, cache):
    """d/dx [x/2 (1 + tanh u)] = (1 + tanh u)/2 + x/2 (1 - tanh^2 u) du/dx,
    du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2)."""
    x, t = cache
    c = x.dtype.type
    du = c(_SQRT_2_OVER_PI) * (c(1.0) + c(3.0 * _GELU_TANH_C) * x * x)
    return dout * (c(0.5) * (c(1.0) + t) + c(0.5) * x * (c(1.0) - t * t) * du)


ACTIVATIONS = {
    "relu": (relu_forward, relu_backward),
    "gelu": (gelu_forward, gelu_backward),
    "gelu_tanh": (gelu_tanh_forward, gelu_tanh_backward),
}
