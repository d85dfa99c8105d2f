"""The Multi30k German<->English recipe behind ``npformer train --dataset multi30k`` and
``npformer eval --dataset multi30k``: data, tokenisation, vocabularies, model, trainer, scoring.

    data = load_multi30k(None, src="de", tgt="en")      # npformer download multi30k's folder
    trainer = build_trainer(data, train_kwargs={"time_budget": 60 * 60, "out_dir": "runs/de-en"})
    trainer.fit()
    # or both steps from the command line's options (and a checkpoint to resume), in one call:
    trainer, data = multi30k_trainer(None, "de", "en", subword=8000)
    scores = evaluate_checkpoint(load_model_checkpoint("runs/de-en/best"), None, "test_2016_flickr")

Tokenisation is the project's word tokenizer (``npformer.data.tokenize``), lowercased by default;
the model translates lowercased, tokenised text, and its output is detokenised before sacrebleu
scores it against the RAW references (see docs/multi30k.md for the choice and its effect on BLEU).
``preprocess="moses"`` (the Transformer-Tiny preset's) replaces the word tokenizer by the papers'
preprocessing (``npformer.data.moses``: Moses punctuation normalisation, lowercasing, the Moses
tokenizer with its escaping), applied to the training and validation text once, per language;
the output then goes back to text by the Moses detokenizer, and validation BLEU is the papers'
(tokenised text against tokenised references).
The languages and the tokenizer settings are saved in every checkpoint (metadata ``extra``), so
evaluation and translation need only the checkpoint. With ``subword=N`` the words are further
split into pieces by a joint SentencePiece model of N pieces (``npformer.data.subword``), whose
bytes the checkpoint carries too; both languages then share one joint vocabulary of its pieces.
"""
import functools
import time
import warnings
from dataclasses import dataclass

from ..configs import TransformerConfig
from ..data.multi30k import LANGUAGES, load_split
from ..data.subword import NAME as SUBWORD_TOKENIZER
from ..data.subword import SubwordTokenizer
from ..data.tokenize import detokenize, tokenize
from ..data.vocab import Vocabularies
from ..decoding.translator import Translator, whitespace_tokenize
from ..data.moses import PapersPreprocessor, papers_detokenize, papers_tokenize
from ..data.moses import available as moses_available
from .metrics import corpus_bleu, papers_bleu, sacrebleu_scores
from .translation import recipe_trainer

# 3+3 layers of d_model 256: the size the benchmarks time (BENCHMARKS.md, "base config").
MULTI30K_MODEL = dict(d_model=256, n_heads=8, d_ff=1024, n_encoder_layers=3, n_decoder_layers=3,
                      dropout=0.1, max_len=128)
# a misspelt field or a bad value fails at import
TransformerConfig(src_vocab_size=1, tgt_vocab_size=1, **MULTI30K_MODEL)
# The paper's warm-up schedule (linear warm-up, then 1/sqrt(step)), scaled so that its peak is lr;
# batches of ~5,000 padded tokens; validation (greedy BLEU) every 150 updates; best by BLEU.
MULTI30K_TRAIN = dict(epochs=100, max_tokens=5000, batch_size=64, accum_steps=1, lr=1e-3, warmup_steps=250,
                      schedule="noam", label_smoothing=0.1, clip_norm=1.0, stop_metric="bleu",
                      eval_every_steps=150, log_every=20, betas=(0.9, 0.98))
TOKENIZER = "npformer-word"
# --preprocess: how raw text becomes the tokens that the units (words or pieces) are made from:
# the project's word tokenizer, or the papers' preprocessing (npformer.data.moses)
PREPROCESS = ("npformer", "moses")
# the name a checkpoint records for (preprocess, subword units or not)
TOKENIZERS = {("npformer", False): TOKENIZER, ("npformer", True): SUBWORD_TOKENIZER,
              ("moses", False): "moses", ("moses", True): "moses+sentencepiece"}

