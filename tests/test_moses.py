"""The papers' preprocessing and BLEU (npformer.data.moses, metrics.papers_bleu): reproduces the
tokenised references the Multi30k papers score against, and ``npformer eval`` prints that BLEU
beside ours; the same preprocessing as a training option (``--preprocess moses``, the tiny
preset's), end to end, and the warnings of translate/eval options that contradict a checkpoint.
Skipped where the optional sacremoses package is not installed."""
import gzip
import json
from pathlib import Path

import pytest

pytest.importorskip("sacremoses", reason="the papers' preprocessing needs the optional sacremoses")

from npformer.cli.main import main  # noqa: E402
from npformer.data.moses import papers_detokenize, papers_tokenize  # noqa: E402
from npformer.training.checkpointing import load_model_checkpoint  # noqa: E402
from npformer.training.metrics import papers_bleu  # noqa: E402
from npformer.decoding.translator import Translator  # noqa: E402
from npformer.training.multi30k import (TextPipeline, checkpoint_subword,  # noqa: E402
                                        checkpoint_text_settings, load_multi30k)

from test_multi30k_training import TINY, mini_dir, write_split  # noqa: E402,F401  (the fixture)

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"


def test_moses_normalises_lowercases_and_escapes():
    assert papers_tokenize(['A man\'s "red" hat & coat.'], "en") == [
        "a man &apos;s &quot; red &quot; hat &amp; coat ."]


@pytest.mark.skipif(not (SHARED / "test_2016_flickr.en.gz").exists(),
                    reason="../shared/data/multi30k is absent")
def test_the_papers_tokenised_references_are_reproduced():
    lines = gzip.open(SHARED / "test_2016_flickr.en.gz", "rt", encoding="utf-8").read().split("\n")
    out = papers_tokenize([lines[0], lines[29]], "en")
    assert out == ["a man in an orange hat starring at something .",
                   "one man holds another man &apos;s head down and prepares to punch him in "
                   "the face ."]


def test_papers_bleu_counts_on_the_preprocessed_text():
    refs = ["A dog runs in the park.", "Two men's hats."]
    # hypotheses come detokenised (as npformer's output is): both sides get the same pipeline
    result = papers_bleu(["a dog runs in the park.", "two men's hats."], refs, "en")
    assert result["bleu_papers"] == pytest.approx(100.0)
    assert "tok:none" in result["signature_papers"]
    assert result["signature_papers"].endswith("+moses-lc-esc")
    assert papers_bleu(["a cat sleeps.", "one hat."], refs, "en")["bleu_papers"] < 50


def test_eval_prints_the_papers_bleu_beside_ours(mini_dir, tmp_path, capsys):  # noqa: F811
    run = tmp_path / "run"
    assert main(["train", "--dataset", "multi30k", "--data-dir", str(mini_dir), "--min-freq", "1",
                 "--max-steps", "2", "--max-tokens", "80", "--out", str(run)] + TINY) == 0
    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(run / "last"), "--dataset", "multi30k",
                 "--data-dir", str(mini_dir)]) == 0
    out = capsys.readouterr().out
    assert "BLEU (lowercased)" in out and "BLEU (papers': lowercased, Moses-tokenised" in out


def test_papers_bleu_scores_tokenised_hypotheses_as_they_are():
    refs = ["A man's hat."]
    assert papers_bleu(["a man &apos;s hat ."], refs, "en", tokenised=True)["bleu_papers"] == \
        pytest.approx(100.0)
    # the same text not marked as tokenised is escaped again: &amp;apos; no longer matches
    assert papers_bleu(["a man &apos;s hat ."], refs, "en")["bleu_papers"] < 100.0


def test_papers_detokenize_undoes_the_tokenizer_but_not_the_lowercasing():
    assert papers_detokenize(["a man &apos;s &quot; red &quot; hat &amp; coat ."], "en") == [
        'a man\'s "red" hat & coat.']


