"""The Multi30k German<->English recipe behind ``npformer train --dataset multi30k`` and
``npformer eval --dataset multi30k``: data, tokenisation, vocabularies, model, trainer, scoring.

    data = load_multi30k("../shared/data/multi30k", src="de", tgt="en")
    trainer = build_trainer(data, train_kwargs={"time_budget": 60 * 60, "out_dir": "runs/de-en"})
    trainer.fit()
    # or both steps from the command line's options (and a checkpoint to resume), in one call:
    trainer, data = multi30k_trainer("../shared/data/multi30k", "de", "en", subword=8000)
    scores = evaluate_checkpoint(load_model_checkpoint("runs/de-en/best"), data_dir, "test_2016_flickr")

Tokenisation is the project's word tokenizer (``npformer.data.tokenize``), lowercased by default;
the model translates lowercased, tokenised text, and its output is detokenised before sacrebleu
scores it against the RAW references (see docs/multi30k.md for the choice and its effect on BLEU).
The languages and the tokenizer settings are saved in every checkpoint (metadata ``extra``), so
evaluation and translation need only the checkpoint. With ``subword=N`` the words are further
split into pieces by a joint SentencePiece model of N pieces (``npformer.data.subword``), whose
bytes the checkpoint carries too; both languages then share one joint vocabulary of its pieces.
"""
import functools
import time
import warnings
from dataclasses import dataclass

from ..data.multi30k import LANGUAGES, load_split
from ..data.subword import NAME as SUBWORD_TOKENIZER
from ..data.subword import SubwordTokenizer
from ..data.tokenize import detokenize, tokenize
from ..data.vocab import Vocabularies
from ..decoding.translator import Translator, whitespace_tokenize
from ..data.moses import available as moses_available
from .metrics import papers_bleu, sacrebleu_scores
from .translation import recipe_trainer

# 3+3 layers of d_model 256: the size the benchmarks time (BENCHMARKS.md, "base config").
MULTI30K_MODEL = dict(d_model=256, n_heads=8, d_ff=1024, n_encoder_layers=3, n_decoder_layers=3,
                      dropout=0.1, max_len=128)
# The paper's warm-up schedule (linear warm-up, then 1/sqrt(step)), scaled so that its peak is lr;
# batches of ~5,000 padded tokens; validation (greedy BLEU) every 150 updates; best by BLEU.
MULTI30K_TRAIN = dict(epochs=100, max_tokens=5000, batch_size=64, accum_steps=1, lr=1e-3, warmup_steps=250,
                      schedule="noam", label_smoothing=0.1, clip_norm=1.0, stop_metric="bleu",
                      eval_every_steps=150, log_every=20, betas=(0.9, 0.98))
TOKENIZER = "npformer-word"

# Transformer-Tiny (fairseq's transformer_tiny_wu2021, the text-only baseline of Wu et al. 2021 and
# its successors on Multi30k): 4+4 layers of d_model 128, 4 heads, FFN 256, post-norm, dropout
# 0.3, all three embeddings shared over one joint BPE vocabulary of 10,000 pieces; Adam (0.9,
# 0.98) at 5e-3 with 2,000 inverse-sqrt warm-up updates, label smoothing 0.1, batches of 4,096
# tokens as fairseq counts them (rows x the longer side; about 8,192 as npformer counts rows x
# (source + target)), 8,000 updates, no gradient clipping (fairseq's default), a checkpoint every
# epoch and the average of the last 10. Validation (greedy BLEU) every 500 updates picks "best".
# One difference stays: npformer applies its one dropout rate to the attention weights and the
# feed-forward activations too, where fairseq's recipe drops only the residual paths.
TINY_MODEL = dict(d_model=128, n_heads=4, d_ff=256, n_encoder_layers=4, n_decoder_layers=4,
                  dropout=0.3, max_len=128, share_all_embeddings=True)
TINY_TRAIN = dict(epochs=1000, max_steps=8000, max_tokens=8192, batch_size=64, accum_steps=1,
                  lr=5e-3, warmup_steps=2000, schedule="inverse_sqrt", label_smoothing=0.1,
                  clip_norm=None, stop_metric="bleu", eval_every_steps=500, log_every=20,
                  betas=(0.9, 0.98), save_every_epochs=1, keep_last=10)
# npformer train --dataset multi30k --preset NAME: the model, the training and the units
PRESETS = {"base": dict(model=MULTI30K_MODEL, train=MULTI30K_TRAIN, subword=None,
                        average_last=None),
           "tiny": dict(model=TINY_MODEL, train=TINY_TRAIN, subword=10000, average_last=10)}


@dataclass
class Multi30kData:
    train: list          # (source text, target text), raw
    valid: list
    vocabs: Vocabularies # one per side over words; one joint vocabulary over subword pieces
    src: str             # language codes
    tgt: str
    lowercase: bool
    subword: SubwordTokenizer = None     # None: words are the units

    @property
    def extra(self):
        """What a checkpoint must remember to translate and score like this run."""
        return text_settings(self.src, self.tgt, self.lowercase, self.subword)

    def tokenizers(self):
        """(tokenize, detokenize) of this data's units."""
        if self.subword is not None:
            return self.subword.tokenize, self.subword.detokenize
        return make_tokenizer(self.lowercase), detokenize


