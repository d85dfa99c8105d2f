"""The model options of toy, train, calibrate and lm come from one table (npformer.cli.
model_options): each is its configuration field with dashes, but for the few the table renames
(``--layers`` sets both stacks of a Transformer; lm's ``--context`` is the GPT's max_len). Runs
recorded before the table resume as before.

tests/data/runs_before_options_table holds the last checkpoint of three tiny runs made by the
code before the table (a ``train --dataset toy`` run, a ``toy`` run, which records no options,
and an ``lm`` run) and, in expected.json, what that code answered to a resume of each: the error
naming every changed model option, and the options and model of a resume that changed none."""
import argparse
import dataclasses
import json
from pathlib import Path

import pytest

from npformer.cli import common
from npformer.cli.main import build_parser, main
from npformer.cli.model_options import (LANGUAGE_MODEL, RENAMED_OPTIONS, TRANSLATION_MODEL,
                                        ModelOptions)
from npformer.configs import GPTConfig, TransformerConfig
from npformer.registry import config_from_dict
from npformer.training.checkpointing import load_model_checkpoint
from npformer.training.language_model import LM_MODEL
from npformer.training.multi30k import MULTI30K_MODEL, TINY_MODEL
from npformer.training.toy import TOY_MODEL

OLD = Path(__file__).parent / "data" / "runs_before_options_table"
EXPECTED = json.loads((OLD / "expected.json").read_text())
# the text the old lm run learnt (tests/test_language_model.py's)
TEXT = "".join(f"{w} the quick brown fox, line {i % 7}.\n" for i, w in
               enumerate(["ROMEO:", "JULIET:", "Nurse:", "Friar:"] * 30))


def _resume(name, out, tmp_path, rest):
    checkpoint = str(OLD / name / "last")
    if name == "lm":
        text = tmp_path / "input.txt"
        text.write_text(TEXT, encoding="utf-8")
        return ["lm", "--data", str(text), "--out", str(out), "--resume", checkpoint, *rest]
    return ["train", "--out", str(out), "--resume", checkpoint, *rest]


@pytest.mark.parametrize("name", ["train", "toy", "lm"])
def test_a_run_recorded_before_resumes_as_before(name, tmp_path, capsys):
    expected = EXPECTED[name]
    # a changed model option: refused in the very words of the code that recorded the run
    assert main(_resume(name, tmp_path / "refused", tmp_path, expected["refused"])) == 1
    err = capsys.readouterr().err.strip()
    assert err == expected["message"].format(checkpoint=OLD / name / "last")
    assert not (tmp_path / "refused").exists()
    # the same options: accepted, and the run goes on with every option and the model it had
    out = tmp_path / "resumed"
    assert main(_resume(name, out, tmp_path, expected["same"])) == 0
    resumed = load_model_checkpoint(str(out / "last"))
    assert resumed.meta["training"]["step"] == 3
    options = dict(resumed.meta["extra"]["options"])
    if name == "lm":
        options.pop("data")                  # (a temporary file's path, which may change)
        # the options added since are recorded with what the old run was: GPT-2's block (by
        # its family's name), every head its own keys and values
        assert (options.pop("arch"), options.pop("n_kv_heads")) == ("gpt2", None)
        # and no LoRA adapters (issue 71's options)
        assert [options.pop(k) for k in ("lora_rank", "lora_alpha", "lora_dropout",
                                         "lora_targets")] == [None] * 4
    assert options == expected["options"]
    config = config_from_dict(expected["config"])
    if name == "lm":               # the family its run's --arch names, recorded from then on
        assert "family" not in expected["config"]
        config = config.replace(family="gpt2")
    assert resumed.model.config == config


def _group(command, title):
    """{dest: flag} of the options in ``command``'s argument group ``title``."""
    parser = build_parser()
    sub = parser._subparsers._group_actions[0].choices[command]
    group, = [g for g in sub._action_groups if g.title == title]
    return {a.dest: a.option_strings[0] for a in group._group_actions}


@pytest.mark.parametrize("command,title,model", [
    ("toy", "model", TRANSLATION_MODEL), ("train", "model", TRANSLATION_MODEL),
    ("calibrate", "model", TRANSLATION_MODEL),
    ("lm", "model (a new one; --init-from brings its own)", LANGUAGE_MODEL)])
def test_every_model_option_is_its_field_with_dashes_but_the_renamed_ones(command, title, model):
    flags = _group(command, title)
    if command == "lm":                  # the block's preset, not a field: its own test below
        assert flags.pop("arch") == "--arch"
    assert list(flags) == list(model.options)
    renamed = RENAMED_OPTIONS[model.config]
    fields = {f.name for f in dataclasses.fields(model.config)}
    for option, flag in flags.items():
        assert flag == "--" + option.replace("_", "-")
        assert model.fields(option) == renamed.get(option, (option,))
        assert set(model.fields(option)) <= fields
    # the spellings and meanings of before
    assert TRANSLATION_MODEL.fields("layers") == ("n_encoder_layers", "n_decoder_layers")
    assert TRANSLATION_MODEL.fields("max_len") == ("max_len",)
    assert LANGUAGE_MODEL.fields("context") == ("max_len",)
    assert LANGUAGE_MODEL.fields("layers") == ("n_layers",)


