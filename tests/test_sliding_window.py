"""Sliding-window attention (``GPTConfig.sliding_window``, Mistral's; per layer with
``sliding_window_pattern``, Gemma 2's): the mask's convention (transformers': a query at p sees
keys k with p - k < window), its gradient checked in float64 by central differences, the forward
blind to keys outside the window, and cached decoding equal to the forward past the window on
both backends. Held against transformers in tests/test_mistral_hf.py."""
import numpy as np
import pytest

import npformer as nf
from npformer import functional as F
from npformer.nn import MultiHeadAttention
from test_gradcheck_layers import f64_rng, module_check


def tiny(**changes):
    fields = dict(vocab_size=11, d_model=8, n_heads=2, d_ff=12, n_layers=2, max_len=16,
                  dropout=0.0, positions="rotary", norm="rmsnorm", ffn="gated",
                  activation="silu", n_kv_heads=1, sliding_window=3, dtype="float64", seed=1)
    return nf.GPT(nf.GPTConfig(**{**fields, **changes})).eval()


def test_the_mask_keeps_the_last_window_keys_itself_included():
    mask = F.causal_mask(5, window=2)[0, 0]
    p, k = np.indices((5, 5))
    np.testing.assert_array_equal(mask, (k <= p) & (k > p - 2))      # transformers' overlay
    assert mask.sum(1).tolist() == [1, 2, 2, 2, 2]
    cached = F.causal_mask(2, start=4, window=3)[0, 0]               # positions 4, 5 over 6 keys
    assert cached.tolist() == [[False, False, True, True, True, False],
                               [False, False, False, True, True, True]]
    np.testing.assert_array_equal(F.causal_mask(4, 2, window=None), F.causal_mask(4, 2))
    np.testing.assert_array_equal(F.causal_mask(4, window=4), F.causal_mask(4))   # no effect


@pytest.mark.parametrize("n_kv_heads,rotary", [(2, True), (1, False)])
def test_attention_with_a_sliding_window_passes_the_gradient_check(n_kv_heads, rotary):
    """Every entry of dx and of the projections' gradients, float64, central differences; the
    window (2) is shorter than the sequence (5) and combined with a padding mask."""
    tables = F.rotary_tables(5, 2, np.float64) if rotary else None
    mha = MultiHeadAttention(8, 4, qk_dim=8, v_dim=8, n_kv_heads=n_kv_heads, rotary=tables,
                             window=2, **f64_rng(0))
    mask = F.decoder_self_mask(np.array([[1, 2, 3, 4, 0], [1, 1, 1, 1, 1]]), 0)
    module_check(mha, lambda x: mha.forward(x, mask=mask), mha.backward,
                 [np.random.default_rng(7).standard_normal((2, 5, 8))])
    assert not mha.attn_weights[:, :, 4, :3].any()                 # outside the window: 0


def test_a_position_does_not_see_keys_outside_its_window(backend):
    model = tiny(n_layers=1)
    ids = np.array([[1, 2, 3, 4, 5, 6, 7]])
    changed = ids.copy()
    changed[0, 0] = 9
    a, b = model.forward(ids), model.forward(changed)
    np.testing.assert_array_equal(a[:, 3:], b[:, 3:])               # window 3: positions 3..
    assert not np.allclose(a[:, :3], b[:, :3])
    full = tiny(n_layers=1, sliding_window=None)
    assert not np.allclose(full.forward(changed)[:, 3:], b[:, 3:])  # the window matters


@pytest.mark.parametrize("pattern", [None, 2])
@pytest.mark.parametrize("prompt_len", [1, 5])
def test_cached_steps_equal_the_forward_past_the_window(backend, pattern, prompt_len):
    model = tiny(sliding_window_pattern=pattern)
    ids = np.random.default_rng(3).integers(0, 11, size=(2, 12))
    full = model.forward(ids)
    expected = full - np.log(np.exp(full).sum(-1, keepdims=True))
    state = model.decoder_state(ids[:, :prompt_len])
    logp = [state.step(ids[:, t]) for t in range(prompt_len - 1, 12)]
    np.testing.assert_allclose(np.stack(logp, 1), expected[:, prompt_len - 1:], atol=1e-12)


def test_the_pattern_chooses_which_layers_slide():
    config = tiny(n_layers=4, sliding_window_pattern=2).config
    assert [config.layer_window(i) for i in range(4)] == [3, None, 3, None]
    assert [b.self_attn.window for b in tiny(n_layers=4, sliding_window_pattern=2).blocks] == \
        [3, None, 3, None]
    assert [b.self_attn.window for b in tiny(n_layers=2).blocks] == [3, 3]
    assert [b.self_attn.window for b in tiny(sliding_window=None).blocks] == [None, None]


@pytest.mark.parametrize("changes,match", [
    (dict(sliding_window=0), "sliding_window: expected a positive integer, got 0"),
    (dict(sliding_window=2.5), "sliding_window: expected a positive integer"),
    (dict(sliding_window=True), "sliding_window: expected a positive integer"),
    (dict(sliding_window_pattern=1), "sliding_window_pattern: expected an integer >= 2"),
    (dict(sliding_window=None, sliding_window_pattern=2),
     "sliding_window_pattern: .*sliding_window is None"),
])
def test_a_bad_window_is_refused_naming_the_field(changes, match):
    with pytest.raises(ValueError, match=match):
        tiny(**changes)


def test_the_window_round_trips_through_the_stored_configuration():
    config = tiny(sliding_window_pattern=2).config
    assert nf.GPTConfig.from_dict(config.to_dict()) == config
    old = {k: v for k, v in config.to_dict().items() if not k.startswith("sliding")}
    assert nf.GPTConfig.from_dict(old).sliding_window is None      # stored before: full