# Transformer-Tiny (fairseq's transformer_tiny_wu2021, the text-only baseline of Wu et al. 2021 and
# its successors on Multi30k): 4+4 layers of d_model 128, 4 heads, FFN 256, post-norm, dropout
# 0.3, all three embeddings shared over one joint BPE vocabulary of 10,000 pieces; Adam (0.9,
# 0.98) at 5e-3 with 2,000 inverse-sqrt warm-up updates, label smoothing 0.1, batches of 4,096
# tokens as fairseq counts them, 8,000 updates, no gradient clipping (fairseq's default), a
# checkpoint every epoch and the average of the last 10. Validation (greedy BLEU) every 500
# updates picks "best". Batching as fairseq's: the whole training set sorted by length
# (bucket_size None), then cut into batches of at most 4,096 rows x the longer side; on Multi30k
# that is 122 batches an epoch of ~6,800 real tokens, and npformer's count of rows x (source +
# target) at 7,400 gives the same 122.
# The text is preprocessed as the papers' (Moses normalisation, lowercasing, the Moses tokenizer
# with its escaping) before the joint BPE is learnt on it. Dropout 0.3 is on the embeddings and
# the residual paths only: fairseq's attention_dropout and activation_dropout default to 0. The
# generator has no bias: fairseq's output projection is the shared embedding matrix alone.
TINY_MODEL = dict(d_model=128, n_heads=4, d_ff=256, n_encoder_layers=4, n_decoder_layers=4,
                  dropout=0.3, attention_dropout=0.0, activation_dropout=0.0, max_len=128,
                  share_all_embeddings=True, generator_bias=False)
TransformerConfig(src_vocab_size=1, tgt_vocab_size=1, **TINY_MODEL)        # (as above)
TINY_TRAIN = dict(epochs=1000, max_steps=8000, max_tokens=7400, bucket_size=None, batch_size=64,
                  accum_steps=1,
                  lr=5e-3, warmup_steps=2000, schedule="inverse_sqrt", label_smoothing=0.1,
                  clip_norm=None, stop_metric="bleu", eval_every_steps=500, log_every=20,
                  betas=(0.9, 0.98), save_every_epochs=1, keep_last=10)
# npformer train --dataset multi30k --preset NAME: the model, the training and the units
PRESETS = {"base": dict(model=MULTI30K_MODEL, train=MULTI30K_TRAIN, subword=None,
                        average_last=None, preprocess="npformer"),
           "tiny": dict(model=TINY_MODEL, train=TINY_TRAIN, subword=10000, average_last=10,
                        preprocess="moses")}


@dataclass
class Multi30kData:
    train: list          # (source text, target text): raw, or the papers' tokens (moses)
    valid: list
    vocabs: Vocabularies # one per side over words; one joint vocabulary over subword pieces
    src: str             # language codes
    tgt: str
    lowercase: bool
    subword: SubwordTokenizer = None     # None: words are the units
    preprocess: str = "npformer"         # one of PREPROCESS

    @property
    def extra(self):
        """What a checkpoint must remember to translate and score like this run."""
        return checkpoint_extra(self.src, self.tgt, self.lowercase, self.subword, self.preprocess)

    def tokenizers(self):
        """(tokenize, detokenize) of this data's units (the papers' preprocessing has been
        applied to the pairs already: its units come from whitespace-separated tokens)."""
        if self.subword is not None:
            return self.subword.tokenize, self.subword.detokenize
        if self.preprocess == "moses":
            return whitespace_tokenize, " ".join
        return make_tokenizer(self.lowercase), detokenize

    def validation_bleu(self):
        """Validation BLEU ``(hypotheses, target texts) -> float`` for this data's text."""
        return bleu_tokenised if self.preprocess == "moses" else bleu_against_raw


def checkpoint_extra(src, tgt, lowercase, subword=None, preprocess="npformer"):
    """The text settings a run's checkpoints carry in their metadata ``extra`` (the tokenizer's
    name says the preprocessing: ``checkpoint_preprocess``)."""
    settings = {"dataset": "multi30k", "src_lang": src, "tgt_lang": tgt,
                "tokenizer": TOKENIZERS[preprocess, subword is not None],
                "lowercase": bool(lowercase)}
    if subword is not None:
        settings.update(subword_pieces=len(subword), subword_model=subword.to_text())
    return settings


def make_tokenizer(lowercase=True):
    """``tokenize`` with the lowercase setting fixed (a picklable callable)."""
    return functools.partial(tokenize, lowercase=bool(lowercase))


def _check_count(name, value):
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ValueError(f"{name}: expected a positive integer or None, got {value!r}")


