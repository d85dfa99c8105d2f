"""Eval mode's fusions around the products, held to the bits of the calls they replace: the
ReLU applied in a product's cells (``matmul(..., relu=True)``, ``linear_relu_forward``) against
``activation_dropout_forward``'s, and the post-norm residual sum and LayerNorm in one pass
(``add_layernorm_forward``) against ``dropout_add_forward`` then ``layernorm_forward``; then
the modules that take them (eval only) against the same modules with the fusions off."""
import importlib

import numpy as np
import pytest

from npformer import backend, runtime
from npformer.kernels import _jit
from npformer.nn import DecoderLayer, EncoderLayer, FeedForward, GatedFeedForward, LayerNorm
from thread_bits import assert_same_bits_on_threads

K = backend.load("numba")
M = importlib.import_module("npformer.kernels.matmul")   # (the package's `matmul` is the function)
DTYPES = [np.float32, np.float64]
SPECIALS = [np.nan, -np.inf, np.inf, -0.0, 0.0]


def assert_same_bytes(got, expected):
    """Equal byte for byte: NaN's payload and the sign of a zero included."""
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert got.tobytes() == expected.tobytes()


def _relu(h):
    """The unfused ReLU: the activation kernel in eval mode."""
    return K.activation_dropout_forward(h, "relu", 0.1, None, training=False)[0]


def _product_operands(m, dtype, seed=11):
    """a (m, 96), w (1500, 96), a bias whose first entries are NaN, -inf, inf, -0.0 and 0.0;
    a zero row and a NaN in a (NaN sums, -0.0 products)."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, 96)).astype(dtype)
    a[0] = 0.0
    a[-1, 3] = np.nan
    w = rng.standard_normal((1500, 96)).astype(dtype)
    bias = rng.standard_normal(1500).astype(dtype)
    bias[:len(SPECIALS)] = SPECIALS
    return a, w, bias


@pytest.mark.parametrize("variant,m", [(v, m) for v in ("blas", "numba-blocked", "numba")
                                       for m in (3, 700)] + [("numba-thin", 3)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_relu_in_the_cells_gives_the_bits_of_the_activation_after_the_product(variant, m, dtype):
    """Every variant, with and without a bias, on 1, 2 or 3 workers: relu applied cell by cell
    is the product (+ bias) followed by the activation kernel's ReLU, byte for byte."""
    a, w, bias = _product_operands(m, dtype)
    before = runtime.policy()
    try:
        for b in (bias, None):
            product = M._run_main(variant, a, w.T, np.empty((m, 1500), dtype), b)
            expected = _relu(product)
            assert np.isnan(expected[-1]).all()              # a NaN in a's row: NaN
            if b is not None:
                assert np.isnan(expected[:, :2]).all()      # NaN + x and -inf's ReLU: NaN
            for workers in (1, 2, 3):
                runtime._state["policy"] = runtime.thread_policy(workers, numba_max=1)
                got = M._run_main(variant, a, w.T, np.empty((m, 1500), dtype), b, True)
                assert_same_bytes(got, expected)
    finally:
        runtime._state["policy"] = before


@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_relu_by_the_dispatcher_and_into_a_strided_out(dtype):
    a, w, bias = _product_operands(700, dtype)
    expected = _relu(M.matmul(a, w.T, bias=bias))
    assert_same_bytes(M.matmul(a, w.T, bias=bias, relu=True), expected)
    out = np.empty((1500, 700), dtype).T                              # strided rows
    assert_same_bytes(np.ascontiguousarray(M.matmul(a, w.T, out=out, bias=bias, relu=True)),
                      expected)
    out = np.zeros((700, 1500), dtype)
    out[0] = bias                                      # the bias is a row that out overwrites
    got = M.matmul(a, w.T, out=out, bias=out[0], relu=True)
    assert_same_bytes(got, expected)
    empty = M.matmul(np.ones((0, 96), dtype), w.T, bias=bias, relu=True)
    assert empty.shape == (0, 1500)


def test_matmul_relu_refuses_a_batched_product():
    with pytest.raises(ValueError, match=r"matmul: relu: expected 2-D operands"):
        M.matmul(np.ones((2, 3, 4), np.float32), np.ones((2, 4, 40), np.float32), relu=True)


