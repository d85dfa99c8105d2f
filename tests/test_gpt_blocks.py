"""One house for every decoder: models built from their configuration (the one source of truth),
the decoder-only model's blocks chosen by its fields, parameter shapes read off the modules
themselves, and GPT checkpoints of the old parameter names migrated on load."""
import hashlib
import json
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import npformer as nf
from npformer.registry import capability
from npformer.testing import check_model
from npformer.training.checkpointing import load_model_checkpoint

DATA = Path(__file__).resolve().parent / "data"


# -- the configuration is the one source of truth ----------------------------------------------

def test_a_model_is_built_from_its_configuration_or_its_fields():
    config = nf.GPTConfig(65, d_model=16, n_heads=2, d_ff=32, n_layers=2, max_len=8, seed=5)
    by_config, by_fields = nf.GPT(config), nf.GPT(65, d_model=16, n_heads=2, d_ff=32, n_layers=2,
                                                  max_len=8, seed=5)
    assert by_config.config == by_fields.config == config
    assert np.array_equal(by_config.flat_params, by_fields.flat_params)
    t = nf.Transformer(7, 6, d_model=8, n_heads=2, d_ff=12, n_encoder_layers=1,
                       n_decoder_layers=1)                   # positional vocabulary sizes
    assert nf.Transformer(t.config).config == t.config == nf.build_model(t.config).config
    with pytest.raises(ValueError, match="pass a GPTConfig alone, or its fields, not both"):
        nf.GPT(config, d_model=16)
    with pytest.raises(TypeError):
        nf.GPT(65, no_such_field=1)


@pytest.mark.parametrize("positions,sha256", [
    ("learned", "a77a14fa762e366667e6f7cd9a2a56f91df936c9423505cfda6c088c08e7e063"),
    ("sinusoidal", "cf4bcb2cabeca70c20c5a220ee9a0d7d3cdbbe902ac86e43bc81080609253fe4"),
    ("rotary", "4a3f88b9b5a9398515573d2e3ee778fbfdfd4259aebda6ac7c8c67e6f6295ee3")])
def test_initial_weights_keep_their_bits(positions, sha256):
    """The hashes were printed by commit 4b70321 (GPT built on an Encoder stack): the order of
    the parameters and of the initialisation's draws did not change with the blocks."""
    model = nf.GPT(65, d_model=16, n_heads=2, d_ff=32, n_layers=2, max_len=8, seed=5,
                   positions=positions, tie_embeddings=positions != "sinusoidal")
    assert hashlib.sha256(model.flat_params.tobytes()).hexdigest() == sha256
    t = nf.Transformer(7, 6, d_model=8, n_heads=2, d_ff=12, n_encoder_layers=2, n_decoder_layers=1,
                       seed=4, qk_dim=4, tie_embeddings=True)
    assert hashlib.sha256(t.flat_params.tobytes()).hexdigest() == \
        "6493bd0a750401b23297b632d7d8aa406da857bd49b4fad7236f72f0d08b3e1b"


def test_parameter_shapes_come_from_the_modules_without_allocating():
    """A configuration of 10 million tokens by 4096 (a 40 GB embedding) lists its shapes from a
    build that allocates nothing; the layer bound is checked before anything is listed."""
    config = nf.GPTConfig(10 ** 7, d_model=4096, n_heads=32, d_ff=16384, n_layers=2,
                          tie_embeddings=False)
    tracemalloc.start()
    shapes = config.parameter_shapes()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 2 ** 20
    assert shapes["tok_embed.weight"] == (10 ** 7, 4096) and shapes["generator.weight"] == (10 ** 7, 4096)
    assert sum(int(np.prod(s)) for s in shapes.values()) == config.parameter_count()
    with pytest.raises(ValueError, match="claims 2 layers, more than the 1"):
        config.parameter_shapes(max_layers=1)
    huge = nf.GPTConfig(10, d_model=8, n_heads=2, d_ff=8, n_layers=10 ** 9, max_len=4)
    with pytest.raises(ValueError, match="claims 1000000000 layers"):
        huge.parameter_shapes(max_layers=100)


def test_the_capability_is_the_configurations():
    assert capability(nf.GPTConfig(10)) == "causal_lm" == capability({"arch": "gpt"})
    assert capability(nf.TransformerConfig(5, 5)) == "seq2seq"
    with pytest.raises(ValueError, match="arch: expected one of"):
        capability({"arch": "llama2"})


# -- blocks chosen by the configuration --------------------------------------------------------

def small(**fields):
    base = dict(vocab_size=11, d_model=12, n_heads=2, d_ff=16, n_layers=2, max_len=6, dropout=0.0,
                dtype=np.float64, seed=1)
    return nf.GPT(**{**base, **fields})