# ---------------------------------------------------------------------------------------------
# --preprocess moses: the data pipeline
DE = ["Ein Mann läuft.", "Der Hut des Mannes ist rot.", "Ein Hund & eine Katze."] * 4
EN = ["A man's dog runs.", "The man's \"hat\" is red.", "A dog & a cat."] * 4


@pytest.fixture
def quoted_dir(tmp_path):
    folder = tmp_path / "quoted"
    folder.mkdir()
    write_split(folder, "train", DE, EN)
    write_split(folder, "val", DE[:3], EN[:3])
    write_split(folder, "test_2016_flickr", DE[:3], EN[:3])
    return folder


def test_preprocess_moses_gives_the_papers_tokens_of_each_language(quoted_dir):
    data = load_multi30k(quoted_dir, "de", "en", min_freq=1, preprocess="moses")
    assert data.train[0] == ("ein mann läuft .", "a man &apos;s dog runs .")
    assert data.train[1][1] == "the man &apos;s &quot; hat &quot; is red ."
    assert data.valid == data.train[:3]
    assert data.extra["tokenizer"] == "moses"
    tokenize, detokenize = data.tokenizers()          # the units: the tokens as they are
    assert tokenize(data.train[2][1]) == ["a", "dog", "&amp;", "a", "cat", "."]
    assert detokenize(tokenize(data.train[2][1])) == data.train[2][1]


def test_preprocess_moses_with_subwords_learns_the_pieces_on_the_papers_tokens(quoted_dir):
    pytest.importorskip("sentencepiece", reason="subword units need the optional sentencepiece")
    data = load_multi30k(quoted_dir, "de", "en", min_freq=1, preprocess="moses", subword=60)
    assert data.subword.pretokenized and data.vocabs.is_joint
    assert data.extra["tokenizer"] == "moses+sentencepiece"
    tokenize, detokenize = data.tokenizers()
    assert "▁&apos;s" in tokenize(data.train[0][1])    # merged within a token, as subword-nmt
    for source, target in data.train[:3]:
        for text in (source, target):
            assert detokenize(tokenize(text)) == text  # tokenised text back, not detokenised


@pytest.mark.parametrize("kwargs, match", [
    (dict(preprocess="spacy"), r"preprocess: expected one of \('npformer', 'moses'\), got 'spacy'"),
    (dict(preprocess="moses", lowercase=False), r"preprocess 'moses': .*lowercases")])
def test_bad_preprocess_options_are_refused(mini_dir, kwargs, match):  # noqa: F811
    with pytest.raises(ValueError, match=match):
        load_multi30k(mini_dir, **kwargs)


def test_the_text_pipeline_of_papers_text_round_trips_raw_sentences():
    settings = {"preprocess": "moses", "lowercase": True, "src_lang": "en", "tgt_lang": "en"}
    pipeline = TextPipeline(settings)
    units = pipeline.tokenize('A man\'s "red" hat & coat.')
    assert units == ["a", "man", "&apos;s", "&quot;", "red", "&quot;", "hat", "&amp;", "coat", "."]
    assert pipeline.tokenised_text(units) == "a man &apos;s &quot; red &quot; hat &amp; coat ."
    assert pipeline.detokenize(units) == 'a man\'s "red" hat & coat.'


# ---------------------------------------------------------------------------------------------
# --preprocess moses: train, eval, translate, resume
@pytest.fixture
def moses_run(quoted_dir, tmp_path):
    pytest.importorskip("sentencepiece", reason="the tiny preset's units need sentencepiece")
    run = tmp_path / "run"
    assert main(["train", "--dataset", "multi30k", "--data-dir", str(quoted_dir), "--preset",
                 "tiny", "--subword", "60", "--min-freq", "1", "--max-steps", "4",
                 "--eval-every", "2", "--max-tokens", "120", "--out", str(run)] + TINY
                + ["--max-len", "64"]) == 0
    return run