@pytest.mark.parametrize("lead,bias", [((700,), True), ((5, 1), True), ((3, 7), False)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_relu_forward_and_its_caches_give_the_unfused_bits(lead, bias, dtype):
    rng = np.random.default_rng(2)
    x = rng.standard_normal(lead + (96,)).astype(dtype)
    w = rng.standard_normal((1500, 96)).astype(dtype)
    b = rng.standard_normal(1500).astype(dtype) if bias else None
    h, lin_cache = K.linear_forward(x, w, b)
    expected, act_cache = K.activation_dropout_forward(h, "relu", 0.1, None, training=False)
    got, (lin_cache2, act_cache2) = K.linear_relu_forward(x, w, b)
    assert_same_bytes(got, expected)
    dout = rng.standard_normal(expected.shape).astype(dtype)
    dh = K.activation_dropout_backward(dout, act_cache)
    dh2 = K.activation_dropout_backward(dout, act_cache2)
    assert_same_bytes(dh2, dh)
    for g2, g in zip(K.linear_backward(dh2, lin_cache2), K.linear_backward(dh, lin_cache)):
        assert_same_bytes(g2, g)


ROWS = [(1, 1), (3, 5), (7, 17), (40, 33), (2000, 100), (130, 1024), (511, 256), (513, 256),
        (999, 255), (1000, 256)]               # D not a multiple of 16; both sides of SERIAL_BELOW


def _add_norm_inputs(n, d, dtype, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n, 1, d)) * 3 + 1).astype(dtype)
    z = rng.standard_normal((n, 1, d)).astype(dtype)
    gamma, beta = rng.standard_normal(d).astype(dtype), rng.standard_normal(d).astype(dtype)
    return x, z, gamma, beta


