"""Weight initialisers (all take an explicit ``rng``, a numpy random Generator, so a seed fixes
the model)."""
import math


def xavier_uniform(rng, shape, dtype):
    """U(-a, a), a = sqrt(6 / (fan_in + fan_out)): keeps activation variance across a layer."""
    fan_out, fan_in = shape
    a = math.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-a, a, size=shape).astype(dtype)


def normal(rng, shape, std, dtype):
    return (rng.standard_normal(size=shape) * std).astype(dtype)
