"""The decoder-only GPT: configuration and registry, whole-model gradient checks in float64 on both
backends, causality, KV-cached generation equal to uncached, sampling, checkpoints with bit-exact
resume, bad input. (Parity with Hugging Face's GPT-2: tests/test_gpt_hf.py.)"""
import numpy as np
import pytest

import npformer as nf
from npformer.decoding import greedy_search, sample_search
from npformer.nn.gpt import LanguageModelState
from npformer.registry import build_model, config_from_dict
from npformer.training.checkpointing import (load_model_checkpoint, restore_training_state,
                                             save_model_checkpoint)

V = 11


def tiny(dtype=np.float64, **kw):
    cfg = dict(vocab_size=V, d_model=8, n_heads=2, d_ff=12, n_layers=2, max_len=12, dropout=0.0,
               dtype=dtype, seed=1)
    cfg.update(kw)
    return nf.GPT(**cfg)


def ids_batch(seed=0, b=3, t=7):
    return np.random.default_rng(seed).integers(0, V, size=(b, t))


# -- configuration ------------------------------------------------------------------------------
@pytest.mark.parametrize("positions", ["learned", "sinusoidal", "rotary"])
@pytest.mark.parametrize("tie", [True, False])
def test_config_lists_the_models_parameters_in_order(positions, tie):
    model = tiny(positions=positions, tie_embeddings=tie)
    shapes = model.config.parameter_shapes()
    assert list(shapes) == [name for name, _ in model.named_parameters()]
    assert all(shapes[n] == p.shape for n, p in model.named_parameters())
    assert (model.generator.weight is model.tok_embed.weight) == tie
    assert model.generator.bias is None                       # GPT-2's lm_head has no bias
    assert ("pos_embed.weight" in shapes) == (positions == "learned")
    sinusoidal = nf.TransformerConfig(5, 5, d_model=8, n_heads=2, max_len=12, dtype="float64")
    rotary = {"rotary tables": (12 * 4 * 8, "max_len=12 needs 384 bytes of rotary tables "
                                            "(max_len x head size x 8)")}
    assert model.config.derived_arrays() == {"learned": {}, "rotary": rotary,
                                             "sinusoidal": sinusoidal.derived_arrays()}[positions]


def test_config_defaults_are_gpt2_small_and_round_trip_through_the_registry():
    cfg = nf.GPTConfig(vocab_size=50257)
    assert (cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.n_layers, cfg.max_len) == (768, 12, 3072, 12, 1024)
    assert (cfg.activation, cfg.norm_first, cfg.positions, cfg.tie_embeddings) == \
        ("gelu_tanh", True, "learned", True)
    assert (cfg.dropout, cfg.attention_dropout, cfg.activation_dropout) == (0.1, 0.1, 0.0)
    n = sum(int(np.prod(s)) for s in cfg.parameter_shapes().values())
    assert n == 124_439_808                                   # GPT-2 small's count
    small = nf.GPTConfig(vocab_size=V, d_model=8, n_heads=2, d_ff=12, n_layers=1, max_len=5)
    assert config_from_dict(small.to_dict()) == small
    assert isinstance(build_model(small), nf.GPT)


@pytest.mark.parametrize("learned,positions", [(True, "learned"), (False, "sinusoidal")])
def test_a_config_stored_before_positions_existed_reads_its_flag(learned, positions):
    stored = dict(tiny().config.to_dict(), learned_positions=learned)
    del stored["positions"]
    assert config_from_dict(stored) == tiny().config.replace(positions=positions)
    with pytest.raises(ValueError, match="learned_positions: expected True or False, got .yes."):
        config_from_dict(dict(stored, learned_positions="yes"))


@pytest.mark.parametrize("kw,match", [
    (dict(d_model=10, n_heads=4), "d_model: expected a multiple of n_heads=4"),
    (dict(activation="swish"), "activation: expected one of"),
    (dict(vocab_size=0), "vocab_size"),
    (dict(dropout=1.0), "dropout"),
    (dict(positions="alibi"), "positions: expected one of learned, sinusoidal, rotary, got 'alibi'"),
    (dict(positions="rotary", d_model=6, n_heads=2), "positions: 'rotary' turns pairs of dimensions, "
                                                     "so expected an even head size"),
    (dict(tie_embeddings="yes"), "tie_embeddings"),
])
def test_bad_configuration_is_a_clear_error(kw, match):
    with pytest.raises(ValueError, match=match):
        tiny(**kw)


