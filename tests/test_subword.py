"""Subword units (SentencePiece over the word tokenizer): the tokenizer itself, the Multi30k recipe
with ``subword=N`` and ``npformer train/eval --subword`` end to end on a tiny folder.
Skipped where the optional sentencepiece package is not installed."""
import pickle

import pytest

pytest.importorskip("sentencepiece", reason="subword units need the optional sentencepiece package")

from npformer.cli.main import main  # noqa: E402
from npformer.data.subword import SubwordTokenizer  # noqa: E402
from npformer.training.checkpointing import load_model_checkpoint  # noqa: E402
from npformer.training.multi30k import evaluate_checkpoint, load_multi30k  # noqa: E402

from test_multi30k_training import TINY, mini_dir  # noqa: E402,F401  (the fixture)

TEXTS = ["Zwei junge Männer spielen Fußball im Park.", "Ein Schlagzeuger spielt Schlagzeug.",
         "Eine Frau trägt ein rotes T-Shirt.", "Zwei Hunde spielen im Schnee.",
         "A man's dog runs in the park.", "Two young men are playing soccer."] * 5


@pytest.fixture(scope="module")
def tok():
    return SubwordTokenizer.train(TEXTS, vocab_size=80)


def test_round_trip_gives_back_the_word_tokenizers_text(tok):
    for text in TEXTS[:6]:
        pieces = tok.tokenize(text)
        assert all(isinstance(p, str) and p for p in pieces)
        assert tok.detokenize(pieces) == text.lower()


def test_unseen_words_are_spelled_in_pieces_not_unknown(tok):
    pieces = tok.tokenize("Spielen Männer?")
    assert "<unk>" not in pieces and len(pieces) > 2
    assert tok.detokenize(pieces) == "spielen männer?"


def test_unk_pieces_are_dropped_from_the_text(tok):
    pieces = tok.tokenize("Zwei Hunde")
    assert tok.detokenize(pieces[:1] + ["<unk>"] + pieces[1:]) == "zwei hunde"


def test_serialisation_round_trips(tok):
    for copy in (pickle.loads(pickle.dumps(tok)), SubwordTokenizer.from_text(tok.to_text())):
        assert copy.tokenize(TEXTS[1]) == tok.tokenize(TEXTS[1]) and len(copy) == len(tok)


def test_cased_keeps_capitals():
    cased = SubwordTokenizer.train(TEXTS, vocab_size=80, lowercase=False)
    assert cased.detokenize(cased.tokenize(TEXTS[0])) == TEXTS[0]


@pytest.mark.parametrize("bad", [b"", b"not a model", "text"], ids=["empty", "garbage", "str"])
def test_bad_model_bytes_are_rejected(bad):
    with pytest.raises(ValueError, match="model_proto"):
        SubwordTokenizer(bad)


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match="vocab_size"):
        SubwordTokenizer.train(TEXTS, vocab_size=3)
    with pytest.raises(ValueError, match="base64"):
        SubwordTokenizer.from_text("not base64 !!")


def test_recipe_uses_pieces_for_both_vocabularies(mini_dir):  # noqa: F811
    data = load_multi30k(mini_dir, "de", "en", min_freq=1, subword=40)
    assert data.subword is not None and data.extra["tokenizer"] == "npformer-word+sentencepiece"
    tokenize, detokenize = data.tokenizers()
    # one joint SentencePiece model gives one joint vocabulary, held once
    assert data.vocabs.is_joint and data.vocabs.src is data.vocabs.tgt
    assert all(p in data.vocabs.src for p in tokenize(data.train[0][0]))
    assert all(p in data.vocabs.tgt for p in tokenize(data.train[0][1]))
    words = load_multi30k(mini_dir, "de", "en", min_freq=1)
    assert not words.vocabs.is_joint
    assert detokenize(tokenize(data.train[0][1])) == data.train[0][1].lower()
    with pytest.raises(ValueError, match="subword"):
        load_multi30k(mini_dir, subword=0)