def test_options_set_their_fields_and_fields_without_an_option_keep_their_defaults():
    args = argparse.Namespace(d_model=16, n_heads=2, d_ff=None, layers=3, dropout=None,
                              attention_dropout=None, activation_dropout=None, max_len=20)
    kwargs = TRANSLATION_MODEL.config_kwargs(args)
    assert kwargs == dict(d_model=16, n_heads=2, n_encoder_layers=3, n_decoder_layers=3,
                          max_len=20)
    config = TransformerConfig(src_vocab_size=5, tgt_vocab_size=5, **kwargs)
    assert config.d_ff == TransformerConfig.d_ff          # not given: the dataclass's
    args = argparse.Namespace(layers=2, d_model=8, n_heads=2, d_ff=None, context=16,
                              dropout=0.0, positions="rotary")
    config = GPTConfig(vocab_size=5, **LANGUAGE_MODEL.config_kwargs(args))
    assert (config.n_layers, config.max_len, config.positions) == (2, 16, "rotary")
    # every field no option sets (the block variants among them) keeps its default
    default = GPTConfig(vocab_size=5)
    for f in dataclasses.fields(GPTConfig):
        if f.name not in ("vocab_size", "n_layers", "d_model", "n_heads", "max_len", "dropout",
                          "positions", "attention_dropout"):     # (resolved from dropout)
            assert getattr(config, f.name) == getattr(default, f.name), f.name
    # ... and is left out of a memory refusal, which names each option once
    names = LANGUAGE_MODEL.names()
    assert set(names) == {f.name for f in dataclasses.fields(GPTConfig)}
    assert {k: v for k, v in names.items() if v} == {
        "n_layers": "--layers", "d_model": "--d-model", "n_heads": "--n-heads", "d_ff": "--d-ff",
        "max_len": "--context", "dropout": "--dropout", "positions": "--positions",
        "n_kv_heads": "--n-kv-heads"}
    assert TRANSLATION_MODEL.names()["n_decoder_layers"] is None


def test_a_recipes_values_are_the_defaults_and_a_misspelt_one_is_refused():
    assert TRANSLATION_MODEL.defaults(TOY_MODEL) == dict(
        d_model=64, n_heads=4, d_ff=128, layers=2, dropout=0.1, attention_dropout=None,
        activation_dropout=None, max_len=32)
    assert TRANSLATION_MODEL.defaults(TINY_MODEL)["attention_dropout"] == 0.0
    assert TRANSLATION_MODEL.defaults({})["d_model"] == TransformerConfig.d_model
    lm_defaults = LANGUAGE_MODEL.defaults(LM_MODEL)
    assert (lm_defaults["layers"], lm_defaults["context"]) == (LM_MODEL["n_layers"],
                                                              LM_MODEL["max_len"])
    with pytest.raises(TypeError, match="d_modle"):
        TRANSLATION_MODEL.defaults(dict(MULTI30K_MODEL, d_modle=3))
    with pytest.raises(ValueError, match="--layers sets n_encoder_layers and n_decoder_layers"):
        TRANSLATION_MODEL.defaults(dict(MULTI30K_MODEL, n_decoder_layers=4))
    with pytest.raises(TypeError, match="--d-modle: sets d_modle, not a field of GPTConfig"):
        ModelOptions(GPTConfig, ("d_modle",))


def test_help_says_the_recipes_defaults(capsys):
    for command in ("toy", "lm"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        if command == "toy":
            assert "encoder and decoder layers each (default 2)" in text
            assert "longest sentence in tokens (default 32)" in text
            assert "dropout probability on the attention weights (default --dropout)" in text
        else:
            assert f"transformer blocks (default {LM_MODEL['n_layers']})" in text
            assert f"(default {LM_MODEL['max_len']}; with --init-from the model's, at most 256)" \
                in text
            assert f"(default {LM_MODEL['positions']})" in text


@pytest.mark.parametrize("argv,named", [
    (["train", "--dataset", "toy", "--quiet"], "--d-model 64 --d-ff 128 --layers 1000000000 "
                                               "--max-len 32: a model this size"),
    (["lm", "--arch", "gpt", "--context", "64", "--quiet"], "--d-model 192 --d-ff 768 --layers "
                                                            "1000000000 --context 64: a model "
                                                            "this size"),
    (["lm", "--context", "64", "--quiet"], "--d-model 192 --d-ff 512 --layers 1000000000 "
                                           "--context 64: a model this size")])   # llama's
def test_a_memory_refusal_names_the_options_as_before(argv, named, tmp_path, capsys,
                                                       monkeypatch):
    monkeypatch.setattr(common, "physical_memory", lambda: 8 << 30)
    data = tmp_path / "text.txt"
    data.write_text("hello world\n" * 100, encoding="utf-8")
    extra = ["--data", str(data)] if argv[0] == "lm" else []
    assert main([*argv, *extra, "--out", str(tmp_path / "run"), "--layers", "1000000000"]) == 1
    err = capsys.readouterr().err
    assert f"npformer {argv[0]}: error: {named}" in err and len(err.splitlines()) == 1
