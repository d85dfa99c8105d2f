"""Language modelling as a task of the training loop: next-token prediction over one long text.

    tokenizer = CharTokenizer.from_text(text)            # or hf.TextTokenizer(folder)
    train_ids, valid_ids = split_ids(tokenizer.encode(text), context=128)
    task = LanguageModelTask(train_ids, valid_ids, context=128, batch_size=64,
                             tokenizer=tokenizer, vocabs=Vocabularies.joint(tokenizer.vocab))
    Trainer(GPT(len(tokenizer), ...), task, TrainConfig(...)).fit()

**Training batches** are ``batch_size`` windows of ``context`` tokens at random places of the
training split; the targets are the same windows shifted by one token. Where batch ``i`` of
epoch ``e`` starts is drawn from a generator seeded by ``(seed, e, i)``, so a resumed run draws
the very windows the uninterrupted run would have. An epoch is as many batches as hold the
training split's tokens once (``len(train) // (batch_size * context)``, at least 1).

**The validation loss** is the mean cross-entropy, in nats per token (per character for a
character vocabulary), over the *whole* validation split: it is cut into fixed, non-overlapping
windows of ``context`` tokens (the last one shorter), every token after the first is predicted
once, from the tokens before it in its window. Not a random-batch estimate: the same weights
give the same number every time.

**Samples.** After each validation the model continues the validation split's first token for
``sample_tokens`` tokens (temperature ``sample_temperature``, a generator seeded by ``seed``):
``examples()`` returns the text, which the metrics log keeps beside the loss. By default it is
``SAMPLE_TOKENS`` tokens, fewer where the prompt and the sample would not fit the context
(``context - 1`` after the one-token prompt): every token is then one cached decoding step,
where a sample past the context slides its window and recomputes every position of it for
each token.
"""
import os
import zlib
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .. import families
from ..configs import GPTConfig
from ..data.characters import CharTokenizer
from ..data.textfile import read_text
from ..data.vocab import Vocabularies
from ..decoding.search import sample_search
from ..hf import TextTokenizer, from_pretrained, model_folder, read_model_config
from ..lora import apply as apply_lora
from ..loss import cross_entropy
from ..nn.gpt import GPT
from ..parts import FFNS
from ..validation import check_int, check_real
from .checkpointing import load_model_checkpoint
from .task import Task
from .trainer import TrainConfig, Trainer

VALID_FRACTION = 0.1                 # the last tenth of the text, as nanoGPT's shakespeare_char
EVAL_LOGITS = 1 << 25               # logits (rows x positions x vocabulary) per validation batch
SAMPLE_TOKENS = 200                 # a validation's sample at most, by default


class LMBatch(NamedTuple):
    inputs: np.ndarray               # (B, T) int64 token ids
    targets: np.ndarray              # (B, T) int64: inputs shifted by one token


def split_ids(ids, context, valid_fraction=VALID_FRACTION, name="text"):
    """(train, valid): the first ``1 - valid_fraction`` of ``ids`` and the rest. Each must hold
    at least one window of ``context`` tokens and its next token: ``ValueError`` naming ``name``
    (the file) and the length needed otherwise."""
    ids = np.asarray(ids, dtype=np.int64)
    n_valid = int(round(len(ids) * valid_fraction))
    train, valid = ids[:len(ids) - n_valid], ids[len(ids) - n_valid:]
    need = context + 1
    if min(len(train), len(valid)) < need:
        total = int(np.ceil(need / min(valid_fraction, 1 - valid_fraction)))
        raise ValueError(f"{name}: {len(ids):,} tokens is too short for a context of {context}: "
                         f"the training ({len(train):,}) and validation ({len(valid):,}, the last "
                         f"{valid_fraction:.0%}) splits need {need} tokens each (two context "
                         f"windows and more: about {total:,} tokens in all); give a longer text "
                         f"or a smaller --context")
    return train, valid