def test_cli_train_and_eval_with_subword(mini_dir, tmp_path, capsys):  # noqa: F811
    run = tmp_path / "run"
    assert main(["train", "--dataset", "multi30k", "--data-dir", str(mini_dir), "--src", "de",
                 "--tgt", "en", "--max-steps", "4", "--max-tokens", "80", "--subword", "40",
                 "--min-freq", "1", "--out", str(run)] + TINY) == 0
    out = capsys.readouterr().out
    assert "40 subword pieces" in out and "one joint vocabulary of" in out
    loaded = load_model_checkpoint(run / "last")
    assert loaded.vocabs.is_joint and loaded.meta["vocabularies"].keys() == {"joint"}
    result = evaluate_checkpoint(loaded, mini_dir)               # the pieces come from the checkpoint
    assert result["sentences"] == 4 and all(isinstance(h, str) for h in result["hypotheses"])
    assert main(["eval", "--checkpoint", str(run / "last"), "--dataset", "multi30k",
                 "--data-dir", str(mini_dir), "--metrics-json", str(tmp_path / "m.json")]) == 0
    # resuming keeps the checkpoint's subword model, even without --subword on the command line
    first = loaded.meta["extra"]["subword_model"]
    assert main(["train", "--dataset", "multi30k", "--data-dir", str(mini_dir), "--src", "de",
                 "--tgt", "en", "--max-steps", "6", "--max-tokens", "80", "--min-freq", "1",
                 "--out", str(tmp_path / "resumed"), "--resume", str(run / "last")] + TINY) == 0
    resumed = load_model_checkpoint(tmp_path / "resumed" / "last")
    assert resumed.meta["extra"]["subword_model"] == first and resumed.meta["training"]["step"] == 6


def test_subword_resume_of_a_word_level_checkpoint_is_refused(mini_dir, tmp_path, capsys):  # noqa: F811
    common = ["train", "--dataset", "multi30k", "--data-dir", str(mini_dir), "--min-freq", "1",
              "--max-tokens", "80"] + TINY
    assert main(common + ["--max-steps", "2", "--out", str(tmp_path / "words")]) == 0
    assert main(common + ["--max-steps", "4", "--subword", "40", "--out", str(tmp_path / "again"),
                          "--resume", str(tmp_path / "words" / "last")]) != 0
    assert "--subword" in capsys.readouterr().err


def test_too_few_pieces_name_the_option(mini_dir):  # noqa: F811
    with pytest.raises(ValueError, match="subword: expected at least 16"):
        load_multi30k(mini_dir, subword=5)


def test_subword_is_only_for_multi30k(tmp_path, capsys):
    assert main(["train", "--dataset", "toy", "--subword", "100", "--quiet",
                 "--out", str(tmp_path / "run")]) != 0
    assert "--subword" in capsys.readouterr().err


def test_the_tiny_preset_shares_all_embeddings_over_one_joint_vocabulary(mini_dir, tmp_path,  # noqa: F811
                                                                          capsys):
    pytest.importorskip("sacremoses", reason="the tiny preset preprocesses with the optional sacremoses")
    run = tmp_path / "tiny"
    # the preset's sizes, shrunk for a test: what is left out comes from the preset
    assert main(["train", "--dataset", "multi30k", "--data-dir", str(mini_dir), "--preset", "tiny",
                 "--subword", "40", "--min-freq", "1", "--max-steps", "3", "--max-tokens", "80",
                 "--eval-every", "2", "--out", str(run)] + TINY) == 0
    loaded = load_model_checkpoint(run / "last")
    model, training = loaded.model, loaded.meta["training"]["config"]
    assert model.config.share_all_embeddings and loaded.vocabs.is_joint
    assert model.src_embed.weight is model.tgt_embed.weight is model.generator.weight
    assert (training["lr"], training["warmup_steps"], training["schedule"]) == (5e-3, 2000,
                                                                                "inverse_sqrt")
    assert training["save_every_epochs"] == 1 and training["keep_last"] == 10
    assert training["clip_norm"] is None and model.config.dropout == 0.3
    # fairseq's batching: the whole set sorted by length
    assert training["bucket_size"] is None and loaded.meta["extra"]["options"]["bucket_size"] == "all"
    # fairseq's recipe drops the residual paths only
    assert model.config.attention_dropout == model.config.activation_dropout == 0.0
    assert loaded.meta["extra"]["options"]["preset"] == "tiny"
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:                       # argparse: the known ones
        main(["train", "--dataset", "multi30k", "--data-dir", str(mini_dir), "--preset", "huge",
              "--out", str(tmp_path / "x")])
    assert exit_.value.code == 2
    assert "invalid choice: 'huge' (choose from 'base', 'tiny')" in capsys.readouterr().err
    assert main(["train", "--dataset", "toy", "--preset", "tiny", "--out", str(tmp_path / "y")]) != 0
    assert "--preset: not used with --dataset toy" in capsys.readouterr().err