def text_settings(src, tgt, lowercase, subword=None):
    settings = {"dataset": "multi30k", "src_lang": src, "tgt_lang": tgt, "tokenizer": TOKENIZER,
                "lowercase": bool(lowercase)}
    if subword is not None:
        settings.update(tokenizer=SUBWORD_TOKENIZER, subword_pieces=len(subword),
                        subword_model=subword.to_text())
    return settings


def make_tokenizer(lowercase=True):
    """``tokenize`` with the lowercase setting fixed (a picklable callable)."""
    return functools.partial(tokenize, lowercase=bool(lowercase))


def _check_count(name, value):
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ValueError(f"{name}: expected a positive integer or None, got {value!r}")


def load_multi30k(data_dir=None, src="de", tgt="en", lowercase=True, min_freq=2, subset=None,
                  valid_subset=None, subword=None, vocabs=None):
    """Training/validation pairs and vocabularies (built on the training pairs only).

    ``subset`` keeps the first N training pairs, ``valid_subset`` the first N of ``val``.
    ``subword`` (an int N) learns a joint SentencePiece model of N pieces on both sides of the
    training pairs and uses its pieces as the units (needs the sentencepiece package); it may
    also be a ``SubwordTokenizer`` already learnt (a resumed run's, whose ``lowercase`` then
    holds). Words get one vocabulary per language; a joint subword model gives one joint
    vocabulary (``Vocabularies.joint``). ``vocabs``, if given, is used instead of building any
    (a resumed run's). Loader errors (missing folder or split, corrupt gzip, bad UTF-8, line
    counts) pass through.
    """
    _check_count("subset", subset)
    _check_count("valid_subset", valid_subset)
    if not isinstance(subword, SubwordTokenizer):
        _check_count("subword", subword)
        if subword is not None and subword < 16:
            raise ValueError(f"subword: expected at least 16 pieces, got {subword}")
    train = load_split(data_dir, "train", src, tgt)
    valid = load_split(data_dir, "val", src, tgt)
    if subset is not None:
        train = train[:subset]
    if valid_subset is not None:
        valid = valid[:valid_subset]
    pieces = subword if isinstance(subword, SubwordTokenizer) else None
    if pieces is not None:
        lowercase = pieces.lowercase
    elif subword is not None:
        pieces = SubwordTokenizer.train([s for s, _ in train] + [t for _, t in train], subword,
                                        lowercase=lowercase)
    data = Multi30kData(train, valid, vocabs, src, tgt, bool(lowercase), pieces)
    if vocabs is None:
        tok = data.tokenizers()[0]
        data.vocabs = Vocabularies.build(((tok(s), tok(t)) for s, t in train), min_freq=min_freq,
                                         joint=pieces is not None)
    return data


def multi30k_trainer(data_dir=None, src="de", tgt="en", lowercase=True, min_freq=2, subset=None,
                     valid_subset=None, subword=None, model_kwargs=None, train_kwargs=None,
                     seed=0, extra=None, saved=None, preset="base"):
    """The recipe's ``(Trainer, Multi30kData)`` from its options (those of ``load_multi30k`` and
    ``build_trainer``; ``subword`` None takes the preset's units). To resume, ``saved`` (a
    ``LoadedCheckpoint``) gives the vocabularies and the subword model; the data is read again
    and the caller resumes the trainer from ``saved`` when it is ready to."""
    if subword is None:
        subword = check_preset(preset)["subword"]
    if saved is not None:
        subword, vocabs = checkpoint_subword(saved), saved.vocabs
    else:
        vocabs = None
    data = load_multi30k(data_dir, src, tgt, lowercase=lowercase, min_freq=min_freq,
                         subset=subset, valid_subset=valid_subset, subword=subword,
                         vocabs=vocabs)
    if not data.valid:
        raise ValueError(f"data_dir {data_dir or '(default)'}: its val split holds no "
                         f"sentences; training needs validation data")
    return build_trainer(data, model_kwargs, train_kwargs, seed=seed, extra=extra,
                         preset=preset), data


def bleu_against_raw(hypotheses, targets):
    """Validation BLEU: lowercased sacrebleu of detokenised output against the raw targets."""
    return sacrebleu_scores(hypotheses, targets)["bleu"]


def check_preset(name):
    if name not in PRESETS:
        raise ValueError(f"preset: expected one of {sorted(PRESETS)}, got {name!r}")
    return PRESETS[name]