def load_multi30k(data_dir=None, src="de", tgt="en", lowercase=True, min_freq=2, subset=None,
                  valid_subset=None, subword=None, vocabs=None, preprocess="npformer"):
    """Training/validation pairs and vocabularies (built on the training pairs only).

    ``subset`` keeps the first N training pairs, ``valid_subset`` the first N of ``val``.
    ``subword`` (an int N) learns a joint SentencePiece model of N pieces on both sides of the
    training pairs and uses its pieces as the units (needs the sentencepiece package); it may
    also be a ``SubwordTokenizer`` already learnt (a resumed run's, whose ``lowercase`` then
    holds). Words get one vocabulary per language; a joint subword model gives one joint
    vocabulary (``Vocabularies.joint``). ``vocabs``, if given, is used instead of building any
    (a resumed run's). ``preprocess="moses"`` turns every pair into the papers' tokens first
    (``npformer.data.moses``; lowercased, so ``lowercase`` must be True; needs sacremoses).
    Loader errors (missing folder or split, corrupt gzip, bad UTF-8, line counts) pass through.
    """
    check_preprocess(preprocess, lowercase)
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
    if preprocess == "moses":
        train, valid = (papers_pairs(pairs, src, tgt) for pairs in (train, valid))
    pieces = subword if isinstance(subword, SubwordTokenizer) else None
    if pieces is not None and pieces.pretokenized != (preprocess == "moses"):
        raise ValueError(f"subword: a SubwordTokenizer {'of' if pieces.pretokenized else 'without'} "
                         f"pretokenized text does not go with preprocess {preprocess!r}")
    if pieces is not None:
        lowercase = pieces.lowercase
    elif subword is not None:
        pieces = SubwordTokenizer.train([s for s, _ in train] + [t for _, t in train], subword,
                                        lowercase=lowercase, pretokenized=preprocess == "moses")
    data = Multi30kData(train, valid, vocabs, src, tgt, bool(lowercase), pieces, preprocess)
    if vocabs is None:
        tok = data.tokenizers()[0]
        data.vocabs = Vocabularies.build(((tok(s), tok(t)) for s, t in train), min_freq=min_freq,
                                         joint=pieces is not None)
    return data


def multi30k_trainer(data_dir=None, src="de", tgt="en", lowercase=True, min_freq=2, subset=None,
                     valid_subset=None, subword=None, model_kwargs=None, train_kwargs=None,
                     seed=0, extra=None, saved=None, preset="base", preprocess=None):
    """The recipe's ``(Trainer, Multi30kData)`` from its options (those of ``load_multi30k`` and
    ``build_trainer``; ``subword`` and ``preprocess`` None take the preset's). To resume,
    ``saved`` (a ``LoadedCheckpoint``) gives the vocabularies, the subword model and the
    preprocessing; the data is read again and the caller resumes the trainer from ``saved``
    when it is ready to."""
    if subword is None:
        subword = check_preset(preset)["subword"]
    if preprocess is None:
        preprocess = check_preset(preset)["preprocess"]
    if saved is not None:
        subword, vocabs = checkpoint_subword(saved), saved.vocabs
        preprocess = checkpoint_preprocess(saved.meta.get("extra") or {})
    else:
        vocabs = None
    data = load_multi30k(data_dir, src, tgt, lowercase=lowercase, min_freq=min_freq,
                         subset=subset, valid_subset=valid_subset, subword=subword,
                         vocabs=vocabs, preprocess=preprocess)
    if not data.valid:
        raise ValueError(f"data_dir {data_dir or '(default)'}: its val split holds no "
                         f"sentences; training needs validation data")
    return build_trainer(data, model_kwargs, train_kwargs, seed=seed, extra=extra,
                         preset=preset), data


def bleu_against_raw(hypotheses, targets):
    """Validation BLEU: lowercased sacrebleu of detokenised output against the raw targets."""
    return sacrebleu_scores(hypotheses, targets)["bleu"]


def bleu_tokenised(hypotheses, targets):
    """Validation BLEU of a ``preprocess="moses"`` run: its tokenised output against the
    tokenised targets, no further tokenisation (the papers' BLEU on the validation split)."""
    return corpus_bleu(hypotheses, targets, tokenize="none")


def check_preprocess(preprocess, lowercase=True):
    if preprocess not in PREPROCESS:
        raise ValueError(f"preprocess: expected one of {PREPROCESS}, got {preprocess!r}")
    if preprocess == "moses" and not lowercase:
        raise ValueError("preprocess 'moses': the papers' preprocessing lowercases the text, so "
                         "it cannot keep the case (--cased, lowercase=False); preprocess "
                         "'npformer' can")


def papers_pairs(pairs, src, tgt):
    """(source, target) raw pairs -> the papers' tokens of each side, in its language."""
    return list(zip(papers_tokenize([s for s, _ in pairs], src),
                    papers_tokenize([t for _, t in pairs], tgt)))


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
                          detokenize=detokenize_units, bleu=data.validation_bleu(),
                          extra={**(extra or {}), **data.extra})