@pytest.mark.parametrize("n,d", ROWS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_add_layernorm_gives_the_bits_of_the_sum_then_layernorm_on_1_and_2_threads(n, d, dtype):
    x, z, gamma, beta = _add_norm_inputs(n, d, dtype, n * d)

    def run():
        s, _ = K.dropout_add_forward(x, z, 0.1, None, training=False)
        y, (xhat, rstd, _) = K.layernorm_forward(s, gamma, beta, 1e-5)
        y2, (xhat2, rstd2, gamma2) = K.add_layernorm_forward(x, z, gamma, beta, 1e-5)
        assert gamma2 is gamma
        return y, xhat, rstd, y2, xhat2, rstd2
    r = assert_same_bits_on_threads(run)
    for unfused, fused in zip(r[:3], r[3:]):
        assert_same_bytes(fused, unfused)


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_layernorm_serial_and_parallel_twins_each_give_the_unfused_bits(monkeypatch, dtype):
    """Forced serial, then forced parallel (the twin a shape chooses is the same for the fused
    kernel and the two it replaces): each twin gives its unfused pair's bits."""
    x, z, gamma, beta = _add_norm_inputs(37, 48, dtype, 3)
    for serial_below in (1 << 62, 0):
        monkeypatch.setattr(_jit, "SERIAL_BELOW", serial_below)
        s, _ = K.dropout_add_forward(x, z, 0.0, None, training=False)
        y, cache = K.layernorm_forward(s, gamma, beta, 1e-5)
        y2, cache2 = K.add_layernorm_forward(x, z, gamma, beta, 1e-5)
        assert_same_bytes(y2, y)
        dy = np.cos(y)
        for g2, g in zip(K.layernorm_backward(dy, cache2), K.layernorm_backward(dy, cache)):
            assert_same_bytes(g2, g)


def test_add_layernorm_rejects_mismatched_terms_and_parameters():
    x = np.zeros((2, 5), np.float32)
    with pytest.raises(ValueError, match=r"z: expected shape \(2, 5\) and dtype float32"):
        K.add_layernorm_forward(x, np.zeros((2, 4), np.float32), np.ones(5), np.zeros(5))
    with pytest.raises(ValueError, match=r"z: expected shape \(2, 5\) and dtype float32"):
        K.add_layernorm_forward(x, np.zeros((2, 5)), np.ones(5), np.zeros(5))
    with pytest.raises(ValueError, match="gamma, beta"):
        K.add_layernorm_forward(x, x, np.ones(4, np.float32), np.zeros(4, np.float32))


# The modules: eval mode takes the fusions, training never does; the bits are those of the
# same modules with the fusions switched off.

@pytest.fixture
def calls(monkeypatch):
    """How often the modules called each fused kernel (counted on the kernels namespace)."""
    counts = {"add_layernorm_forward": 0, "linear_relu_forward": 0}
    for name in counts:
        inner = getattr(K, name)

        def counted(*args, _name=name, _inner=inner):
            counts[_name] += 1
            return _inner(*args)
        monkeypatch.setattr(K, name, counted)
    before = backend.get_backend()
    backend.set_backend("numba")
    yield counts
    backend.set_backend(before)


def _unfused(monkeypatch):
    monkeypatch.setattr(FeedForward, "_relu_in_product", lambda self: False)
    monkeypatch.setattr(LayerNorm, "fuses_add", lambda self, x, y: False)


def _layer_run(kind, dtype, norm_first=False, training=False):
    """Forward then backward of a small layer (weights from a fixed seed): output, dx and
    the parameters' gradients."""
    rng = np.random.default_rng(0)
    xr = np.random.default_rng(1)
    if kind == "decoder":
        layer = DecoderLayer(32, 4, 64, dropout=0.1, norm_first=norm_first, rng=rng, dtype=dtype)
        x, memory = (xr.standard_normal((2, s, 32)).astype(dtype) for s in (3, 5))
        forward = lambda: layer.forward(x, memory)                         # noqa: E731
    else:
        layer = EncoderLayer(32, 4, 64, dropout=0.1, norm_first=norm_first, rng=rng, dtype=dtype)
        x = xr.standard_normal((2, 5, 32)).astype(dtype)
        forward = lambda: layer.forward(x)                                 # noqa: E731
    layer.train(training)
    layer.zero_grad()
    y = forward()
    dx = layer.backward(np.cos(y))
    dx = dx[0] if isinstance(dx, tuple) else dx
    return [y, dx] + [p.grad.copy() for p in layer.parameters()]


@pytest.mark.parametrize("kind", ["decoder", "encoder"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_post_norm_layers_in_eval_fuse_with_the_unfused_bits_and_a_backward_after(
        monkeypatch, calls, kind, dtype):
    fused = _layer_run(kind, dtype)
    n_norms = 3 if kind == "decoder" else 2
    assert calls == {"add_layernorm_forward": n_norms, "linear_relu_forward": 1}
    _unfused(monkeypatch)
    unfused = _layer_run(kind, dtype)
    assert calls == {"add_layernorm_forward": n_norms, "linear_relu_forward": 1}
    assert len(fused) == len(unfused)
    for f, u in zip(fused, unfused):
        assert_same_bytes(f, u)


@pytest.mark.parametrize("norm_first,training", [(False, True), (True, False), (True, True)])
def test_training_and_pre_norm_keep_the_unfused_calls(calls, norm_first, training):
    """Training (dropout on) never fuses; pre-norm has no norm after its sum (only the ReLU
    fuses there, in eval)."""
    _layer_run("decoder", np.float32, norm_first=norm_first, training=training)
    assert calls == {"add_layernorm_forward": 0, "linear_relu_forward": 0 if training else 1}


def test_the_relu_stays_apart_with_adapters_another_activation_or_a_gated_block(calls):
    rng = np.random.default_rng(0)
    ffn = FeedForward(16, 32, rng=rng).eval()
    ffn.forward(np.ones((2, 16), np.float32))
    assert calls["linear_relu_forward"] == 1
    ffn.linear1.adapters.append(object())                     # a LoRA update on linear1
    ffn._ops = K
    assert not ffn._relu_in_product()
    with pytest.raises(ValueError, match="relu_forward: expected a layer without adapters"):
        ffn.linear1.relu_forward(np.ones((2, 16), np.float32))
    gelu = FeedForward(16, 32, activation="gelu", rng=rng).eval()
    gelu.forward(np.ones((2, 16), np.float32))
    reglu = GatedFeedForward(16, 32, activation="relu", rng=rng).eval()    # relu(gate) * up
    reglu.forward(np.ones((2, 16), np.float32))
    assert calls["linear_relu_forward"] == 1
