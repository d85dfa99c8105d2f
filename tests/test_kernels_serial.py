"""A parallel kernel given little work runs its serial twin (npformer/kernels/_jit.py): the same
loop body compiled without ``parallel``. The choice depends on the shape alone; the twins agree
to rounding (most to the bit: LLVM may vectorise a row's sums differently in each)."""
import importlib

import numpy as np
import pytest

from npformer.kernels import _jit

K = importlib.import_module("npformer.kernels")
M = importlib.import_module("npformer.kernels.matmul")


def _both(monkeypatch, compute):
    """compute() once with every kernel serial and once with every kernel parallel."""
    monkeypatch.setattr(_jit, "SERIAL_BELOW", 1 << 62)
    serial = compute()
    monkeypatch.setattr(_jit, "SERIAL_BELOW", 0)
    parallel = compute()
    return serial, parallel


def _assert_close(a, b, rtol):
    if isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_close(x, y, rtol)
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol)
    elif isinstance(a, (float, int, np.floating)):
        assert a == pytest.approx(b, rel=rtol, abs=rtol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_serial_twins_agree_with_the_parallel_kernels(monkeypatch, dtype):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((37, 48)).astype(dtype)
    dy = rng.standard_normal((37, 48)).astype(dtype)
    gamma, beta = rng.standard_normal(48).astype(dtype), rng.standard_normal(48).astype(dtype)
    ids = rng.integers(0, 20, size=(5, 7))
    table = rng.standard_normal((20, 48)).astype(dtype)
    targets = rng.integers(0, 48, size=37)
    targets[::5] = 0                                  # some ignored rows
    a, b = rng.standard_normal((33, 40)).astype(dtype), rng.standard_normal((40, 29)).astype(dtype)

    def compute():
        out = []
        y, cache = K.layernorm_forward(x, gamma, beta, 1e-5)
        out += [y, K.layernorm_backward(dy, cache)]
        for act in ("relu", "gelu"):
            h, cache = K.activation_dropout_forward(x, act, 0.2, np.random.default_rng(1), True)
            out += [h, K.activation_dropout_backward(dy, cache)]
        d, cache = K.dropout_forward(x, 0.3, np.random.default_rng(2), True)
        out += [d, K.dropout_backward(dy, cache)]
        s, cache = K.dropout_add_forward(x, dy, 0.3, np.random.default_rng(2), True)
        out += [s, K.dropout_add_backward(x, cache)[1]]
        e, cache = K.embedding_forward(ids, table, 2.0)
        out += [e, K.embedding_backward(e * 0.5, cache, 0)]
        loss, cache = K.cross_entropy_forward(x, targets, 0, 0.1)
        out += [loss, K.cross_entropy_backward(1.0, cache)]
        for name in ("numba", "numba-blocked"):
            if name in M.VARIANTS:
                out.append(M.VARIANTS[name](a, b, np.empty((33, 29), dtype)))
        return out

    serial, parallel = _both(monkeypatch, compute)
    _assert_close(serial, parallel, 1e-5 if dtype == np.float32 else 1e-12)
    # the dropout masks, the activations and the gathers involve no sums: the very bits
    for i in (2, 4, 6, 8, 9, 10):
        np.testing.assert_array_equal(serial[i], parallel[i])


def test_the_choice_follows_the_work_argument():
    calls = []

    class Twin:
        def __init__(self, name):
            self.name = name

        def py_func(self, *args):
            """A stand-in for a compiled kernel."""

        def __call__(self, *args):
            calls.append(self.name)

    kernel = _jit.ParallelKernel(Twin("parallel"), Twin("serial"), work=1)
    small, large = np.zeros(10), np.zeros(_jit.SERIAL_BELOW)
    kernel(large, small)                 # the work argument (the second) is small
    kernel(small, large)
    assert calls == ["serial", "parallel"]
    # a product's work counts its multiply-adds: a small output over a long K is not small
    a, b, out = np.zeros((4, 64, 4096)), None, np.zeros((4, 64, 64))
    assert M._product_work(a, b, out) >= _jit.SERIAL_BELOW > out.size