def is_multi30k(loaded):
    """Whether a loaded checkpoint is a Multi30k model (translates raw text)."""
    extra = loaded.meta.get("extra") or {}
    return extra.get("dataset") == "multi30k" and extra.get("tokenizer") in TOKENIZERS.values()


def checkpoint_preprocess(extra):
    """The preprocessing a checkpoint's metadata ``extra`` names (by its tokenizer, which
    checkpoints older than the option have too): one of PREPROCESS, or None if not Multi30k."""
    for (preprocess, _), name in TOKENIZERS.items():
        if extra.get("tokenizer") == name:
            return preprocess
    return None


def checkpoint_text_settings(loaded):
    """The languages, tokenizer and preprocessing a checkpoint was trained with (ValueError if
    not Multi30k)."""
    extra = loaded.meta.get("extra") or {}
    if not is_multi30k(loaded):
        raise ValueError(f"checkpoint {loaded.path}: not a Multi30k model (its metadata has no "
                         f"dataset 'multi30k' / tokenizer one of {sorted(TOKENIZERS.values())}; got "
                         f"dataset {extra.get('dataset')!r:.40}, tokenizer {extra.get('tokenizer')!r:.40}); "
                         f"evaluate it with --src/--ref instead")
    for key in ("src_lang", "tgt_lang"):
        if extra.get(key) not in LANGUAGES:
            raise ValueError(f"checkpoint {loaded.path}: {key} expected one of {LANGUAGES}, "
                             f"got {extra.get(key)!r}")
    return {**extra, "lowercase": bool(extra.get("lowercase", True)),
            "preprocess": checkpoint_preprocess(extra)}


def checkpoint_subword(loaded):
    """The SentencePiece tokenizer a checkpoint was trained with, or None for word units."""
    extra = loaded.meta.get("extra") or {}
    preprocess = checkpoint_preprocess(extra)
    if preprocess is None or extra["tokenizer"] != TOKENIZERS[preprocess, True]:
        return None
    try:
        return SubwordTokenizer.from_text(extra.get("subword_model"), extra.get("lowercase", True),
                                          pretokenized=preprocess == "moses")
    except ValueError as exc:
        raise ValueError(f"checkpoint {loaded.path}: its subword model is unreadable: {exc}") from None


def text_settings_for(loaded, lowercase=None, preprocess=None):
    """The checkpoint's text settings (``checkpoint_text_settings``) with the caller's explicit
    choices (None: the checkpoint's). A choice that contradicts the checkpoint's is used, with
    a warning naming both: the model only knows the text it was trained on."""
    trained = checkpoint_text_settings(loaded)
    asked = {"preprocess": trained["preprocess"] if preprocess is None else preprocess}
    # the papers' preprocessing lowercases: asked for, it implies lowercasing unless told
    implied = True if asked["preprocess"] == "moses" else trained["lowercase"]
    asked["lowercase"] = implied if lowercase is None else bool(lowercase)
    check_preprocess(asked["preprocess"], asked["lowercase"])
    for key, option in (("preprocess", "--preprocess"), ("lowercase", "--cased/--lowercase")):
        if asked[key] != trained[key]:
            name = {True: "lowercased", False: "cased"}.get(asked[key], repr(asked[key]))
            was = {True: "lowercased", False: "cased"}.get(trained[key], repr(trained[key]))
            warnings.warn(f"{option}: {name} input given to checkpoint {loaded.path}, which was "
                          f"trained on {was} text ({key} {trained[key]!r}); translating with "
                          f"{key} {asked[key]!r} as asked, expect unknown words and a lower "
                          f"score", stacklevel=2)
    return {**trained, **asked}


class TextPipeline:
    """A Multi30k checkpoint's text on both ends: raw source text -> the model's units
    (``tokenize``), its output units -> tokenised text (``tokenised_text``) -> plain text
    (``detokenize_lines``; ``detokenize`` does both).

    The tokens come from the project's word tokenizer or from the papers' preprocessing
    (``settings["preprocess"]``); the units are those tokens or, with ``subword``, its pieces."""

    def __init__(self, settings, subword=None):
        self.preprocess, self.lowercase = settings["preprocess"], settings["lowercase"]
        self.tgt, self.subword = settings["tgt_lang"], subword
        self._papers = PapersPreprocessor(settings["src_lang"]) if self.preprocess == "moses" else None

    def tokenize(self, text):
        tokens = (self._papers(text).split() if self._papers is not None
                  else tokenize(text, lowercase=self.lowercase))
        return self.subword.pieces(tokens) if self.subword is not None else tokens

    def tokenised_text(self, units):
        """Output units -> the tokens as one space-separated line."""
        return " ".join(self.subword.words(units) if self.subword is not None else units)

    def detokenize_lines(self, lines):
        """Tokenised output lines -> plain text lines."""
        if self.preprocess == "moses":
            return papers_detokenize(lines, self.tgt)
        return [detokenize(line.split()) for line in lines]

    def detokenize(self, units):
        return self.detokenize_lines([self.tokenised_text(units)])[0]


