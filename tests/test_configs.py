"""Model configurations and the registry: one dataclass per architecture, validated in one
place, stored as a dict naming its architecture, built through ``nf.build_model``."""
import dataclasses

import numpy as np
import pytest

import npformer as nf
from npformer import registry
from npformer.configs import ModelConfig, TransformerConfig

SMALL = dict(src_vocab_size=11, tgt_vocab_size=13, d_model=8, n_heads=2, d_ff=16,
             n_encoder_layers=1, n_decoder_layers=2, max_len=9, dropout=0.0)


def test_the_model_holds_its_configuration_and_build_model_gives_the_same_model():
    model = nf.Transformer(**SMALL)
    config = TransformerConfig(**SMALL)
    assert model.config == config and isinstance(model.config, TransformerConfig)
    built = nf.build_model(config)
    assert type(built) is nf.Transformer and built.config == config
    np.testing.assert_array_equal(built.flat_params, model.flat_params)   # same seed, same draws


def test_to_dict_names_the_architecture_and_from_dict_restores_it():
    config = TransformerConfig(**SMALL, dtype=np.float64, qk_dim=4)
    stored = config.to_dict()
    assert stored["arch"] == "transformer" and stored["dtype"] == "float64"
    assert TransformerConfig.from_dict(stored) == config
    assert registry.config_from_dict(stored) == config
    lacking = {k: v for k, v in stored.items() if k not in ("norm_first", "layer_norm_eps")}
    assert TransformerConfig.from_dict(lacking) == config.replace(norm_first=False,
                                                                 layer_norm_eps=1e-5)


@pytest.mark.parametrize("data,match", [
    ({"arch": "transformer", **SMALL, "d_modell": 8}, r"d_modell: not a field of the 'transformer'"),
    ({"arch": "transformer", "tgt_vocab_size": 5}, r"src_vocab_size: required by the 'transformer'"),
    ({"arch": "gpt9", **SMALL}, r"arch: expected one of \['gpt', 'transformer'\], got 'gpt9'"),
    ({"arch": [], **SMALL}, r"arch: expected one of \['gpt', 'transformer'\], got \[\]"),
    ({"arch": {"a": 1}, **SMALL}, r"arch: expected one of .*, got \{'a': 1\}"),
    ({**SMALL, "d_model": 7}, r"d_model: expected a multiple of n_heads=2, got 7"),
    (["not", "a", "dict"], r"config: expected a dict"),
])
def test_a_bad_stored_configuration_is_a_value_error_naming_the_field(data, match):
    with pytest.raises(ValueError, match=match):
        registry.config_from_dict(data, default_arch="transformer")


def test_an_unnamed_architecture_needs_a_default():
    with pytest.raises(ValueError, match="arch: expected one of"):
        registry.config_from_dict(dict(SMALL))
    assert registry.config_from_dict(dict(SMALL), default_arch="transformer") == \
        TransformerConfig(**SMALL)


def test_configurations_are_frozen_and_replace_validates_again():
    config = TransformerConfig(**SMALL)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.d_model = 16
    with pytest.raises(ValueError, match="n_heads: expected a divisor"):
        config.replace(qk_dim=3)


def test_a_new_architecture_is_one_registration_away(monkeypatch):
    @dataclasses.dataclass(frozen=True)
    class TinyConfig(ModelConfig):
        arch = "tiny-test"
        width: int = 3

    class Tiny:
        def __init__(self, config):
            self.config = config

        @classmethod
        def from_config(cls, config):
            return cls(config)
    monkeypatch.setattr(registry, "ARCHITECTURES", dict(registry.ARCHITECTURES))
    registry.register_architecture(TinyConfig, Tiny)
    config = registry.config_from_dict({"arch": "tiny-test", "width": 5})
    assert config == TinyConfig(width=5) and nf.build_model(config).config.width == 5
    with pytest.raises(ValueError, match="config_class"):
        registry.register_architecture(dict, Tiny)
    with pytest.raises(ValueError, match="expected a model configuration"):
        nf.build_model({"arch": "tiny-test"})