def build_trainer(data, model_kwargs=None, train_kwargs=None, seed=0, extra=None, preset="base"):
    """A ``Trainer`` for ``data`` with the defaults of ``preset`` (``PRESETS``), overridden by the
    kwargs. ``extra`` adds to the metadata every checkpoint carries (beside the text settings)."""
    defaults = check_preset(preset)
    tokenize, detokenize_units = data.tokenizers()
    return recipe_trainer(data.vocabs, data.train, data.valid, defaults["model"],
                          defaults["train"], model_kwargs, train_kwargs, seed, tokenize=tokenize,
                          detokenize=detokenize_units, bleu=bleu_against_raw,
                          extra={**(extra or {}), **data.extra})


def checkpoint_text_settings(loaded):
    """The languages and tokenizer a checkpoint was trained with (ValueError if not Multi30k)."""
    extra = loaded.meta.get("extra") or {}
    if extra.get("dataset") != "multi30k" or extra.get("tokenizer") not in (TOKENIZER,
                                                                           SUBWORD_TOKENIZER):
        raise ValueError(f"checkpoint {loaded.path}: not a Multi30k model (its metadata has no "
                         f"dataset 'multi30k' / tokenizer {TOKENIZER!r} or {SUBWORD_TOKENIZER!r}; got "
                         f"dataset {extra.get('dataset')!r:.40}, tokenizer {extra.get('tokenizer')!r:.40}); "
                         f"evaluate it with --src/--ref instead")
    for key in ("src_lang", "tgt_lang"):
        if extra.get(key) not in LANGUAGES:
            raise ValueError(f"checkpoint {loaded.path}: {key} expected one of {LANGUAGES}, "
                             f"got {extra.get(key)!r}")
    return extra


def checkpoint_subword(loaded):
    """The SentencePiece tokenizer a checkpoint was trained with, or None for word units."""
    extra = loaded.meta.get("extra") or {}
    if extra.get("tokenizer") != SUBWORD_TOKENIZER:
        return None
    try:
        return SubwordTokenizer.from_text(extra.get("subword_model"), extra.get("lowercase", True))
    except ValueError as exc:
        raise ValueError(f"checkpoint {loaded.path}: its subword model is unreadable: {exc}") from None


def translator_for(loaded, batch_size=200):
    """A ``Translator`` that tokenises and detokenises as the checkpoint's run did."""
    extra = loaded.meta.get("extra") or {}
    if extra.get("tokenizer") == TOKENIZER:
        tok, detok = make_tokenizer(extra.get("lowercase", True)), detokenize
    elif extra.get("tokenizer") == SUBWORD_TOKENIZER:
        pieces = checkpoint_subword(loaded)
        tok, detok = pieces.tokenize, pieces.detokenize
    else:                                         # toy / files runs: whitespace-tokenised text
        tok, detok = whitespace_tokenize, " ".join
    return Translator(loaded.model, loaded.vocabs, tok, detok, batch_size=batch_size)


def evaluate_checkpoint(loaded, data_dir=None, split="test_2016_flickr", beam=None,
                        length_penalty=0.6):
    """Translate a Multi30k split with a loaded checkpoint (greedy, or beam search of width
    ``beam``) and score it with sacrebleu against the raw references.

    Returns ``{"bleu", "bleu_cased", "signature", "signature_cased", "seconds" (translation
    only), "sentences", "unknown_source_tokens", "split", "src", "tgt", "method",
    "hypotheses", "sources", "references"}``, and where sacremoses is installed the papers'
    tokenised BLEU too (``"bleu_papers"``, ``"signature_papers"``: ``metrics.papers_bleu``).
    """
    extra = checkpoint_text_settings(loaded)
    if beam is not None and (not isinstance(beam, int) or isinstance(beam, bool) or beam < 1):
        raise ValueError(f"beam: expected a positive integer or None, got {beam!r}")
    pairs = load_split(data_dir, split, extra["src_lang"], extra["tgt_lang"])
    if not pairs:
        raise ValueError(f"split {split!r}: no sentences in {data_dir}")
    translator = translator_for(loaded)
    sources = [s for s, _ in pairs]
    start = time.perf_counter()
    with warnings.catch_warnings():              # one summary line instead of a warning per line
        warnings.filterwarnings("ignore", message=".*unknown words mapped to <unk>")
        results = translator.translate(sources, method="beam" if beam else "greedy",
                                       beam_size=beam or 1, length_penalty=length_penalty,
                                       truncate=True)
    seconds = time.perf_counter() - start
    hyps = [r.text for r in results]
    refs = [t for _, t in pairs]
    scores = sacrebleu_scores(hyps, refs)
    if moses_available():                    # the papers' way of counting, beside ours
        scores.update(papers_bleu(hyps, refs, extra["tgt_lang"]))
    return {**scores, "seconds": seconds, "sentences": len(pairs),
            "unknown_source_tokens": sum(len(r.unknown) for r in results), "split": split,
            "src": extra["src_lang"], "tgt": extra["tgt_lang"],
            "method": f"beam{beam}" if beam else "greedy",
            "hypotheses": hyps, "sources": sources, "references": refs}
