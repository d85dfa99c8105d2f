"""Translation as a task of the training loop: sentence pairs, the length-bucketed sampler, the
label-smoothed cross-entropy, greedy validation scored by exact match and BLEU::

    task = TranslationTask(vocabs, train_pairs, valid_pairs, batch_size=64, label_smoothing=0.1)
    trainer = Trainer(model, task, TrainConfig(epochs=10))
    # or both at once, the task's knobs taken from the TrainConfig:
    trainer = translation_trainer(model, vocabs, train_pairs, valid_pairs, TrainConfig(epochs=10))

``train_pairs``/``valid_pairs`` are (source text, target text) pairs, tokenised by ``tokenize``;
``vocabs`` is the model's ``Vocabularies`` (a source and a target vocabulary, or one joint one).
"""
import warnings
import zlib

import numpy as np

from ..configs import TransformerConfig
from ..data.batching import Batch, BatchSampler, iterate_batches, make_batch
from ..data.vocab import Vocabularies
from ..decoding.translator import Translator, whitespace_tokenize
from ..loss import cross_entropy
from ..registry import build_model
from .metrics import corpus_bleu, exact_match
from .task import Task
from .trainer import TrainConfig, Trainer


class TranslationTask(Task):
    """Trains an encoder-decoder on (source, target) text pairs (see ``npformer.training.task``)."""

    name = "translation"
    metrics = ("exact_match", "bleu", "loss")
    minimize = ("loss",)
    batch_type = Batch

    def __init__(self, vocabs, train_pairs, valid_pairs=None, tokenize=whitespace_tokenize,
                 detokenize=" ".join, bleu=None, batch_size=64, max_tokens=None,
                 label_smoothing=0.0, seed=0, bucket_size=1000):
        """``bleu(hypotheses, target_texts) -> float`` scores validation translations (default:
        sacrebleu on the re-tokenised targets). Batches hold ``batch_size`` pairs, or about
        ``max_tokens`` padded source + target tokens when that is given, of similar lengths
        within buckets of ``bucket_size`` pairs (None: the whole set), in an order drawn from
        ``seed`` (``npformer.data.BatchSampler``)."""
        Vocabularies.check_fits(vocabs, {})      # a Vocabularies (sizes: check_model)
        self.vocabs, self.tokenize, self.detokenize, self.bleu = vocabs, tokenize, detokenize, bleu
        self.label_smoothing = label_smoothing
        self.train_pairs, self.valid_pairs = list(train_pairs), list(valid_pairs or [])
        if not self.train_pairs:
            raise ValueError("train_pairs: expected at least one (source, target) pair, got none")
        self.train_ids = self.encode_pairs(self.train_pairs, "train_pairs")
        self.valid_ids = self.encode_pairs(self.valid_pairs, "valid_pairs")
        self.has_validation = bool(self.valid_pairs)
        tgt = vocabs.tgt
        self.pad, self.bos, self.eos = tgt.pad_id, tgt.bos_id, tgt.eos_id
        size = {"max_tokens": max_tokens} if max_tokens is not None else {"batch_size": batch_size}
        self.sampler = BatchSampler.from_pairs(self.train_ids, seed=seed, bucket_size=bucket_size,
                                               **size)
        self._hypotheses = []                   # of the latest evaluate, for examples()

    # -- data ----------------------------------------------------------------------------------
    def encode_pairs(self, pairs, name):
        out = []
        for n, pair in enumerate(pairs):
            if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
                raise ValueError(f"{name}[{n}]: expected a (source, target) pair of strings, got {pair!r:.60}")
            src, tgt = (self.tokenize(pair[0]), self.tokenize(pair[1]))
            if not src or not tgt:
                raise ValueError(f"{name}[{n}]: expected non-empty source and target, got {pair!r:.60}")
            out.append((self.vocabs.src.encode(src), self.vocabs.tgt.encode(tgt)))
        return out

    def check_model(self, model):
        """The vocabularies must have the model's sizes, and every pair fit its ``max_len``."""
        Vocabularies.check_fits(self.vocabs, model.config.vocab_sizes(), pad_id=model.config.pad_id)
        max_len = model.max_len
        for name, ids in (("train_pairs", self.train_ids), ("valid_pairs", self.valid_ids)):
            for n, (src, tgt) in enumerate(ids):
                if len(src) > max_len or len(tgt) + 1 > max_len:
                    raise ValueError(f"{name}[{n}]: {len(src)} source / {len(tgt)} target tokens "
                                     f"exceed max_len={max_len} (target counts <eos>)")

    def batches_per_epoch(self):
        return len(self.sampler)

    def batches(self, epoch):
        self.sampler.set_epoch(epoch)
        return iterate_batches(self.train_ids, self.sampler, self.pad, self.bos, self.eos)

    def batches_done(self):
        return self.sampler.state_dict()["batches_done"]

    def state_dict(self):
        return self.sampler.state_dict()

    def load_state_dict(self, state):
        self.sampler.load_state_dict(state)

    def fingerprint(self):
        """CRC-32 of the token ids of every training and validation pair, in order. A resume
        compares it with the checkpoint's, so the same options over other text (same line
        lengths or not) cannot continue a run."""
        crc = 0
        for pairs in (self.train_ids, self.valid_ids):
            for src, tgt in pairs:
                crc = zlib.crc32(np.asarray(tgt, dtype=np.int64).tobytes(),
                                 zlib.crc32(np.asarray(src, dtype=np.int64).tobytes(), crc))
            crc = zlib.crc32(b"|", crc)          # the split between training and validation
        return crc

    # -- the loss ------------------------------------------------------------------------------
    def tokens(self, batch):
        return batch.n_tgt_tokens

    def padded_tokens(self, batch):
        return batch.src.size + batch.tgt_out.size

    def loss_and_backward(self, model, batch, weight):
        scored = batch.tgt_out != self.pad                              # (B, T): real targets
        logits = model.forward(batch.src, batch.tgt_in, logits_mask=scored)     # (N, V)
        mean, dlogits = cross_entropy(logits, batch.tgt_out[scored],
                                      label_smoothing=self.label_smoothing)
        if weight != 1.0:
            dlogits *= weight                    # this batch's share of the update's tokens
        model.backward(dlogits)                  # adds into every .grad
        # the loop divides it by the count again: exactly the mean back where the mean is a
        # float32 (24 bits times a count below 2**29 fit a float64), within an ulp otherwise
        return float(mean) * batch.n_tgt_tokens

    # -- validation ----------------------------------------------------------------------------
    def translator(self, model):
        return Translator(model, self.vocabs, self.tokenize, self.detokenize)

    def evaluate(self, model, pairs=None, batch_size=64):
        """{'loss', 'exact_match', 'bleu'} on the validation pairs (or ``pairs``), greedy."""
        pairs = self.valid_pairs if pairs is None else pairs
        ids = self.valid_ids if pairs is self.valid_pairs else self.encode_pairs(pairs, "pairs")
        total, count = 0.0, 0
        for start in range(0, len(ids), batch_size):
            chunk = ids[start:start + batch_size]
            b = make_batch([s for s, _ in chunk], [t for _, t in chunk], self.pad, self.bos, self.eos)
            scored = b.tgt_out != self.pad
            logits = model.forward(b.src, b.tgt_in, logits_mask=scored)
            loss, _ = cross_entropy(logits, b.tgt_out[scored])
            total += float(loss) * b.n_tgt_tokens
            count += b.n_tgt_tokens
        with warnings.catch_warnings():          # real data: many sentences hold unknown words
            warnings.filterwarnings("ignore", message=".*unknown words mapped to <unk>")
            hyps = [t.text for t in self.translator(model).translate([s for s, _ in pairs])]
        self._hypotheses = list(zip((s for s, _ in pairs), hyps))
        refs = [self.detokenize(self.tokenize(t)) for _, t in pairs]
        bleu = self.bleu(hyps, [t for _, t in pairs]) if self.bleu else corpus_bleu(hyps, refs)
        return {"loss": total / count, "exact_match": exact_match(hyps, refs), "bleu": bleu}

    def examples(self, n=3):
        return [f"{src} -> {hyp}" for src, hyp in self._hypotheses[:n]]