def test_a_checkpoint_of_an_unknown_architecture_names_it(tmp_path):
    from npformer.checkpoint import load_checkpoint, save_checkpoint
    from npformer.data.vocab import Vocab, Vocabularies
    from npformer.training.checkpointing import (CheckpointError, load_model_checkpoint,
                                                 save_model_checkpoint)
    model = nf.Transformer(**SMALL)
    vocab_src = Vocab(list(Vocab.SPECIALS) + [f"s{i}" for i in range(SMALL["src_vocab_size"] - 4)])
    vocab_tgt = Vocab(list(Vocab.SPECIALS) + [f"t{i}" for i in range(SMALL["tgt_vocab_size"] - 4)])
    save_model_checkpoint(tmp_path / "ok", model, Vocabularies(vocab_src, vocab_tgt))
    assert load_model_checkpoint(tmp_path / "ok").model.config == model.config
    arrays, meta = load_checkpoint(tmp_path / "ok")
    meta["config"]["arch"] = "mamba"
    meta["npformer_version"] = "0.9.1"
    save_checkpoint(tmp_path / "other", arrays, meta)
    with pytest.raises(CheckpointError, match=r"other: holds a model of architecture 'mamba', "
                                              r"written by npformer 0\.9\.1; this npformer "
                                              r"\S+ knows \['gpt', 'transformer'\]"):
        load_model_checkpoint(tmp_path / "other")


def test_checkpoints_store_the_vocabularies_as_one_value(tmp_path):
    from npformer.checkpoint import load_checkpoint
    from npformer.data.vocab import Vocab, Vocabularies
    from npformer.training.checkpointing import load_model_checkpoint, save_model_checkpoint
    joint = Vocab(list(Vocab.SPECIALS) + [f"w{i}" for i in range(9)])
    model = nf.Transformer(**{**SMALL, "src_vocab_size": 13, "tgt_vocab_size": 13})
    save_model_checkpoint(tmp_path / "joint", model, Vocabularies.joint(joint))
    _, meta = load_checkpoint(tmp_path / "joint")
    assert meta["vocabularies"] == {"joint": joint.tokens} and meta["npformer_version"] == \
        nf.__version__
    loaded = load_model_checkpoint(tmp_path / "joint")
    assert loaded.vocabs == Vocabularies.joint(joint) and loaded.vocabs.is_joint
    assert loaded.vocabs.src is loaded.vocabs.tgt
    with pytest.raises(ValueError, match="vocabularies: expected"):
        Vocabularies.from_dict({"src": joint.tokens})


def test_sharing_all_embeddings_needs_one_vocabulary_size_and_ties_the_generator():
    cfg = TransformerConfig(src_vocab_size=30, tgt_vocab_size=30, d_model=8, n_heads=2,
                            share_all_embeddings=True)
    assert cfg.tie_embeddings                          # implied
    shapes = cfg.parameter_shapes()
    assert "src_embed.weight" in shapes and "tgt_embed.weight" not in shapes
    assert "generator.weight" not in shapes and "generator.bias" in shapes
    model = nf.build_model(cfg)
    assert list(model.state_dict()) == list(shapes)
    with pytest.raises(ValueError, match=r"share_all_embeddings: needs one joint vocabulary, but "
                                         r"src_vocab_size=30 differs from tgt_vocab_size=31"):
        TransformerConfig(src_vocab_size=30, tgt_vocab_size=31, share_all_embeddings=True)
    with pytest.raises(ValueError, match="share_all_embeddings: expected True or False, got 1"):
        TransformerConfig(src_vocab_size=30, tgt_vocab_size=30, share_all_embeddings=1)


