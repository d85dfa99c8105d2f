"""The Gemma 2 family in the Hugging Face format against transformers' Gemma2ForCausalLM: tiny
random-weight models saved with save_pretrained (float32, bfloat16, sharded), loaded by
``nf.from_pretrained``: the same logits (float64 and float32), loss and every gradient, greedy
tokens and cached steps past the sliding window, and a LoRA adapter that PEFT loads and
continues identically. Gemma 2's block is Gemma's (test_gemma_hf.py) with a norm after each
sub-layer, the attention scale query_pre_attn_scalar ** -0.5, soft-capped attention scores and
logits, and a sliding window on every other layer.

The caps, the window and the scale are set small enough here that each changes the logits
(a cap of 50 on these tiny models' scores would change nothing). Gemma 2's eager attention
computes its softmax in float32 even in a float64 model: float64 is held at 1e-10 against
test_llama_hf's ``exact_reference`` (that island and the others removed) and at 1e-5 against
stock transformers. The helpers are test_llama_hf's; its ``family_tests`` gives the ``folders``
fixture and the tests every family shares."""

import numpy as np
import pytest

import npformer as nf
from npformer.hf import read_model_config

torch = pytest.importorskip("torch", reason="PyTorch runs the reference; install torch==2.13.0")
transformers = pytest.importorskip("transformers",
                                   reason="the reference models: pip install transformers")
pytest.importorskip("safetensors", reason="extra hf: pip install 'npformer[hf]'")
pytest.importorskip("tokenizers", reason="extra hf: pip install 'npformer[hf]'")
from test_llama_hf import (edited, family_config, family_tests,  # noqa: E402
                           greedy_and_cached_steps_equal, lm_trains, refused, save_random,
                           tokenizer)

# (heads, key/value heads, head_dim, tied, Gemma 2's keys): a window of 4 positions, shorter
# than the test batches and the greedy run; caps of the scores' and the logits' own size
CASES = {
    "gemma2-gqa": (4, 2, 12, True, dict(sliding_window=4, query_pre_attn_scalar=6,
                                        attn_logit_softcapping=0.05,
                                        final_logit_softcapping=0.5)),
    "gemma2-untied-mqa-3-layers": (4, 1, 8, False, dict(
        sliding_window=3, num_hidden_layers=3, attn_logit_softcapping=0.05,
        final_logit_softcapping=None)),
}


def build(path, case, seed=0, **options):
    *shape, keys = CASES[case]
    return save_random(path, transformers.Gemma2Config, transformers.Gemma2ForCausalLM,
                       *shape, seed, hidden_activation="gelu_pytorch_tanh",
                       **{**keys, **options})


globals().update(family_tests(CASES, build, seed=30, bf16="gemma2-gqa",
                              sharded="gemma2-untied-mqa-3-layers"))


@pytest.mark.parametrize("case", CASES)
def test_the_config_is_gemma2s_block(folders, case):
    path, hf = folders[case]
    *shape, keys = CASES[case]
    assert hf.config._attn_implementation == "eager"            # Gemma 2's, for its caps
    config = family_config(path, "gemma2", ("rmsnorm_1p", "gated", "gelu_tanh", "rotary"),
                           tuple(shape))
    assert config.scale_embedding and config.post_norms
    assert config.attention_scale == hf.model.layers[0].self_attn.scaling
    assert (config.attention_softcap, config.logit_softcap) == \
        (keys["attn_logit_softcapping"], keys["final_logit_softcapping"])
    windows = [config.layer_window(i) for i in range(config.n_layers)]
    assert windows == [keys["sliding_window"] if kind == "sliding_attention" else None
                       for kind in hf.config.layer_types]
    assert windows[0] == keys["sliding_window"] and windows[1] is None


@pytest.mark.parametrize("case", CASES)
def test_greedy_tokens_and_cached_steps_past_the_window(folders, case):
    """Ten new tokens after the prompt: the cached steps run well past the window."""
    assert len(tokenizer().encode("hello world").ids) + 10 > CASES[case][4]["sliding_window"]
    greedy_and_cached_steps_equal(*folders[case])


def test_each_gemma2_field_changes_the_logits(folders, tmp_path):
    """The caps, the scale and the window each matter at these sizes (so the equalities above
    hold each of them), read from config.json."""
    path, _ = folders["gemma2-gqa"]
    ids = np.random.default_rng(0).integers(0, 300, size=(1, 13))
    base = nf.from_pretrained(path, dtype=np.float64).forward(ids)
    for i, change in enumerate([{"attn_logit_softcapping": None},
                                {"final_logit_softcapping": None},
                                {"query_pre_attn_scalar": 12}, {"sliding_window": None},
                                {"layer_types": ["full_attention"] * 2}]):
        other = nf.from_pretrained(edited(path, tmp_path / str(i), **change),
                                   dtype=np.float64).forward(ids)
        assert np.abs(other - base).max() > 1e-4, change


@pytest.mark.parametrize("changes,match", [
    ({"attn_logit_softcapping": 0}, r"attn_logit_softcapping: expected"),
    ({"final_logit_softcapping": "big"}, r"final_logit_softcapping: expected"),
    ({"query_pre_attn_scalar": "x"}, r"query_pre_attn_scalar: expected"),
    ({"sliding_window": 0}, r"sliding_window: expected a positive integer"),
    ({"layer_types": ["full_attention", "sliding_attention"]},
     r"layer_types: expected a list of 2 .* got \['full_attention', 'sliding_attention'\]"),
    ({"layer_types": ["sliding_attention"]}, r"layer_types: expected a list of 2"),
    ({"hidden_activation": "relu"}, r"hidden_activation: expected .* got 'relu'"),
])
def test_a_bad_config_is_one_error_naming_file_and_field(folders, tmp_path, changes, match):
    refused(folders["gemma2-gqa"][0], tmp_path, changes, match)


def test_layer_types_as_transformers_reads_them(folders, tmp_path):
    """Every layer sliding, none, or the alternation given explicitly; left out, Gemma 2's
    default alternation (the first layer slides)."""
    path, _ = folders["gemma2-gqa"]
    for i, (types, windows) in enumerate([
            (["sliding_attention"] * 2, [4, 4]), (["full_attention"] * 2, [None, None]),
            (["sliding_attention", "full_attention"], [4, None]), (None, [4, None])]):
        config, _, _ = read_model_config(edited(path, tmp_path / str(i), layer_types=types))
        assert [config.layer_window(j) for j in range(2)] == windows


def test_lm_trains_gemma2s_block(tmp_path, capsys):
    """``npformer lm --arch gemma2`` is a recipe block: a few steps of a character model whose
    configuration records the family and Gemma 2's fields."""
    config = lm_trains(tmp_path, capsys, "gemma2", layers=2)
    assert (config.family, config.norm, config.post_norms, config.attention_softcap,
            config.logit_softcap) == ("gemma2", "rmsnorm_1p", True, 50.0, 30.0)