@pytest.mark.parametrize("fields", [
    dict(head_dim=8),                                   # heads wider than d_model / n_heads
    dict(head_dim=4, positions="rotary", rope_theta=500.0),
    dict(qkv_bias=True, proj_bias=False),               # Qwen2's biases
    dict(qkv_bias=False, proj_bias=False),              # Llama's: none
    dict(norm_first=False, tie_embeddings=False),
    dict(n_kv_heads=2),                                 # as many key/value heads as query heads
    dict(norm="rmsnorm", qkv_bias=False, proj_bias=False, positions="rotary"),   # Llama's block
    dict(norm="rmsnorm", ffn="gated", activation="silu", qkv_bias=False, proj_bias=False,
         positions="rotary", dropout=0.0),
    dict(ffn="gated", activation="silu", proj_bias=True),
    dict(n_heads=4, n_kv_heads=2, head_dim=3),          # grouped-query attention, 2 per group
    dict(n_heads=4, n_kv_heads=1, head_dim=4, positions="rotary"),   # multi-query
    dict(n_heads=4, n_kv_heads=2, head_dim=4, positions="rotary", qk_norm=True, norm="rmsnorm",
         ffn="gated", activation="silu", qkv_bias=False, proj_bias=False),  # Qwen3's block
    dict(qk_norm=True, qkv_bias=True),                  # Qwen2-style biases with head norms
    dict(post_norms=True, norm="rmsnorm"),              # Gemma 2's norms after each sub-layer
    # Gemma 2's attention scale and soft-caps, caps small enough that tanh bends
    dict(attention_scale=0.7, attention_softcap=0.5, logit_softcap=0.3, positions="rotary"),
    dict(n_heads=4, n_kv_heads=2, head_dim=4, attention_softcap=0.5, post_norms=True),
])
def test_block_variants_are_fields_and_their_gradients_check(fields):
    model = small(**fields)
    shapes = {name: p.shape for name, p in model.named_parameters()}
    assert model.config.parameter_shapes() == shapes
    assert model.config.parameter_count() == sum(int(np.prod(s)) for s in shapes.values())
    width = model.config.n_heads * model.config.head_size
    kv = (model.config.n_kv_heads or model.config.n_heads) * model.config.head_size
    assert shapes["blocks.0.self_attn.in_proj_weight"] == (width + 2 * kv, 12)
    assert ("blocks.0.self_attn.q_norm.weight" in shapes) == model.config.qk_norm
    assert shapes["blocks.0.self_attn.out_proj.weight"] == (12, width)
    assert shapes["blocks.0.ffn.linear1.weight"] == (model.blocks[0].ffn.GATES * 16, 12)
    assert ("blocks.0.self_attn.in_proj_bias" in shapes) == model.config.qkv_bias
    assert ("blocks.1.ffn.linear2.bias" in shapes) == model.config.proj_bias
    assert ("norm.bias" in shapes) == ("bias" in nf.parts.NORMS[model.config.norm].params)
    ids = np.array([[1, 4, 5, 6], [3, 0, 2, 10]])
    result = check_model(model, (ids, np.roll(ids, -1, axis=1)))
    assert result.ok, str(result)


def test_rope_theta_sets_the_rotary_frequencies():
    a, b = small(positions="rotary"), small(positions="rotary", rope_theta=100.0)
    cos_a, cos_b = a.blocks[0].self_attn.rotary[0], b.blocks[0].self_attn.rotary[0]
    np.testing.assert_allclose(cos_b, nf.functional.rotary_tables(6, 6, np.float64, 100.0)[0])
    assert not np.allclose(cos_a, cos_b)
    ids = np.array([[1, 4, 5, 6]])
    assert not np.allclose(a.forward(ids), b.forward(ids))


@pytest.mark.parametrize("fields,message", [
    (dict(ffn="geglu"), r"ffn: expected one of mlp, gated, got 'geglu'"),
    (dict(n_kv_heads=3), r"n_kv_heads: expected a divisor of n_heads=2 .*got 3"),
    (dict(n_kv_heads=0), r"n_kv_heads: expected a positive integer"),
    (dict(norm="batchnorm"), r"norm: expected one of layernorm, rmsnorm, .*got 'batchnorm'"),
    (dict(head_dim=0), r"head_dim: expected a positive integer"),
    (dict(rope_theta=0.0), r"rope_theta: expected"),
    (dict(attention_softcap=0.0), r"attention_softcap: expected"),
    (dict(logit_softcap=-1.0), r"logit_softcap: expected"),
    (dict(attention_scale="big"), r"attention_scale: expected"),
    (dict(post_norms="yes"), r"post_norms: expected"),
    (dict(head_dim=3, positions="rotary"), r"expected an even head size, got 3"),
    (dict(d_model=10, n_heads=4), r"d_model: expected a multiple of n_heads=4, got 10"),
])
def test_variants_not_built_yet_and_bad_values_are_refused_by_field(fields, message):
    with pytest.raises(ValueError, match=message):
        nf.GPTConfig(**{**dict(vocab_size=11, d_model=12, n_heads=2), **fields})


def test_a_head_size_of_its_own_lifts_the_d_model_rule():
    """Qwen3-0.6B's shape in small: d_model 10 is no multiple of 4 heads, but heads of 6 are
    their own width (the attention projects 10 -> 24 -> 10)."""
    model = small(d_model=10, n_heads=4, head_dim=6)
    assert model.blocks[0].self_attn.in_proj_weight.shape == (72, 10)
    ids = np.array([[1, 4, 5, 6]])
    assert check_model(model, (ids, ids)).ok