# -- gradients -------------------------------------------------------------------------------
def gpt_gradcheck(model, ids, max_entries=10):
    """GPT-2's initial weights (std 0.02) leave the loss nearly flat, and central differences
    of a flat function are mostly round-off: the check runs on weights of order one."""
    names, arrays = zip(*model.named_parameters())
    rng = np.random.default_rng(9)
    for name, p in model.named_parameters():
        p.data[...] = (1.0 if name.endswith("norm1.weight") or name.endswith("norm2.weight")
                       or name.endswith("norm.weight") else 0.0) + 0.5 * rng.standard_normal(p.shape)
    rng_state = model.rng.bit_generator.state

    def f(*_):
        model.rng.bit_generator.state = rng_state              # the same dropout masks every call
        logits = model.forward(ids)
        loss, dlogits = nf.cross_entropy(logits[:, :-1], ids[:, 1:])

        def backward(dloss):
            model.zero_grad()
            full = np.zeros_like(logits)
            full[:, :-1] = dlogits * dloss
            model.backward(full)
            return tuple(p.grad.copy() for p in arrays)
        return np.array(loss), backward

    result = nf.gradcheck(f, [p.data for p in arrays], max_entries=max_entries,
                          names=list(names))
    assert result.ok, str(result)
    assert all(e is not None for e in result.errors)           # every parameter was checked
    return result


@pytest.mark.parametrize("positions,tie", [("learned", True), ("sinusoidal", False),
                                           ("rotary", True)])
def test_whole_model_gradient(backend, positions, tie):
    gpt_gradcheck(tiny(positions=positions, tie_embeddings=tie), ids_batch())


def test_whole_model_gradient_with_dropout_post_norm_and_exact_gelu(backend):
    model = tiny(dropout=0.2, attention_dropout=0.1, activation_dropout=0.1, norm_first=False,
                 activation="gelu").train()
    gpt_gradcheck(model, ids_batch(1))