class LanguageModelTask(Task):
    """Trains a decoder-only model (``npformer.GPT``) on one token stream (module docstring)."""

    name = "language_model"
    metrics = ("val_loss",)
    minimize = ("val_loss",)
    batch_type = LMBatch

    def __init__(self, train_ids, valid_ids, context, batch_size=64, seed=0, tokenizer=None,
                 vocabs=None, sample_tokens=None, sample_temperature=0.8):
        """``tokenizer`` (``encode``/``decode``; optional) turns samples into text; ``vocabs``
        (a ``Vocabularies``, or None for a tokenizer of its own such as GPT-2's) is saved in
        every checkpoint."""
        self.context, self.batch_size = check_int("context", context), check_int("batch_size", batch_size)
        self.seed = check_int("seed", seed, minimum=0)
        self.train_ids = np.ascontiguousarray(train_ids, dtype=np.int64)
        self.valid_ids = np.ascontiguousarray(valid_ids, dtype=np.int64)
        if len(self.train_ids) < self.context + 1:
            raise ValueError(f"train_ids: expected at least context + 1 = {self.context + 1} "
                             f"tokens, got {len(self.train_ids)}")
        self.has_validation = len(self.valid_ids) >= 2
        self.tokenizer, self.vocabs = tokenizer, vocabs
        self.sample_tokens = (min(SAMPLE_TOKENS, self.context - 1) if sample_tokens is None
                              else check_int("sample_tokens", sample_tokens, minimum=0))
        self.sample_temperature = check_real("sample_temperature", sample_temperature, minimum=0,
                                             min_open=True)
        self._epoch, self._done, self._sample = 0, 0, None

    def check_model(self, model):
        """The model predicts over a vocabulary that holds every id, and sees ``context``
        positions."""
        config = model.config
        if getattr(config, "capability", None) != "causal_lm":
            raise ValueError(f"model: the {self.name} task trains a decoder-only model (npformer."
                             f"GPT), got a {type(model).__name__}")
        if self.vocabs is not None and len(self.vocabs.tgt) != config.vocab_size:
            raise ValueError(f"vocabs: the vocabulary has {len(self.vocabs.tgt)} tokens but the "
                             f"model's configuration says vocab_size={config.vocab_size}")
        if hasattr(self.tokenizer, "check_fits"):          # a tokenizer.json: whole, not per id
            self.tokenizer.check_fits(config.vocab_size, "the model's configuration")
        top = max(int(self.train_ids.max()), int(self.valid_ids.max(initial=0)))
        if top >= config.vocab_size:
            raise ValueError(f"train_ids/valid_ids: token id {top} is outside the model's "
                             f"vocabulary of {config.vocab_size}")
        if self.context > model.max_len:
            raise ValueError(f"context: {self.context} positions, more than the model's "
                             f"max_len={model.max_len}")

    # -- training batches ---------------------------------------------------------------------
    def batches_per_epoch(self):
        return max(1, len(self.train_ids) // (self.batch_size * self.context))

    def batch(self, epoch, index):
        """Batch ``index`` of ``epoch``: windows at offsets drawn from (seed, epoch, index)."""
        rng = np.random.default_rng([self.seed, epoch, index])
        starts = rng.integers(0, len(self.train_ids) - self.context, size=self.batch_size)
        rows = starts[:, None] + np.arange(self.context)                # (B, T)
        return LMBatch(self.train_ids[rows], self.train_ids[rows + 1])

    def batches(self, epoch):
        if epoch != self._epoch:
            self._epoch, self._done = epoch, 0
        while self._done < self.batches_per_epoch():
            batch = self.batch(epoch, self._done)
            self._done += 1
            yield batch

    def batches_done(self):
        return self._done

    def state_dict(self):
        return {"epoch": self._epoch, "batches_done": self._done, "context": self.context,
                "batch_size": self.batch_size}

    def load_state_dict(self, state):
        """The position inside an epoch; the windows must be the run's (same context and
        batch size), else the resumed run would draw others."""
        for key in ("context", "batch_size"):
            if key in state and state[key] != getattr(self, key):
                raise ValueError(f"{key}: the run drew windows with {key} {state[key]}, this "
                                 f"task has {getattr(self, key)}")
        self._epoch, self._done = int(state["epoch"]), int(state["batches_done"])

    def fingerprint(self):
        """CRC-32 of the training and validation token ids (a resume must see the same)."""
        crc = zlib.crc32(self.train_ids.tobytes())
        return zlib.crc32(self.valid_ids.tobytes(), zlib.crc32(b"|", crc))

    # -- the loss -----------------------------------------------------------------------------
    def tokens(self, batch):
        return batch.targets.size

    def loss_and_backward(self, model, batch, weight):
        logits = model.forward(batch.inputs)                             # (B, T, V)
        mean, dlogits = cross_entropy(logits, batch.targets)
        if weight != 1.0:
            dlogits *= weight                    # this batch's share of the update's tokens
        model.backward(dlogits)
        return float(mean) * batch.targets.size

    # -- validation ---------------------------------------------------------------------------
    def valid_windows(self):
        """The validation split as (start, length) windows of at most ``context`` predicted
        tokens, non-overlapping, covering every token after the first."""
        last = len(self.valid_ids) - 1           # tokens that have a next one
        return [(s, min(self.context, last - s)) for s in range(0, last, self.context)]

    def evaluate(self, model):
        """{'val_loss': mean nats per token over the whole validation split}."""
        if not self.has_validation:
            raise ValueError("valid_ids: the validation split needs at least 2 tokens (one "
                             "predicted from the other)")
        v, total, count = self.valid_ids, 0.0, 0
        windows = self.valid_windows()
        rows = max(1, min(self.batch_size, EVAL_LOGITS // (self.context * model.config.vocab_size)))
        full = [s for s, n in windows if n == self.context]
        groups = [full[i:i + rows] for i in range(0, len(full), rows)]
        groups += [[s] for s, n in windows if n < self.context]              # the short tail
        for starts in groups:
            n = min(self.context, len(v) - 1 - starts[0])
            idx = np.asarray(starts)[:, None] + np.arange(n)
            logits = model.forward(v[idx])
            loss, _ = cross_entropy(logits, v[idx + 1])
            total += float(loss) * idx.size
            count += idx.size
        self._sample = self.sample(model) if self.tokenizer and self.sample_tokens else None
        return {"val_loss": total / count}

    def sample(self, model, prompt=None):
        """``sample_tokens`` tokens after ``prompt`` (default: the validation split's first
        token), drawn with a generator seeded by the task's seed; returns the text."""
        prompt = self.valid_ids[:1] if prompt is None else np.asarray(prompt, dtype=np.int64)
        # caches for the prompt and the sample, not for the model's whole context (a Llama's
        # max_position_embeddings is 131,072): past it, the state slides
        capacity = min(model.max_len, len(prompt) + self.sample_tokens)
        state = model.decoder_state(prompt[None, :], eos_id=getattr(model, "eos_id", None),
                                    capacity=capacity, slide=True)
        hyp, = sample_search(state, temperature=self.sample_temperature,
                             max_new_tokens=self.sample_tokens, rng=np.random.default_rng(self.seed))
        return self.tokenizer.decode(list(prompt) + list(hyp.ids))

    def examples(self, n=3):
        return [] if self._sample is None else [self._sample]


# -- the recipe of ``npformer lm`` ----------------------------------------------------------------
# A character-level GPT for a text of about a million characters (tinyshakespeare) on a few
# cores: nanoGPT's shakespeare_char settings scaled to the compute of a CPU quarter hour (the
# shape that did best at ~1e14 training FLOPs; BENCHMARKS.md has the runs), with rotary positions
# and dropout 0.1 (together they did better than learned positions with or without dropout),
# AdamW with weight decay on the matrices only, warm-up then a cosine to min_lr, clipping at 1.
#
# Every family's block at the same size and training (``--arch``, one of
# ``npformer.families``): "gpt2", GPT-2's (LayerNorm, a GELU MLP four times as wide, biases),
# "llama", Llama's (RMSNorm, a SwiGLU feed-forward 8/3 as wide, so that its three matrices hold
# as many weights as the MLP's two, no biases), "qwen2" and "qwen3". Only the block fields
# differ: a new architecture is a family's preset of configuration fields, not a class.
# The default is Llama's block: in the same 15 minutes on the same 2 cores it reached a validation
# loss of 1.552 against GPT-2's block's 1.593 (BENCHMARKS.md), ahead at every validation and
# about 15% more updates in the time (no biases, no LayerNorm mean, a narrower feed-forward).
LM_ARCH = "llama"
# --arch's earlier names, which runs recorded before the families named it carry ("gpt": the
# recipe's GPT-2 block); runs recorded before --arch existed trained "gpt" (``migrate_arch``)
ARCH_ALIASES = {"gpt": "gpt2"}
LM_SHAPE = dict(n_layers=4, d_model=192, n_heads=6, max_len=128, dropout=0.1, positions="rotary")


def lm_family(arch):
    """The family (``npformer.families``) that ``--arch`` names, an earlier name
    (``ARCH_ALIASES``) included; ValueError naming ``arch`` and the families otherwise."""
    return families.get(ARCH_ALIASES.get(arch, arch) if isinstance(arch, str) else arch, "arch")


def migrate_arch(recorded):
    """The ``--arch`` of a run's recorded options, by today's name: a run recorded before
    --arch existed trained GPT-2's block ("gpt": it was the only one), one recorded before the
    families named it says "gpt" for "gpt2". (Nothing is read off the model's fields.)"""
    arch = recorded.get("arch", "gpt")
    return ARCH_ALIASES.get(arch, arch)


def lm_d_ff(arch, d_model):
    """The recipe's feed-forward width for ``arch`` at ``d_model``: 4 x d_model for an MLP; for
    a gated feed-forward (SwiGLU's) 8/3 x d_model rounded up to a multiple of 32 (Llama's rule,
    ``multiple_of`` scaled down), the same weight count for its three matrices."""
    if FFNS[lm_family(arch).block.get("ffn", GPTConfig.ffn)].gated:
        return -(-8 * d_model // (3 * 32)) * 32
    return 4 * d_model


def lm_model(arch=LM_ARCH):
    """The recipe's model fields for ``arch`` (a family's name, :func:`lm_family`):
    ``LM_SHAPE``, the family's block fields and name, and its ``d_ff``."""
    family = lm_family(arch)
    return {**LM_SHAPE, "d_ff": lm_d_ff(arch, LM_SHAPE["d_model"]), **family.block,
            "family": family.name}


LM_MODEL = lm_model()               # the default architecture's fields
for _arch in families.names():      # a misspelt field or a value out of range fails at import
    GPTConfig(vocab_size=1, **lm_model(_arch))
LM_TRAIN = dict(epochs=10**6, max_steps=2200, batch_size=32, lr=3e-3, warmup_steps=100,
                schedule="cosine", min_lr=1e-4, optimizer="adamw", betas=(0.9, 0.99),
                weight_decay=0.1, decay="matrices", clip_norm=1.0, label_smoothing=0.0,
                eval_every_steps=300)
INIT_CONTEXT = 256                  # --init-from: the default context, at most the model's


@dataclass
class LMData:
    path: str
    tokenizer: object                # CharTokenizer or hf.TextTokenizer
    train: np.ndarray                # token ids
    valid: np.ndarray


def resolve_tokenizer(loaded):
    """The tokenizer a language-model checkpoint's text goes through: its character vocabulary,
    else the ``tokenizer.json`` its run copied beside it (a fine-tuned GPT-2's)."""
    if loaded.vocabs is not None:
        return CharTokenizer(loaded.vocabs.tgt)
    beside = os.path.join(os.path.dirname(loaded.path), "tokenizer.json")
    if not os.path.isfile(beside):
        raise ValueError(f"checkpoint {loaded.path}: holds no vocabulary and there is no "
                         f"tokenizer.json beside it (a fine-tuned model's run folder has one)")
    tokenizer = TextTokenizer(beside)
    tokenizer.check_fits(loaded.model.config.vocab_size, f"checkpoint {loaded.path}")
    return tokenizer


def load_pretrained(path, dtype=np.float32):
    """(GPT, TextTokenizer) of a Hugging Face folder (any family of ``npformer.families``:
    ``npformer.hf.from_pretrained``): the tokenizer is read first and checked against
    config.json's vocab_size (``TextTokenizer.check_fits``) before any weight is read. The
    model's ``eos_id`` is the folder's end-of-text id, or a tuple of them (Llama 3)."""
    model, tokenizer, _ = _pretrained(path, dtype)
    return model, tokenizer


def _pretrained(path, dtype):
    """:func:`load_pretrained`'s (model, tokenizer) and the folder's model_type (config.json as
    read to check the tokenizer, not read again for it)."""
    folder = model_folder(path)
    tokenizer = TextTokenizer(folder)
    config, _, model_type = read_model_config(folder, warn=False)   # from_pretrained warns
    tokenizer.check_fits(config.vocab_size, folder / "config.json")
    return from_pretrained(folder, dtype=dtype), tokenizer, model_type


def _initial_model(init_from):
    """(model, tokenizer, base) of ``init_from``: a Hugging Face folder (config.json of any
    family of ``npformer.families``) or an npformer GPT checkpoint (a path, or a run folder: its
    best).
    ``base``: where the weights came from, as a LoRA run records its base: {"folder"
    (absolute), "kind" ("hf" or "npformer"), "model_type" (config.json's; None for a
    checkpoint)}. A path whose name is not UTF-8 text is refused first: the run's checkpoints
    record it as their base, as text."""
    folder = os.path.abspath(init_from)
    try:
        folder.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"init_from {init_from!r}: its name is not UTF-8 text, which the "
                         f"run's checkpoints must record as their base; rename it (or link "
                         f"it under a UTF-8 name)") from None
    if os.path.isdir(init_from) and os.path.isfile(os.path.join(init_from, "config.json")):
        model, tokenizer, model_type = _pretrained(init_from, np.float32)
        return model, tokenizer, {"folder": folder, "kind": "hf", "model_type": model_type}
    path = os.path.join(init_from, "best") if os.path.isdir(init_from) else init_from
    if not os.path.exists(path) and not os.path.exists(str(path) + ".npz"):
        raise ValueError(f"init_from {init_from}: no such checkpoint or folder (expected a "
                         f"Hugging Face model folder with config.json, an npformer GPT "
                         f"checkpoint, or a run folder holding best.npz)")
    loaded = load_model_checkpoint(path)
    if loaded.model.config.capability != "causal_lm":
        raise ValueError(f"init_from {init_from}: holds a {loaded.model.config.arch} model; "
                         f"a language model starts from a GPT (an npformer lm checkpoint or a "
                         f"Hugging Face folder of {families.spelled()})")
    path = os.path.abspath(path)
    return loaded.model, resolve_tokenizer(loaded), {
        "folder": path[:-4] if path.endswith(".npz") else path, "kind": "npformer",
        "model_type": None}


def _apply_lora(model, lora, base, seed):
    """Freeze ``model`` and attach the adapters ``lora`` asks for; its base is recorded as
    ``base`` (:func:`_initial_model`'s, from the reading of the weights' folder)."""
    apply_lora(model, lora["rank"], lora["alpha"], lora["dropout"], lora["targets"],
               seed=seed, names=lora.get("names"))
    model.lora.base = dict(base)


def lm_trainer(text_file, model_kwargs=None, train_kwargs=None, seed=0, context=None,
               init_from=None, sample_tokens=None, extra=None, saved=None, arch=LM_ARCH,
               lora=None):
    """The recipe's ``(Trainer, LMData)``: a character-level GPT of ``lm_model(arch)``
    (overridden by ``model_kwargs``) on the text of ``text_file``, trained as ``LM_TRAIN`` says (overridden by
    ``train_kwargs``). ``init_from`` fine-tunes a GPT-2 folder or an npformer GPT checkpoint
    instead, on the text as its own tokenizer cuts it (``model_kwargs`` may then only set
    ``dropout``: every dropout rate of the model). ``saved`` (a ``LoadedCheckpoint``) is the
    run a caller resumes: its model and tokenizer are kept, and ``context`` must be given (the
    run's; a new model recorded before configurations named their family takes ``arch``'s,
    the run's recorded --arch). The context used is the task's (``trainer.task.context``). ``lora`` ({"rank",
    "alpha", "dropout", "targets"}, and optionally "names", what its refusals call them)
    freezes the model of ``init_from`` and trains LoRA adapters (``npformer.lora.apply``), the
    base recorded by folder and by the hash of its weights."""
    text = read_text(text_file)
    model_kwargs = dict(model_kwargs or {})
    if saved is not None:
        if context is None:
            raise ValueError("context: a resumed run must give its own context (recorded in its "
                             "checkpoints)")
        model, tokenizer = saved.model, resolve_tokenizer(saved)
        recorded = (saved.meta.get("extra") or {}).get("options") or {}
        if model.config.family is None and recorded.get("init_from") is None:
            # a new model recorded before configurations named their family: its run's --arch
            model.config = model.config.replace(family=lm_family(arch).name)
    elif init_from is not None:
        shape = sorted(set(model_kwargs) - {"dropout"})
        if shape:
            raise ValueError(f"init_from {init_from}: the model's shape comes from it; "
                             f"{', '.join(shape)} cannot be set")
        model, tokenizer, base = _initial_model(init_from)
        context = context or min(model.max_len, INIT_CONTEXT)
        if "dropout" in model_kwargs:            # the same weights; every rate is the new one
            model = model.reconfigured(dropout=model_kwargs["dropout"], attention_dropout=None)
        if lora is not None:
            _apply_lora(model, lora, base, seed)
    else:
        tokenizer = CharTokenizer.from_text(text)
        recipe = lm_model(arch)
        context = context or recipe["max_len"]
        model = None                             # built once the text has passed its checks
    train, valid = split_ids(tokenizer.encode(text, str(text_file)), context, name=str(text_file))
    if model is None:
        model = GPT(len(tokenizer), **{**recipe, **model_kwargs, "seed": seed,
                                       "max_len": context})
    if getattr(model, "lora", None) is None:     # (LoRA: the weights are in memory already,
        model.config.check_memory(training=True)  # and Adam's moments are the adapters')
    config = TrainConfig(**{**LM_TRAIN, "seed": seed, **(train_kwargs or {})})
    vocabs = (Vocabularies.joint(tokenizer.vocab) if isinstance(tokenizer, CharTokenizer)
              else None)
    task = LanguageModelTask(train, valid, context, config.batch_size, seed, tokenizer, vocabs,
                             sample_tokens)
    return Trainer(model.train(), task, config, extra=extra), LMData(str(text_file), tokenizer,
                                                                     train, valid)
