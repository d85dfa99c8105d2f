"""npformer.backend: switching, the environment variable, the contract of the two namespaces
(the same names, each backward taking (dout, cache)), and whole-model agreement of the NumPy
and Numba paths (gradients, gradient checks)."""
import inspect
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import npformer as nf
from npformer import backend, runtime

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def restore_backend():
    previous = backend.get_backend()
    yield
    backend.set_backend(previous)


def tiny_model(dropout=0.0, norm_first=False, dtype=np.float64):
    return nf.Transformer(src_vocab_size=13, tgt_vocab_size=11, d_model=8, n_heads=2, d_ff=12,
                          n_encoder_layers=2, n_decoder_layers=2, dropout=dropout, max_len=10,
                          norm_first=norm_first, dtype=dtype, seed=5)


def batch():
    rng = np.random.default_rng(2)
    src, tgt = rng.integers(1, 13, size=(3, 6)), rng.integers(1, 11, size=(3, 6))
    src[1, 4:] = 0
    tgt[2, 3:] = 0
    return src, tgt[:, :-1], tgt[:, 1:]


def gradients(name, dropout, norm_first):
    backend.set_backend(name)
    model = tiny_model(dropout, norm_first)
    src, tgt_in, tgt_out = batch()
    logits = model.forward(src, tgt_in)
    loss, dlogits = nf.cross_entropy(logits, tgt_out, ignore_index=0, label_smoothing=0.1)
    model.zero_grad()
    model.backward(dlogits)
    return loss, logits, model.flat_grads.copy()


def test_set_and_get(restore_backend):
    assert backend.set_backend("numpy") == "numpy"
    assert backend.get_backend() == "numpy" and backend.ops().module is nf.functional
    backend.set_backend("numba")
    assert backend.get_backend() == "numba" and backend.ops().__name__ == "npformer.kernels"


def test_unknown_backend_is_rejected(restore_backend):
    with pytest.raises(ValueError, match="set_backend"):
        backend.set_backend("cuda")
    with pytest.raises(ValueError, match="load"):
        backend.load("torch")


@pytest.mark.parametrize("value,expected", [("numpy", "numpy"), ("numba", "numba"), (None, "numba")])
def test_environment_variable_sets_the_start(value, expected):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("NPFORMER_BACKEND", None)
    if value is not None:
        env["NPFORMER_BACKEND"] = value
    code = "from npformer import backend; print(backend.get_backend())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == expected


def test_bad_environment_variable_is_an_error():
    env = dict(os.environ, PYTHONPATH=str(ROOT), NPFORMER_BACKEND="fortran")
    code = "from npformer import backend; backend.get_backend()"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode != 0 and "NPFORMER_BACKEND" in out.stderr


@pytest.mark.parametrize("dropout", [0.0, 0.3])
@pytest.mark.parametrize("norm_first", [False, True])
def test_whole_model_gradients_agree_between_backends(restore_backend, dropout, norm_first):
    """Dropout draws from the model's rng identically on both paths, so even with dropout
    the two backends compute the same function."""
    loss_np, logits_np, g_np = gradients("numpy", dropout, norm_first)
    loss_nb, logits_nb, g_nb = gradients("numba", dropout, norm_first)
    assert abs(loss_np - loss_nb) <= 1e-12
    np.testing.assert_allclose(logits_nb, logits_np, rtol=0, atol=1e-12)
    np.testing.assert_allclose(g_nb, g_np, rtol=0, atol=1e-9 * np.abs(g_np).max())


def test_backward_uses_the_backend_that_ran_forward(restore_backend):
    _, _, g_ref = gradients("numpy", 0.0, False)
    backend.set_backend("numba")
    model = tiny_model()
    src, tgt_in, tgt_out = batch()
    logits = model.forward(src, tgt_in)
    _, dlogits = nf.cross_entropy(logits, tgt_out, ignore_index=0, label_smoothing=0.1)
    backend.set_backend("numpy")                              # switched between forward and backward
    model.zero_grad()
    model.backward(dlogits)
    np.testing.assert_allclose(model.flat_grads, g_ref, rtol=0, atol=1e-9 * np.abs(g_ref).max())


def gradcheck_whole_model(model, src, tgt_in, max_entries=150):
    """Central differences over the model's flat parameter buffer (a sample of entries), the
    logits as the output, on the active backend."""
    def f(params):
        model.flat_params[...] = params
        logits = model.forward(src, tgt_in)

        def backward(dlogits):
            model.zero_grad()
            model.backward(dlogits)
            return model.flat_grads.copy()
        return logits, backward
    return nf.gradcheck(f, [model.flat_params.copy()], max_entries=max_entries,
                        names=["all parameters"])


def test_gradcheck_whole_tiny_model_on_numba(restore_backend):
    """No padding here: the <pad> embedding row gets no gradient by design (as torch's
    padding_idx), so a gradient check would flag it. Padding is covered by the agreement test."""
    backend.set_backend("numba")
    rng = np.random.default_rng(4)
    src, tgt_in = rng.integers(1, 13, size=(2, 5)), rng.integers(1, 11, size=(2, 4))
    result = gradcheck_whole_model(tiny_model(), src, tgt_in)
    assert result.ok, result


