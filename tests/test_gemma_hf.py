"""The Gemma family (Gemma 1) in the Hugging Face format against transformers' GemmaForCausalLM:
tiny random-weight models saved with save_pretrained (float32, bfloat16, sharded), loaded by
``nf.from_pretrained``: the same logits (float64 and float32), loss and every gradient, greedy
tokens and cached steps, and a LoRA adapter that PEFT loads and continues identically. Gemma's
block is Llama's with an RMSNorm gain of 1 + w, GeGLU with the tanh GELU and the token vectors
scaled by sqrt(hidden_size); tied, with a head_dim apart from hidden_size / heads.

Hugging Face computes the RMSNorm, the rotary angles and the embedding scale in float32 even in
a float64 model: float64 is held at 1e-10 against test_llama_hf's ``exact_reference`` (those
islands removed) and at 1e-5 against stock transformers. The helpers are test_llama_hf's; its
``family_tests`` gives the ``folders`` fixture and the tests every family shares."""

import pytest

from npformer.hf import read_model_config

torch = pytest.importorskip("torch", reason="PyTorch runs the reference; install torch==2.13.0")
transformers = pytest.importorskip("transformers",
                                   reason="the reference models: pip install transformers")
pytest.importorskip("safetensors", reason="extra hf: pip install 'npformer[hf]'")
pytest.importorskip("tokenizers", reason="extra hf: pip install 'npformer[hf]'")
from test_llama_hf import (edited, family_config, family_tests,  # noqa: E402
                           greedy_and_cached_steps_equal, lm_trains, refused, save_random)

# (heads, key/value heads, head_dim, tied): grouped heads, a head_dim apart from 32 / 4 = 8
CASES = {"gemma-gqa": (4, 2, 12, True), "gemma-untied-mqa": (4, 1, 8, False)}


def build(path, case, seed=0, **options):
    return save_random(path, transformers.GemmaConfig, transformers.GemmaForCausalLM,
                       *CASES[case], seed, hidden_act="gelu_pytorch_tanh", **options)


globals().update(family_tests(CASES, build, seed=20, bf16="gemma-gqa", sharded="gemma-untied-mqa"))


@pytest.mark.parametrize("case", CASES)
def test_the_config_is_gemmas_block(folders, case):
    path, hf = folders[case]
    config = family_config(path, "gemma", ("rmsnorm_1p", "gated", "gelu_tanh", "rotary"),
                           CASES[case])
    assert hf.model.embed_tokens.scalar_embed_scale == config.d_model ** 0.5
    assert config.scale_embedding and not (config.qkv_bias or config.proj_bias)


@pytest.mark.parametrize("case", CASES)
def test_greedy_tokens_and_cached_steps(folders, case):
    greedy_and_cached_steps_equal(*folders[case])


@pytest.mark.parametrize("changes,match", [
    ({"hidden_act": "silu"}, r"hidden_act: expected 'gelu_pytorch_tanh' .* got 'silu'"),
    ({"hidden_activation": "relu"}, r"hidden_activation: expected .* got 'relu'"),
    ({"attention_bias": True}, r"attention_bias: .*expected false, got True"),
    ({"use_bidirectional_attention": True}, r"use_bidirectional_attention: .*got True"),
])
def test_a_bad_config_is_one_error_naming_file_and_field(folders, tmp_path, changes, match):
    refused(folders["gemma-gqa"][0], tmp_path, changes, match)


def test_older_activation_keys_read_as_transformers_reads_them(folders, tmp_path):
    """Gemma's first config.json files say hidden_act "gelu" (read as the tanh GELU, as
    transformers does); later ones give hidden_activation, which wins where given
    (transformers 4's rule); a file without either takes the default."""
    path, _ = folders["gemma-gqa"]
    for i, changes in enumerate(({"hidden_act": "gelu"}, {"hidden_act": None},
                                 {"hidden_activation": "gelu_pytorch_tanh", "hidden_act": "x"})):
        config, _, _ = read_model_config(edited(path, tmp_path / str(i), **changes))
        assert config.activation == "gelu_tanh"


def test_lm_trains_gemmas_block(tmp_path, capsys):
    """``npformer lm --arch gemma`` is a recipe block: a few steps of a character model whose
    configuration records the family and Gemma's fields."""
    config = lm_trains(tmp_path, capsys, "gemma", layers=1)
    assert (config.family, config.norm, config.activation, config.scale_embedding) == \
        ("gemma", "rmsnorm_1p", "gelu_tanh", True)


def test_a_file_that_leaves_keys_out_takes_gemmas_defaults(folders, tmp_path):
    """GemmaConfig's defaults, not Llama's: tied embeddings, heads of 256."""
    folder = edited(folders["gemma-untied-mqa"][0], tmp_path, tie_word_embeddings=None,
                    head_dim=None, max_position_embeddings=None)
    config, _, _ = read_model_config(folder)
    assert (config.tie_embeddings, config.head_size, config.max_len) == (True, 256, 8192)
