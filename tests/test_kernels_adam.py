"""The fused Adam/AdamW kernel against the reference update of npformer.optim (NumPy backend)."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import npformer as nf
from npformer import backend

K = backend.load("numba")


def tiny_model(dtype, seed=0):
    return nf.Transformer(src_vocab_size=11, tgt_vocab_size=9, d_model=8, n_heads=2, d_ff=12,
                          n_encoder_layers=1, n_decoder_layers=1, dropout=0.0, max_len=8,
                          dtype=dtype, seed=seed)


def run_steps(name, dtype, opt_name, weight_decay, steps, grads):
    backend.set_backend(name)
    model = tiny_model(dtype)
    opt = getattr(nf, opt_name)(model, lr=3e-3, betas=(0.9, 0.98), eps=1e-9,
                                weight_decay=weight_decay)
    for g in grads[:steps]:
        model.flat_grads[...] = g
        opt.step()
    return model.flat_params.copy(), opt.exp_avg.copy(), opt.exp_avg_sq.copy()


@settings(deadline=None, max_examples=12)
@given(opt_name=st.sampled_from(["Adam", "AdamW"]), weight_decay=st.sampled_from([0.0, 0.01]),
       dtype=st.sampled_from([np.float32, np.float64]), steps=st.integers(1, 5),
       seed=st.integers(0, 2**16))
def test_fused_step_matches_reference(opt_name, weight_decay, dtype, steps, seed):
    size = tiny_model(dtype).flat_params.size
    rng = np.random.default_rng(seed)
    grads = [rng.standard_normal(size).astype(dtype) for _ in range(steps)]
    previous = backend.get_backend()
    try:
        ref = run_steps("numpy", dtype, opt_name, weight_decay, steps, grads)
        ker = run_steps("numba", dtype, opt_name, weight_decay, steps, grads)
    finally:
        backend.set_backend(previous)
    tol = 1e-13 if dtype == np.float64 else 2e-6
    for a, b in zip(ker, ref):
        np.testing.assert_allclose(a, b, rtol=0, atol=tol * max(1.0, np.abs(b).max()))


def test_adam_step_rejects_mismatched_buffers():
    p = np.zeros(4)
    with pytest.raises(ValueError, match="adam_step"):
        K.adam_step(p, np.zeros(3), np.zeros(4), np.zeros(4), 1, 1e-3, 0.9, 0.999, 1e-8, 0.0, False)
    with pytest.raises(ValueError, match="step"):
        K.adam_step(p, p.copy(), p.copy(), p.copy(), 0, 1e-3, 0.9, 0.999, 1e-8, 0.0, False)