def wide_heads_model():
    """d_head = 32: every product of attention and of the linear layers is one the register-
    blocked kernel is offered for (N >= 32). GELU, not ReLU: with 96 hidden units some ReLU
    input lies within the gradient check's step of its kink, where central differences are
    wrong on either backend (measured: 1.5e-3 on the NumPy reference too)."""
    return nf.Transformer(src_vocab_size=13, tgt_vocab_size=40, d_model=64, n_heads=2, d_ff=96,
                          n_encoder_layers=1, n_decoder_layers=1, dropout=0.0, max_len=10,
                          activation="gelu", dtype=np.float64, seed=6)


def test_wide_heads_through_the_blocked_kernel_agree_and_gradcheck(restore_backend,
                                                                   dispatcher_prefers):
    """The whole model with every offered product forced onto numba-blocked: the same loss,
    logits and gradients as the NumPy backend, and a central-difference check in float64."""
    src, tgt_in, tgt_out = batch()
    results = []
    for name in ("numpy", "numba"):
        backend.set_backend(name)
        if name == "numba":
            dispatcher_prefers("numba-blocked")
        model = wide_heads_model()
        logits = model.forward(src, tgt_in)
        loss, dlogits = nf.cross_entropy(logits, tgt_out, ignore_index=0, label_smoothing=0.1)
        model.zero_grad()
        model.backward(dlogits)
        results.append((loss, logits, model.flat_grads.copy()))
    assert list(runtime.choices().values()).count("numba-blocked") >= 8   # forced, and it ran
    (loss_np, logits_np, g_np), (loss_nb, logits_nb, g_nb) = results
    assert abs(loss_np - loss_nb) <= 1e-12
    np.testing.assert_allclose(logits_nb, logits_np, rtol=0, atol=1e-12)
    np.testing.assert_allclose(g_nb, g_np, rtol=0, atol=1e-9 * np.abs(g_np).max())

    rng = np.random.default_rng(7)
    src, tgt_in = rng.integers(1, 13, size=(2, 5)), rng.integers(1, 40, size=(2, 4))
    result = gradcheck_whole_model(model, src, tgt_in)
    assert result.ok, result


# The backend contract: the kernels namespace has every name of the functional core, its own
# twins where they pay and the reference's function for every other name.

KERNEL_EXTRAS = {"adam_step", "attention_step", "embedding_backward_into",   # no reference
                 "matmul", "add_layernorm_forward", "linear_relu_forward",  # of the same name
                 "reads_grouped_kv", "top_log_softmax_bounded"}


def test_the_kernels_namespace_has_the_functional_names_and_only_the_declared_extras():
    functional, kernels = backend.load("numpy"), backend.load("numba")
    assert set(kernels.__all__) == set(functional.__all__) | KERNEL_EXTRAS
    own = {name for name, value in vars(kernels).items()
           if callable(value) and not name.startswith("_")
           and getattr(value, "__module__", "").startswith("npformer.kernels.")}
    assert "attention_forward" in own and "take_rows" in own           # the twins are found
    assert own <= set(functional.__all__) | KERNEL_EXTRAS, \
        f"kernels whose name the functional core lacks: {sorted(own - set(functional.__all__))}"
    for name in functional.__all__:
        value = getattr(kernels, name)
        if name not in own:                                  # not overridden: the reference's
            assert value is getattr(functional, name), name


def test_a_name_only_the_functional_core_defines_reaches_the_numba_backend(monkeypatch,
                                                                          restore_backend):
    def double_forward(x):
        return 2 * x, None

    functional = backend.load("numpy")
    monkeypatch.setattr(functional, "double_forward", double_forward, raising=False)
    monkeypatch.setattr(functional, "__all__", [*functional.__all__, "double_forward"])
    assert backend.load("numba").double_forward is double_forward
    backend.set_backend("numba")
    assert backend.ops().double_forward(np.ones(2))[0].tolist() == [2.0, 2.0]
    assert "double_forward" in dir(backend.ops())
    with pytest.raises(AttributeError, match="no attribute 'triple_forward'"):
        backend.ops().triple_forward


@pytest.mark.parametrize("name", ["numpy", "numba"])
def test_every_backward_takes_dout_and_cache(name):
    """One name per thing: each backward's first two parameters are (dout, cache), in both
    backends (a caller may pass them by name)."""
    namespace = backend.load(name)
    backwards = [f for f in namespace.__all__ if "_backward" in f]    # _into, _accumulate too
    assert len(backwards) >= 15
    first_two = {f: list(inspect.signature(getattr(namespace, f)).parameters)[:2]
                 for f in backwards}
    assert {f: p for f, p in first_two.items() if p != ["dout", "cache"]} == {}


def test_the_functional_core_holds_layers_not_the_decoding_cache_or_configuration_rules():
    """The row movers of the decoding cache and the inner dropout rates' rule live in their own
    modules; their old import paths still give the same objects."""
    import npformer.dropout_rates
    import npformer.functional.attention
    import npformer.functional.dropout
    import npformer.nn.attention
    import npformer.nn.kv_cache
    functional, kernels = backend.load("numpy"), backend.load("numba")
    for name in ("take_rows", "move_rows"):
        assert not hasattr(npformer.functional.attention, name)
        assert getattr(functional, name).__module__ == "npformer.functional.kv_cache"
        assert getattr(kernels, name).__module__ == "npformer.kernels.kv_cache"
    assert npformer.nn.attention.KVCache is npformer.nn.kv_cache.KVCache
    assert not hasattr(npformer.functional.dropout, "inner_dropout_rates")   # a config rule
    assert npformer.dropout_rates.inner_dropout_rates(0.1, None, 0.0) == (0.1, 0.0)