def test_backends_agree_on_logits_and_gradients():
    ids = ids_batch(2)
    grads, logits = {}, {}
    for name in ("numba", "numpy"):
        nf.set_backend(name)
        model = tiny(dropout=0.1).train()
        logits[name] = model.forward(ids)
        model.backward(np.ones_like(logits[name]) / logits[name].size)
        grads[name] = model.flat_grads.copy()
    nf.set_backend("numba")
    np.testing.assert_allclose(logits["numba"], logits["numpy"], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(grads["numba"], grads["numpy"], rtol=1e-10, atol=1e-12)


def test_causal_mask_over_cached_positions():
    """Two new queries at positions 3 and 4 over 5 keys: the first sees keys 0..3."""
    from npformer import functional as F
    np.testing.assert_array_equal(F.causal_mask(2, start=3)[0, 0], [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    np.testing.assert_array_equal(F.causal_mask(4), F.causal_mask(4, start=0))


def test_a_position_sees_only_itself_and_earlier_ones(backend):
    model = tiny().eval()
    ids = ids_batch(3)
    before = model.forward(ids)
    changed = ids.copy()
    changed[:, 4:] = (changed[:, 4:] + 1) % V
    after = model.forward(changed)
    np.testing.assert_array_equal(after[:, :4], before[:, :4])
    assert np.abs(after[:, 4:] - before[:, 4:]).max() > 1e-6


def test_a_gpt_cannot_translate():
    from npformer.decoding import Translator
    from npformer.data.vocab import Vocab, Vocabularies
    vocab = Vocab(list(Vocab.SPECIALS) + list("abcdefg"))
    with pytest.raises(ValueError, match="translation needs an encoder-decoder .*'gpt'"):
        Translator(tiny(), Vocabularies.joint(vocab))


def test_backward_needs_one_forward_each_time():
    model = tiny()
    with pytest.raises(ValueError, match="call forward first"):
        model.backward(np.zeros((1, 2, V)))
    logits = model.forward(ids_batch())
    model.backward(np.zeros_like(logits))
    with pytest.raises(ValueError, match="already called"):
        model.backward(np.zeros_like(logits))


# -- generation ------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float32, 2e-5)])
@pytest.mark.parametrize("prompt_len,positions", [(1, "learned"), (4, "sinusoidal"),
                                                  (1, "rotary"), (4, "rotary")])
def test_kv_cached_steps_equal_forward_over_the_whole_sequence(backend, dtype, tol, prompt_len,
                                                               positions):
    model = tiny(dtype=dtype, positions=positions)
    ids = ids_batch(4, t=9)
    full = model.forward(ids).astype(np.float64)
    expected = full - np.log(np.exp(full).sum(-1, keepdims=True))          # log-softmax
    state = model.decoder_state(ids[:, :prompt_len])
    assert state.length == prompt_len - 1                                  # prefilled
    np.testing.assert_array_equal(state.first_tokens(), ids[:, prompt_len - 1])
    logp = [state.step(ids[:, t]) for t in range(prompt_len - 1, 9)]
    np.testing.assert_allclose(np.stack(logp, 1), expected[:, prompt_len - 1:], rtol=tol, atol=tol)


def test_greedy_generation_equals_uncached_argmax_decoding(backend):
    model = tiny(max_len=16)
    prompt = ids_batch(5, b=2, t=3)
    hyps = greedy_search(model.decoder_state(prompt), max_new_tokens=8)
    for row, hyp in enumerate(hyps):
        seq = list(prompt[row])
        for _ in range(8):                       # no cache: the whole sequence every time
            seq.append(int(model.forward(np.array([seq]))[0, -1].argmax()))
        assert hyp.ids == seq[3:]


def test_generation_stops_at_eos_and_respects_the_context():
    model = tiny(max_len=6)
    prompt = ids_batch(6, b=1, t=4)
    state = model.decoder_state(prompt)
    with pytest.raises(ValueError, match="max_new_tokens: expected at most 3"):
        greedy_search(state, max_new_tokens=4)    # 4 prompt + 3 new tokens fill max_len 6 (+1 unfed)
    first = greedy_search(model.decoder_state(prompt), max_new_tokens=3)[0].ids
    stopped = greedy_search(model.decoder_state(prompt, eos_id=first[0]), max_new_tokens=3)[0]
    assert stopped.ids == [] and stopped.finished


def test_sampling_is_reproducible_and_top_p_or_top_k_of_one_is_greedy():
    model = tiny()
    prompt = ids_batch(7, b=2, t=2)
    draw = [sample_search(model.decoder_state(prompt), temperature=1.5, top_k=5, top_p=0.9,
                          rng=np.random.default_rng(3), max_new_tokens=6) for _ in range(2)]
    assert [h.ids for h in draw[0]] == [h.ids for h in draw[1]]
    greedy = [h.ids for h in greedy_search(model.decoder_state(prompt), max_new_tokens=6)]
    for kw in (dict(top_p=1e-9), dict(top_k=1)):
        hyps = sample_search(model.decoder_state(prompt), rng=np.random.default_rng(0),
                             max_new_tokens=6, **kw)
        assert [h.ids for h in hyps] == greedy


def test_top_p_keeps_the_smallest_set_reaching_p():
    """Probabilities 0.5, 0.3, 0.15, 0.05: top_p 0.75 keeps the first two (0.5 falls short,
    0.5 + 0.3 reaches it), so the other two are never drawn; the two kept are drawn in
    proportion, 0.5 : 0.3."""

    class Fixed:
        beams, eos_id, capacity, length, batch_size = 1, None, 10**6, 0, 4000

        def first_tokens(self):
            return np.zeros(self.batch_size, dtype=np.int64)

        def step(self, tokens):
            return np.log(np.tile([0.5, 0.3, 0.15, 0.05], (self.batch_size, 1)))

        def reorder(self, rows):
            raise AssertionError("no row finishes")

    hyps = sample_search(Fixed(), top_p=0.75, rng=np.random.default_rng(0), max_new_tokens=1)
    drawn = np.array([h.ids[0] for h in hyps])
    assert set(drawn) == {0, 1}
    assert abs((drawn == 0).mean() - 0.5 / 0.8) < 0.03
    with pytest.raises(ValueError, match="top_p"):
        sample_search(Fixed(), top_p=0.0)


def test_bad_prompts_and_states_are_clear_errors():
    model = tiny(max_len=6)
    with pytest.raises(ValueError, match="prompt: expected at most 6 tokens"):
        model.decoder_state(np.zeros((1, 7), dtype=int))
    with pytest.raises(ValueError, match=r"prompt: token ids must lie in \[0, 11\)"):
        model.decoder_state(np.array([[1, 11]]))
    with pytest.raises(ValueError, match="capacity: expected at most the model's max_len=6"):
        model.decoder_state(np.array([[1]]), capacity=7)
    with pytest.raises(ValueError, match=r"eos_id: expected a token id in \[0, 11\)"):
        model.decoder_state(np.array([[1]]), eos_id=11)
    state = model.decoder_state(np.array([[1, 2]]))
    with pytest.raises(ValueError, match="tokens: expected 1 integer ids"):
        state.step(np.array([1, 2]))
    assert isinstance(state, LanguageModelState)


# -- checkpoints -----------------------------------------------------------------------------
def next_token_backward(model, ids):
    """Forward ids (B, T), back-propagate the mean loss of predicting ids[:, 1:] from the
    positions before them (the last position predicts nothing); returns the loss."""
    logits = model.forward(ids)
    loss, dlogits = nf.cross_entropy(logits[:, :-1], ids[:, 1:])
    full = np.zeros_like(logits)
    full[:, :-1] = dlogits
    model.zero_grad()
    model.backward(full)
    return loss


def train_steps(model, opt, n, seed):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        next_token_backward(model, rng.integers(0, V, size=(2, 6)))
        opt.step()


def test_checkpoint_round_trip_and_bit_exact_resume(tmp_path):
    """Two steps, save (weights, AdamW moments, dropout rng), two more; a fresh process's view
    (load, restore, the same two steps) ends with the same bits."""
    model = tiny(dtype=np.float32, dropout=0.2).train()
    opt = nf.AdamW(model, lr=1e-2)
    train_steps(model, opt, 2, seed=0)
    save_model_checkpoint(tmp_path / "ck", model, None, opt, training={"step": 2})
    train_steps(model, opt, 2, seed=1)

    loaded = load_model_checkpoint(tmp_path / "ck")
    assert isinstance(loaded.model, nf.GPT) and loaded.model.config == model.config
    resumed = build_model(model.config).train()
    opt2 = nf.AdamW(resumed, lr=1e-2)
    assert restore_training_state(loaded, resumed, opt2) == {"step": 2}
    train_steps(resumed, opt2, 2, seed=1)
    np.testing.assert_array_equal(resumed.flat_params, model.flat_params)


def test_a_sliding_state_draws_each_token_from_the_last_context_tokens():
    """Past the context, ``slide=True`` gives each step the distribution one forward over the
    last ``max_len`` tokens gives (nanoGPT's cropping); without it the full state refuses."""
    model = nf.GPT(23, d_model=16, n_heads=2, d_ff=32, n_layers=2, max_len=6, dropout=0.0,
                   dtype=np.float64, seed=1).eval()
    seq = np.random.default_rng(0).integers(0, 23, size=(2, 15))
    state = model.decoder_state(seq[:, :3], slide=True)
    tokens = state.first_tokens()
    for t in range(3, 15):
        logp = state.step(tokens)
        window = seq[:, max(0, t - 6):t]
        expected = nf.functional.log_softmax(model.forward(window)[:, -1].astype(np.float64))
        np.testing.assert_allclose(logp, expected, rtol=1e-10, atol=1e-10)
        tokens = seq[:, t]
    full = model.decoder_state(seq[:, :3])
    tokens = full.first_tokens()
    with pytest.raises(ValueError, match="the state is full"):
        for t in range(3, 15):
            full.step(tokens)
            tokens = seq[:, t]


@pytest.mark.parametrize("make", ["gpt", "transformer"])
def test_sinusoidal_positions_past_max_len_are_refused_by_name(make):
    # the tables are cut by F.position_rows, as learned and rotary positions are
    if make == "gpt":
        model = tiny(positions="sinusoidal", max_len=6)
        embed = lambda: model.embed(np.zeros((1, 3), dtype=np.int64), start=4)
    else:
        model = nf.Transformer(5, 5, d_model=8, n_heads=2, max_len=6, dtype=np.float64)
        embed = lambda: model.embed(model.src_embed, model.src_dropout,
                                    np.zeros((1, 3), dtype=np.int64), start=4)
    with pytest.raises(ValueError, match=r"positions: expected start \+ T <= max_len=6, got start 4 "
                                         r"and T 3"):
        embed()