def recipe_trainer(vocabs, train_pairs, valid_pairs, model_defaults, train_defaults,
                   model_kwargs=None, train_kwargs=None, seed=0, **task_kwargs):
    """What every recipe builds: a Transformer sized by ``vocabs`` from ``model_defaults``
    overridden by ``model_kwargs``, a ``TrainConfig`` from ``train_defaults`` overridden by
    ``train_kwargs`` (both seeded by ``seed``), and their ``translation_trainer``
    (``task_kwargs``: tokenize, detokenize, bleu, extra)."""
    model = build_model(TransformerConfig(
        src_vocab_size=len(vocabs.src), tgt_vocab_size=len(vocabs.tgt),
        **{**model_defaults, "seed": seed, **(model_kwargs or {})}))
    config = TrainConfig(**{**train_defaults, "seed": seed, **(train_kwargs or {})})
    return translation_trainer(model, vocabs, train_pairs, valid_pairs, config, **task_kwargs)


def translation_trainer(model, vocabs, train_pairs, valid_pairs=None, config=None,
                        tokenize=whitespace_tokenize, detokenize=" ".join, bleu=None, extra=None):
    """A ``Trainer`` of ``model`` on a ``TranslationTask`` whose batching (``batch_size`` or
    ``max_tokens``, ``bucket_size``), label smoothing and seed come from ``config`` (a
    ``TrainConfig``)."""
    config = config or TrainConfig()
    task = TranslationTask(vocabs, train_pairs, valid_pairs, tokenize, detokenize, bleu,
                           batch_size=config.batch_size, max_tokens=config.max_tokens,
                           label_smoothing=config.label_smoothing, seed=config.seed,
                           bucket_size=config.bucket_size)
    return Trainer(model, task, config, extra=extra)