def text_pipeline(loaded, settings=None):
    """The ``TextPipeline`` of a Multi30k checkpoint, with ``settings`` (``text_settings_for``)
    or its own."""
    return TextPipeline(settings or checkpoint_text_settings(loaded), checkpoint_subword(loaded))


def make_translator(loaded, tokenize, detokenize, batch_size=None):
    """The ``Translator`` of a loaded checkpoint, or of a CTranslate2 export read back
    (``npformer.ct2.load_exported``: its batches run in CTranslate2). Batches by tokens, of at
    most ``batch_size`` sentences (None: no such limit; see ``Translator``)."""
    make = getattr(loaded, "translator", None)
    if make is not None:
        return make(tokenize, detokenize, batch_size=batch_size)
    return Translator(loaded.model, loaded.vocabs, tokenize, detokenize, batch_size=batch_size)


def translator_for(loaded, batch_size=None, settings=None):
    """A ``Translator`` that tokenises and detokenises as the checkpoint's run did (or as
    ``settings``, from ``text_settings_for``, say)."""
    if not is_multi30k(loaded):                   # toy / files runs: whitespace-tokenised text
        return make_translator(loaded, whitespace_tokenize, " ".join, batch_size)
    pipeline = text_pipeline(loaded, settings)
    return make_translator(loaded, pipeline.tokenize, pipeline.detokenize, batch_size)


def evaluate_checkpoint(loaded, data_dir=None, split="test_2016_flickr", beam=None,
                        length_penalty=0.6, settings=None):
    """Translate a Multi30k split with a loaded checkpoint (greedy, or beam search of width
    ``beam``) and score it with sacrebleu against the raw references. ``settings``: the text
    settings to use (``text_settings_for``; default the checkpoint's).

    Returns ``{"bleu", "bleu_cased", "signature", "signature_cased", "seconds" (translation
    only), "sentences", "unknown_source_tokens", "split", "src", "tgt", "method",
    "hypotheses", "sources", "references"}``, and where sacremoses is installed the papers'
    tokenised BLEU too (``"bleu_papers"``, ``"signature_papers"``: ``metrics.papers_bleu``;
    a model trained on the papers' preprocessing is scored on its tokenised output as it is).
    """
    settings = settings or checkpoint_text_settings(loaded)
    if beam is not None and (not isinstance(beam, int) or isinstance(beam, bool) or beam < 1):
        raise ValueError(f"beam: expected a positive integer or None, got {beam!r}")
    pairs = load_split(data_dir, split, settings["src_lang"], settings["tgt_lang"])
    if not pairs:
        raise ValueError(f"split {split!r}: no sentences in {data_dir}")
    pipeline = text_pipeline(loaded, settings)
    translator = make_translator(loaded, pipeline.tokenize, pipeline.tokenised_text)
    sources = [s for s, _ in pairs]
    start = time.perf_counter()
    with warnings.catch_warnings():              # one summary line instead of a warning per line
        warnings.filterwarnings("ignore", message=".*unknown words mapped to <unk>")
        results = translator.translate(sources, method="beam" if beam else "greedy",
                                       beam_size=beam or 1, length_penalty=length_penalty,
                                       truncate=True)
    seconds = time.perf_counter() - start
    tokenised = [r.text for r in results]
    hyps = pipeline.detokenize_lines(tokenised)
    refs = [t for _, t in pairs]
    scores = sacrebleu_scores(hyps, refs)
    if settings["preprocess"] == "moses":    # the papers' way of counting, beside ours
        scores.update(papers_bleu(tokenised, refs, settings["tgt_lang"], tokenised=True))
    elif moses_available():
        scores.update(papers_bleu(hyps, refs, settings["tgt_lang"]))
    return {**scores, "seconds": seconds, "sentences": len(pairs),
            "unknown_source_tokens": sum(len(r.unknown) for r in results), "split": split,
            "src": settings["src_lang"], "tgt": settings["tgt_lang"],
            "method": f"beam{beam}" if beam else "greedy",
            "hypotheses": hyps, "sources": sources, "references": refs}