def test_a_moses_run_records_its_preprocessing_and_is_scored_on_its_tokens(moses_run, quoted_dir,
                                                                            tmp_path, capsys):
    extra = load_model_checkpoint(str(moses_run / "last")).meta["extra"]
    assert (extra["tokenizer"], extra["options"]["preprocess"]) == ("moses+sentencepiece", "moses")
    capsys.readouterr()
    out = tmp_path / "hyps.txt"
    assert main(["eval", "--checkpoint", str(moses_run / "last"), "--dataset", "multi30k",
                 "--data-dir", str(quoted_dir), "--json", "--out", str(out)]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert {"bleu", "bleu_cased", "bleu_papers"} <= set(figures)
    # the papers' BLEU scores the model's own tokens; the written text is their Moses detokenisation
    loaded = load_model_checkpoint(str(moses_run / "last"))
    pipeline = TextPipeline(checkpoint_text_settings(loaded), checkpoint_subword(loaded))
    tokens = [r.text for r in Translator(loaded.model, loaded.vocabs, pipeline.tokenize,
                                         pipeline.tokenised_text).translate(DE[:3])]
    assert out.read_text().splitlines() == papers_detokenize(tokens, "en")
    refs = EN[:3]
    assert figures["bleu_papers"] == pytest.approx(
        papers_bleu(tokens, refs, "en", tokenised=True)["bleu_papers"])


def test_translate_options_that_contradict_the_checkpoint_warn_naming_both(moses_run, capsys):
    last = str(moses_run / "last")
    capsys.readouterr()
    assert main(["translate", "--checkpoint", last, "A man's dog runs."]) == 0
    assert "warning: --" not in capsys.readouterr().err
    assert main(["translate", "--checkpoint", last, "--preprocess", "npformer",
                 "A man's dog runs."]) == 0
    err = capsys.readouterr().err
    assert "--preprocess: 'npformer' input" in err and "preprocess 'moses'" in err
    # the papers' preprocessing lowercases: a cased model of it cannot exist
    assert main(["translate", "--checkpoint", last, "--cased", "A man."]) == 1
    assert "lowercases" in capsys.readouterr().err


def test_a_moses_run_resumes_with_its_preprocessing_and_refuses_another(moses_run, quoted_dir,
                                                                         capsys):
    common = ["train", "--dataset", "multi30k", "--data-dir", str(quoted_dir),
              "--resume", str(moses_run / "last"), "--out", str(moses_run)]
    assert main(common + ["--preprocess", "npformer"]) == 1
    assert "--preprocess" in capsys.readouterr().err
    assert main(common + ["--max-steps", "6", "--quiet"]) == 0
    assert load_model_checkpoint(str(moses_run / "last")).meta["extra"]["tokenizer"] == \
        "moses+sentencepiece"


def test_preprocess_is_refused_for_checkpoints_that_are_not_multi30k_models(tmp_path, capsys):
    run = tmp_path / "toy"
    assert main(["train", "--dataset", "toy", "--max-steps", "2", "--out", str(run), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["translate", "--checkpoint", str(run / "last"), "--cased", "我 喜欢"]) == 1
    assert "only for Multi30k checkpoints" in capsys.readouterr().err
    text = tmp_path / "src.txt"
    text.write_text("我 喜欢\n")
    assert main(["eval", "--checkpoint", str(run / "last"), "--src", str(text), "--ref",
                 str(text), "--preprocess", "moses"]) == 1
    assert "--preprocess: only with --dataset multi30k" in capsys.readouterr().err


def test_the_papers_preprocessing_asked_of_a_cased_model_lowercases_and_warns(mini_dir,  # noqa: F811
                                                                              tmp_path, capsys):
    run = tmp_path / "cased"
    assert main(["train", "--dataset", "multi30k", "--data-dir", str(mini_dir), "--cased",
                 "--min-freq", "1", "--max-steps", "2", "--max-tokens", "80", "--out",
                 str(run)] + TINY) == 0
    capsys.readouterr()
    assert main(["translate", "--checkpoint", str(run / "last"), "--preprocess", "moses",
                 "A man runs."]) == 0
    err = capsys.readouterr().err
    assert "--preprocess: 'moses' input" in err
    assert "--cased/--lowercase: lowercased input" in err and "trained on cased text" in err