def test_a_generator_without_bias_and_configs_stored_before_the_option():
    """generator_bias=False (fairseq's output projection, Transformer-Tiny's): no generator.bias
    parameter; a stored configuration without the field (written before it) keeps the bias."""
    cfg = TransformerConfig(src_vocab_size=30, tgt_vocab_size=30, d_model=8, n_heads=2,
                            share_all_embeddings=True, generator_bias=False)
    shapes = cfg.parameter_shapes()
    assert not any(name.startswith("generator.") for name in shapes)
    model = nf.build_model(cfg)
    assert model.generator.bias is None and list(model.state_dict()) == list(shapes)
    old = {k: v for k, v in TransformerConfig(src_vocab_size=30, tgt_vocab_size=30).to_dict().items()
           if k != "generator_bias"}
    assert TransformerConfig.from_dict(old).generator_bias is True
    with pytest.raises(ValueError, match="generator_bias: expected True or False, got 'no'"):
        TransformerConfig(src_vocab_size=30, tgt_vocab_size=30, generator_bias="no")


def test_a_model_sharing_all_embeddings_saves_and_loads_with_one_joint_vocabulary(tmp_path):
    from npformer.data.vocab import Vocab, Vocabularies
    from npformer.training.checkpointing import load_model_checkpoint, save_model_checkpoint
    model = nf.Transformer(12, 12, d_model=8, n_heads=2, d_ff=8, n_encoder_layers=1,
                           n_decoder_layers=1, share_all_embeddings=True)
    joint = Vocab(list(Vocab.SPECIALS) + [f"w{i}" for i in range(8)])
    save_model_checkpoint(tmp_path / "shared", model, Vocabularies.joint(joint))
    loaded = load_model_checkpoint(tmp_path / "shared")
    m = loaded.model
    assert m.config.share_all_embeddings and loaded.vocabs.is_joint
    assert m.src_embed.weight is m.tgt_embed.weight is m.generator.weight
    np.testing.assert_array_equal(m.flat_params, model.flat_params)


def test_attention_and_activation_dropout_default_to_dropout_and_are_checked():
    config = TransformerConfig(**{**SMALL, "dropout": 0.3})
    assert (config.attention_dropout, config.activation_dropout) == (0.3, 0.3)   # torch's one rate
    config = TransformerConfig(**{**SMALL, "dropout": 0.3, "attention_dropout": 0.0,
                                  "activation_dropout": 0.1})
    assert (config.dropout, config.attention_dropout, config.activation_dropout) == (0.3, 0.0, 0.1)
    assert TransformerConfig.from_dict(config.to_dict()) == config
    # a configuration stored before the two rates existed: they are its one dropout rate
    old = {k: v for k, v in config.to_dict().items() if not k.endswith("tion_dropout")}
    assert TransformerConfig.from_dict(old).attention_dropout == 0.3
    for name in ("attention_dropout", "activation_dropout"):
        with pytest.raises(ValueError, match=rf"^{name}: expected .*got 1"):
            TransformerConfig(**{**SMALL, name: 1.0})


def test_each_dropout_rate_reaches_its_modules():
    model = nf.Transformer(**{**SMALL, "dropout": 0.3, "attention_dropout": 0.0,
                              "activation_dropout": 0.1})
    encoder, decoder = model.encoder.layers[0], model.decoder.layers[1]
    assert model.src_dropout.p == model.tgt_dropout.p == 0.3
    assert encoder.dropout1.p == encoder.dropout2.p == decoder.dropout3.p == 0.3
    assert encoder.self_attn.dropout == decoder.self_attn.dropout == 0.0
    assert decoder.multihead_attn.dropout == 0.0
    assert encoder.ffn.dropout == decoder.ffn.dropout == 0.1


@pytest.mark.parametrize("rates,same", [
    (dict(dropout=0.0, attention_dropout=0.0, activation_dropout=0.0), True),
    (dict(dropout=0.0, attention_dropout=0.5, activation_dropout=0.0), False),
    (dict(dropout=0.0, attention_dropout=0.0, activation_dropout=0.5), False),
])
def test_a_rate_of_zero_leaves_training_mode_equal_to_eval(rates, same):
    model = nf.Transformer(**{**SMALL, **rates})
    src, tgt = np.array([[3, 4, 5, 2]]), np.array([[1, 6, 7]])
    with model.evaluating():
        reference = model.forward(src, tgt)
    trained = model.train().forward(src, tgt)
    assert np.array_equal(trained, reference) is same
