"""Work the decoder state skips. It encodes its sources in groups of equal length, each at its
own width (no padding in the encoder's products): the memory is the padded batch's at the real
positions (to the last bits of other product shapes), zero at the masked ones, and a batch of
mixed lengths decodes each source as it decodes alone. A beam search's first step ranks one row
per source and offset: the same bits as ranking the repeated rows."""
import numpy as np
import npformer as nf
from npformer.backend import ops
from npformer.decoding.search import greedy_search
from npformer.nn.transformer import _encode_by_length

V_SRC, V_TGT = 13, 11


def make_model(dtype):
    return nf.Transformer(V_SRC, V_TGT, d_model=16, n_heads=4, d_ff=24, n_encoder_layers=2,
                          n_decoder_layers=2, dropout=0.1, max_len=24, dtype=dtype, seed=3).eval()


def mixed_sources(rng, lengths, width):
    src = rng.integers(4, V_SRC, size=(len(lengths), width))
    for row, n in zip(src, lengths):
        row[n:] = 0
    return src


def test_memory_by_length_is_the_padded_batchs_at_the_real_positions(backend):
    model = make_model(np.float64)
    lengths = [5, 2, 7, 2, 5, 1]
    src = mixed_sources(np.random.default_rng(0), lengths, 7)
    src[5, 0] = 0                                   # a row of padding alone: width 1, all masked
    with model.evaluating():
        padded, mask = model._encode(src)
        memory, by_length_mask = _encode_by_length(model, src)
    np.testing.assert_array_equal(by_length_mask, mask)
    for row, n in enumerate(lengths):
        np.testing.assert_allclose(memory[row, :n], padded[row, :n], rtol=1e-12, atol=1e-12)
        assert not memory[row, n:].any()
    with model.evaluating():                          # one width: exactly the padded batch
        np.testing.assert_array_equal(_encode_by_length(model, src[[0, 4], :5])[0],
                                      model._encode(src[[0, 4], :5])[0])


def test_a_batch_of_mixed_lengths_decodes_each_source_as_alone():
    model = make_model(np.float32)
    lengths = [6, 3, 1, 6, 4]
    src = mixed_sources(np.random.default_rng(1), lengths, 6)
    batch = greedy_search(model.decoder_state(src, bos_id=1, eos_id=2), max_new_tokens=8)
    for row, n in enumerate(lengths):
        alone = greedy_search(model.decoder_state(src[row:row + 1, :n], bos_id=1, eos_id=2),
                              max_new_tokens=8)[0]
        assert batch[row].ids == alone.ids
        np.testing.assert_allclose(batch[row].probs, alone.probs, rtol=1e-4, atol=1e-6)


def test_a_shared_first_step_ranks_as_the_repeated_rows(backend):
    model = make_model(np.float32)
    src = mixed_sources(np.random.default_rng(2), [4, 2, 3], 4)
    beams = 3
    offsets = [None, np.tile([0.0, -np.inf, -np.inf], 3), np.array([0.0, -1.5, -1.5] * 3)]
    for offset in offsets:
        state = model.decoder_state(src, bos_id=1, eos_id=2, beams=beams)
        ids, logp = state.step_top(state.first_tokens(), 4, offset)
        again = model.decoder_state(src, bos_id=1, eos_id=2, beams=beams)
        want_ids, want_logp = ops().top_log_softmax(again._logits(again.first_tokens()), 4,
                                                    offset)
        np.testing.assert_array_equal(ids, want_ids)
        np.testing.assert_array_equal(logp, want_logp)
        assert state.batch_size == again.batch_size == 9 and state.length == again.length == 1