@pytest.mark.parametrize("fields", [dict(), dict(n_heads=4, n_kv_heads=1, qk_norm=True),
                                    dict(n_heads=4, n_kv_heads=2, norm="rmsnorm", ffn="gated",
                                         activation="silu"),
                                    dict(post_norms=True, attention_scale=0.3,
                                         attention_softcap=0.5, logit_softcap=0.3)])
def test_the_blocks_step_protocol_gives_the_forward_pass(fields):
    """A decoder state is built from new_caches() and step(): fed one position at a time, the
    last logits equal the full forward's. With grouped key/value heads the caches hold only
    the n_kv_heads heads."""
    model = small(**{**dict(positions="rotary", head_dim=4), **fields}).eval()
    ids = np.array([[1, 4, 5, 6, 2], [3, 0, 2, 10, 7]])
    full = model.forward(ids)
    caches = model.new_caches(2, 6)
    assert len(caches) == 2 and caches[0].capacity == 6
    assert caches[0].k.shape[1] == (model.config.n_kv_heads or model.config.n_heads)
    for t in range(5):
        last = model.step(ids[:, t:t + 1], caches)
        np.testing.assert_allclose(last, full[:, t], rtol=1e-10, atol=1e-12)
    assert caches[1].length == 5


# -- checkpoints written with the old names ----------------------------------------------------

def test_a_gpt_checkpoint_of_the_old_names_loads_and_gives_the_same_logits():
    """tests/data/gpt_format3_transformer_names was written by commit 4b70321, when the blocks
    were ``transformer.layers.N`` and the final norm ``transformer.norm``: it loads under the
    new names (``GPTConfig.RENAMED``), with the same logits."""
    expected = json.loads((DATA / "gpt_format3_transformer_names.expected.json").read_text())
    assert expected["names"][2].startswith("transformer.layers.0.")
    loaded = load_model_checkpoint(DATA / "gpt_format3_transformer_names")
    names = [name for name, _ in loaded.model.named_parameters()]
    assert names == [n.replace("transformer.layers.", "blocks.").replace("transformer.norm.", "norm.")
                     for n in expected["names"]]
    logits = loaded.model.forward(np.array(expected["ids"]))
    np.testing.assert_allclose(logits, np.array(expected["logits"]), rtol=1e-6, atol=1e-6)


# -- Llama 3's rope scaling ---------------------------------------------------------------------

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}


def test_llama3_rope_scaling_gives_transformers_frequencies():
    """The frequencies equal transformers' _compute_llama3_parameters (float64 here, float32
    there: to float32's precision), for a head size whose pairs fall in all three bands."""
    torch = pytest.importorskip("torch")
    rope_utils = pytest.importorskip("transformers.modeling_rope_utils")
    from transformers import LlamaConfig
    hf = LlamaConfig(hidden_size=64, num_attention_heads=1, head_dim=64, rope_theta=10000.0,
                     rope_scaling=dict(LLAMA3), max_position_embeddings=512)
    theirs, _ = rope_utils._compute_llama3_parameters(hf, torch.device("cpu"))
    ours = nf.functional.rotary_frequencies(64, 10000.0, LLAMA3)
    plain = nf.functional.rotary_frequencies(64, 10000.0)
    np.testing.assert_allclose(ours, theirs.double().numpy(), rtol=1e-6)
    assert (ours == plain).any() and (ours == plain / 8).any() and \
        ((ours != plain) & (ours != plain / 8)).any()        # fast, slow and interpolated pairs


def test_rope_scaling_is_a_field_of_rotary_models():
    model = small(positions="rotary", head_dim=4, rope_scaling=LLAMA3)
    assert model.config.rope_scaling == LLAMA3
    assert nf.GPTConfig.from_dict(model.config.to_dict()) == model.config
    ids = np.array([[1, 4, 5, 6]])
    assert not np.allclose(model.forward(ids), small(positions="rotary", head_dim=4).forward(ids))
    assert check_model(model, (ids, ids)).ok


@pytest.mark.parametrize("scaling,message", [
    ({"rope_type": "yarn", "factor": 4.0}, r"rope_scaling: rope_type: expected 'llama3' .*got 'yarn'"),
    ({**LLAMA3, "factor": -1.0}, r"rope_scaling.factor: expected"),
    ({**LLAMA3, "high_freq_factor": 0.5}, r"rope_scaling.high_freq_factor: expected more than"),
    ({k: v for k, v in LLAMA3.items() if k != "original_max_position_embeddings"},
     r"rope_scaling.original_max_position_embeddings"),
    ([1, 2], r"rope_scaling: expected a dict"),
])
def test_a_bad_rope_scaling_is_refused_naming_the_key(scaling, message):
    with pytest.raises(ValueError, match=message):
        nf.GPTConfig(11, d_model=8, n_heads=2, positions="rotary", rope_scaling=scaling)
    with pytest.raises(ValueError, match="rope_scaling: rescales rotary positions"):
        nf.GPTConfig(11, d_model=8, n_heads=2, rope_scaling=LLAMA3)
