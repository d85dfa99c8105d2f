"""Hypothesis property tests: padding invariance, causality, attention normalisation, no NaN from
fully masked rows."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import npformer as nf
from npformer import functional as F

PAD = 0
SETTINGS = settings(max_examples=25, deadline=None)


def make_model(norm_first, seed=0):
    return nf.Transformer(src_vocab_size=13, tgt_vocab_size=11, d_model=16, n_heads=4, d_ff=24,
                          n_encoder_layers=2, n_decoder_layers=2, dropout=0.0, max_len=40,
                          pad_id=PAD, norm_first=norm_first, dtype=np.float64, seed=seed)


@st.composite
def padded_batches(draw):
    """A batch of real (non-pad) tokens with per-row lengths, padded to the longest row."""
    b = draw(st.integers(1, 4))
    src_len = draw(st.lists(st.integers(1, 8), min_size=b, max_size=b))
    tgt_len = draw(st.lists(st.integers(1, 8), min_size=b, max_size=b))
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    src = np.zeros((b, max(src_len)), dtype=np.int64)
    tgt_in = np.zeros((b, max(tgt_len)), dtype=np.int64)
    tgt_out = np.zeros_like(tgt_in)
    for i in range(b):
        src[i, :src_len[i]] = rng.integers(1, 13, src_len[i])
        tgt_in[i, :tgt_len[i]] = rng.integers(1, 11, tgt_len[i])
        tgt_out[i, :tgt_len[i]] = rng.integers(1, 11, tgt_len[i])
    return src, tgt_in, tgt_out, tgt_len


@SETTINGS
@given(batch=padded_batches(), extra_src=st.integers(1, 5), extra_tgt=st.integers(1, 5),
       norm_first=st.booleans(), smoothing=st.sampled_from([0.0, 0.1]))
def test_appending_padding_changes_neither_real_outputs_nor_loss(batch, extra_src, extra_tgt,
                                                                 norm_first, smoothing):
    src, tgt_in, tgt_out, tgt_len = batch
    model = make_model(norm_first)
    logits = model.forward(src, tgt_in)
    loss, _ = nf.cross_entropy(logits, tgt_out, ignore_index=PAD, label_smoothing=smoothing)

    pad = lambda a, n: np.pad(a, ((0, 0), (0, n)), constant_values=PAD)   # noqa: E731
    logits2 = model.forward(pad(src, extra_src), pad(tgt_in, extra_tgt))
    loss2, _ = nf.cross_entropy(logits2, pad(tgt_out, extra_tgt), ignore_index=PAD,
                                label_smoothing=smoothing)
    for i, n in enumerate(tgt_len):
        np.testing.assert_allclose(logits2[i, :n], logits[i, :n], rtol=1e-10, atol=1e-10)
    assert abs(loss2 - loss) <= 1e-10 * max(1.0, abs(loss))


@SETTINGS
@given(batch=padded_batches(), data=st.data())
def test_a_future_target_token_changes_no_earlier_logit(batch, data):
    src, tgt_in, _, tgt_len = batch
    t = tgt_in.shape[1]
    pos = data.draw(st.integers(0, t - 1))
    model = make_model(norm_first=data.draw(st.booleans()))
    logits = model.forward(src, tgt_in)
    changed = tgt_in.copy()
    changed[:, pos] = (changed[:, pos] % 10) + 1                # a different real token
    logits2 = model.forward(src, changed)
    np.testing.assert_array_equal(logits2[:, :pos], logits[:, :pos])
    assert not np.allclose(logits2[:, pos:], logits[:, pos:])


@st.composite
def masked_scores(draw):
    b, h, tq, tk = (draw(st.integers(1, 3)) for _ in range(4))
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    mask = rng.random((b, 1, tq, tk)) < draw(st.floats(0.0, 1.0))
    return rng.standard_normal((b, h, tq, tk)) * 10, mask


@SETTINGS
@given(masked_scores())
def test_attention_weights_sum_to_one_over_unmasked_keys(case):
    scores, mask = case
    p, _ = F.softmax_forward(scores, mask)
    full_mask = np.broadcast_to(mask, p.shape)
    assert np.all(p[~full_mask] == 0)                            # exactly zero, no leak
    row_sums = p.sum(-1)
    has_key = full_mask.any(-1)
    np.testing.assert_allclose(row_sums[has_key], 1.0, rtol=1e-12)
    assert np.all(row_sums[~has_key] == 0)                        # fully masked rows: zeros


@SETTINGS
@given(st.integers(1, 3), st.integers(1, 4), st.integers(1, 5), st.integers(1, 5),
       st.sampled_from([np.float32, np.float64]))
def test_fully_masked_rows_give_zeros_not_nan_forward_and_backward(b, h, tq, tk, dtype):
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((b, h, n, 4)).astype(dtype) for n in (tq, tk, tk))
    mask = np.zeros((b, 1, tq, tk), dtype=bool)
    mask[0, 0, 0, 0] = True                                       # every other row fully masked
    out, cache = F.attention_forward(q, k, v, mask)
    grads = F.attention_backward(np.ones_like(out), cache)
    assert all(np.all(np.isfinite(a)) for a in (out, *grads))
    assert np.all(out[0, :, 1:] == 0) and np.all(out[1:] == 0)
    assert out.dtype == dtype


@SETTINGS
@given(st.integers(1, 4), st.integers(1, 12), st.integers(2, 30),
       st.sampled_from([0.0, 0.1, 0.3]), st.integers(0, 2**16))
def test_cross_entropy_gradient_rows_sum_to_zero(b, t, v, smoothing, seed):
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((b, t, v))
    targets = rng.integers(0, v, (b, t))
    loss, d = nf.cross_entropy(logits, targets, ignore_index=0, label_smoothing=smoothing)
    assert np.isfinite(loss)
    np.testing.assert_allclose(d.sum(-1), 0.0, atol=1e-12)       # softmax - q sums to 0 per row
    assert np.all(d[targets == 0] == 0)                          # ignored rows get no gradient
