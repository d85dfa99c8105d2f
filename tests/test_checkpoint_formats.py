"""Checkpoints written by earlier npformer versions keep loading and give the same outputs.

``tests/data/format2_tiny`` is a small training checkpoint in checkpoint format 2 written by the
code before model configurations named their architecture (commit 9a13aef, NumPy backend);
``format2_tiny.expected.json`` holds the greedy and beam-3 tokens that code gave. The full-size
Multi30k model in ``../shared/checkpoints/m30k-de-en`` (also format 2) is held to the tokens the
same code gave for four test sentences (``m30k_de_en.expected.json``)."""
import json
from pathlib import Path

import numpy as np
import pytest

import npformer as nf
from npformer.data.tokenize import tokenize
from npformer.decoding.translator import Translator
from npformer.training.checkpointing import load_model_checkpoint
from npformer.training.toy import toy_data
from npformer.training.trainer import TrainConfig
from npformer.training.translation import translation_trainer

DATA = Path(__file__).resolve().parent / "data"
SHARED_M30K = Path(__file__).resolve().parents[1].parent / "shared" / "checkpoints" / "m30k-de-en"




def expected(name):
    return json.loads((DATA / name).read_text(encoding="utf-8"))


def test_a_format_2_checkpoint_loads_as_the_translator_and_translates_as_before(numpy_backend):
    loaded = load_model_checkpoint(DATA / "format2_tiny")
    assert isinstance(loaded.model.config, nf.TransformerConfig)
    assert loaded.model.config.to_dict()["arch"] == "transformer"
    assert (loaded.model.config.d_model, loaded.model.config.dtype) == (16, "float64")
    assert "src_vocab" not in loaded.meta and set(loaded.meta["vocabularies"]) == {"src", "tgt"}
    assert not loaded.vocabs.is_joint                        # format 2 stored two lists
    want = expected("format2_tiny.expected.json")
    translator = Translator(loaded.model, loaded.vocabs)
    assert [t.tokens for t in translator.translate(want["sentences"])] == want["greedy"]
    assert [t.tokens for t in translator.translate(want["sentences"], method="beam",
                                                   beam_size=3)] == want["beam3"]
    assert any(want["greedy"])                   # the outputs are not all empty


def test_a_format_2_training_checkpoint_resumes():
    data = toy_data(0, n_train=200, n_heldout=5, n_valid=5)
    loaded = load_model_checkpoint(DATA / "format2_tiny")
    model = nf.build_model(loaded.model.config)
    trainer = translation_trainer(model, data.vocabs, data.train, None,
                      TrainConfig(max_steps=72, epochs=20, batch_size=32, lr=1e-2,
                                  warmup_steps=10, quiet=True))
    trainer.resume(loaded)
    assert trainer.step == expected("format2_tiny.expected.json")["step"] == 70
    np.testing.assert_array_equal(model.flat_params, loaded.model.flat_params)
    trainer.fit()
    assert trainer.step == 72 and np.isfinite(model.flat_params).all()


def test_the_shared_multi30k_checkpoint_translates_as_before(numpy_backend):
    if not (SHARED_M30K / "averaged.npz").exists():
        pytest.skip(f"the trained Multi30k checkpoint is not at {SHARED_M30K} (see "
                    f"shared/checkpoints/m30k-de-en/README.md)")
    loaded = load_model_checkpoint(SHARED_M30K / "averaged")
    want = expected("m30k_de_en.expected.json")
    translator = Translator(loaded.model, loaded.vocabs, tokenize=tokenize)
    with pytest.warns(UserWarning, match="unknown words mapped to <unk>"):   # as before, too
        greedy = [t.tokens for t in translator.translate(want["sentences"])]
    with pytest.warns(UserWarning, match="unknown words mapped to <unk>"):
        beam = [t.tokens for t in translator.translate(want["sentences"], method="beam",
                                                       beam_size=5)]
    assert greedy == want["greedy"] and beam == want["beam5"]
