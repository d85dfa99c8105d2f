"""A token ↔ id vocabulary with four fixed special tokens, saved as UTF-8 JSON.

Ids 0–3 are always ``<pad>``, ``<bos>``, ``<eos>``, ``<unk>``; the other tokens follow in the
order given (``Vocab.build`` orders them by frequency, most frequent first, ties by token).
"""
from __future__ import annotations

import json
import os
from collections import Counter
from typing import Iterable, Optional, Sequence

import numpy as np

from .textfile import write_text_atomic

__all__ = ["Vocab", "Vocabularies"]

_FORMAT = "npformer-vocab"
_VERSION = 1


class Vocab:
    PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
    SPECIALS = (PAD, BOS, EOS, UNK)
    pad_id, bos_id, eos_id, unk_id = 0, 1, 2, 3

    def __init__(self, tokens: list[str]):
        """``tokens`` in id order; must start with ``<pad> <bos> <eos> <unk>`` and hold no duplicates."""
        if isinstance(tokens, (str, bytes)) or not isinstance(tokens, Sequence):
            raise ValueError(f"tokens must be a list of strings, got {type(tokens).__name__}")
        tokens = list(tokens)
        for i, tok in enumerate(tokens):
            if not isinstance(tok, str) or not tok:
                raise ValueError(f"tokens[{i}] must be a non-empty string, got {tok!r}")
        if tuple(tokens[:4]) != self.SPECIALS:
            raise ValueError(f"tokens must start with the special tokens {list(self.SPECIALS)} "
                             f"(ids 0-3), got {tokens[:4]}")
        self._itos: list[str] = tokens
        self._stoi: dict[str, int] = {}
        for i, tok in enumerate(tokens):
            if tok in self._stoi:
                raise ValueError(f"tokens must be unique, but {tok!r} appears at ids "
                                 f"{self._stoi[tok]} and {i}")
            self._stoi[tok] = i

    # ---- construction ----------------------------------------------------------------------
    @classmethod
    def build(cls, sentences: Iterable[list[str]], min_freq: int = 1,
              max_size: int | None = None) -> "Vocab":
        """Count tokens in tokenised ``sentences`` and keep those seen at least ``min_freq`` times.

        Tokens are ordered by frequency (descending), ties by the token itself, so the result does
        not depend on the order of the sentences. ``max_size`` caps the total size, the four
        specials included. Special tokens found in the data are not counted (they have ids already).
        """
        if isinstance(min_freq, bool) or not isinstance(min_freq, int) or min_freq < 1:
            raise ValueError(f"min_freq must be an integer >= 1, got {min_freq!r}")
        if max_size is not None and (isinstance(max_size, bool) or not isinstance(max_size, int)
                                     or max_size < len(cls.SPECIALS)):
            raise ValueError(f"max_size must be None or an integer >= {len(cls.SPECIALS)} "
                             f"(the special tokens count), got {max_size!r}")
        counts: Counter[str] = Counter()
        for n, sentence in enumerate(sentences):
            if isinstance(sentence, str):
                raise ValueError(f"sentences[{n}] must be a list of tokens, got the string "
                                 f"{sentence[:40]!r}; split it first")
            counts.update(sentence)
        for special in cls.SPECIALS:
            counts.pop(special, None)
        kept = sorted((tok for tok, c in counts.items() if c >= min_freq),
                      key=lambda tok: (-counts[tok], tok))
        if max_size is not None:
            kept = kept[: max_size - len(cls.SPECIALS)]
        return cls(list(cls.SPECIALS) + kept)

    # ---- lookup ----------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._itos)

    def __contains__(self, token: object) -> bool:
        return token in self._stoi

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocab) and self._itos == other._itos

    def __repr__(self) -> str:
        return f"Vocab(size={len(self)})"

    @property
    def tokens(self) -> list[str]:
        """All tokens in id order (a copy)."""
        return list(self._itos)

    def token_to_id(self, tok: str) -> int:
        """The id of ``tok``, or ``unk_id`` if it is not in the vocabulary."""
        return self._stoi.get(tok, self.unk_id)

    def id_to_token(self, i: int) -> str:
        return self._itos[self._check_id(i)]

    def _check_id(self, i: object) -> int:
        if isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer)):
            raise ValueError(f"token id must be an integer, got {i!r}")
        if not 0 <= i < len(self._itos):
            raise ValueError(f"token id {int(i)} is out of range for a vocabulary of size "
                             f"{len(self._itos)} (valid ids: 0..{len(self._itos) - 1})")
        return int(i)

    # ---- sequences -------------------------------------------------------------------------
    def encode(self, tokens: list[str], add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """Token ids; unknown tokens become ``unk_id``."""
        return self.encode_with_unknowns(tokens, add_bos, add_eos)[0]

    def encode_with_unknowns(self, tokens: list[str], add_bos: bool = False,
                             add_eos: bool = False) -> tuple[list[int], list[str]]:
        """Like ``encode``, and also return the tokens that were mapped to ``<unk>`` (in order)."""
        if isinstance(tokens, str):
            raise ValueError(f"tokens must be a list of tokens, got the string {tokens[:40]!r}; "
                             f"split it first")
        ids = [self.bos_id] if add_bos else []
        unknown: list[str] = []
        for tok in tokens:
            i = self._stoi.get(tok)
            if i is None:
                unknown.append(tok)
                i = self.unk_id
            ids.append(i)
        if add_eos:
            ids.append(self.eos_id)
        return ids, unknown

    def decode(self, ids: Iterable[int], strip_special: bool = True) -> list[str]:
        """Tokens for ``ids``. With ``strip_special``, stop at the first ``<eos>`` and drop
        ``<pad>``/``<bos>`` (``<unk>`` stays, it carries information)."""
        if isinstance(ids, np.ndarray) and ids.ndim != 1:
            raise ValueError(f"ids must be one sequence (1-D), got an array of shape {ids.shape}")
        out: list[str] = []
        for i in ids:
            i = self._check_id(i)
            if strip_special:
                if i == self.eos_id:
                    break
                if i in (self.pad_id, self.bos_id):
                    continue
            out.append(self._itos[i])
        return out

    # ---- persistence -----------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"format": _FORMAT, "version": _VERSION, "tokens": list(self._itos)}

    @classmethod
    def from_dict(cls, d: dict) -> "Vocab":
        if not isinstance(d, dict) or d.get("format") != _FORMAT or not isinstance(d.get("tokens"), list):
            found = sorted(d) if isinstance(d, dict) else type(d).__name__
            raise ValueError(f"expected a vocabulary dict with format={_FORMAT!r} and a 'tokens' "
                             f"list, got {found}")
        if d.get("version") != _VERSION:
            raise ValueError(f"unsupported vocabulary version {d.get('version')!r}, expected {_VERSION}")
        return cls(d["tokens"])

    def save(self, path: str | os.PathLike) -> None:
        """Write the vocabulary as UTF-8 JSON (Chinese characters stay readable), all or nothing:
        a failed write leaves an existing file unchanged."""
        write_text_atomic(path, json.dumps(self.to_dict(), ensure_ascii=False, indent=1) + "\n")

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Vocab":
        with open(path, "r", encoding="utf-8-sig") as f:   # a byte-order mark is not JSON
            try:
                d = json.load(f)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise ValueError(f"{os.fspath(path)!r} is not a vocabulary file: not valid "
                                 f"UTF-8 JSON ({e})") from e
        try:
            return cls.from_dict(d)
        except ValueError as e:
            raise ValueError(f"{os.fspath(path)!r} is not a valid vocabulary file: {e}") from e


class Vocabularies:
    """A model's vocabularies as one value: a source and a target vocabulary, or one joint
    vocabulary that both sides share (held once). ``src`` and ``tgt`` are the sides either way.

        Vocabularies(src_vocab, tgt_vocab)      Vocabularies.joint(vocab)
        Vocabularies.build(pairs_of_token_lists, min_freq=2, joint=False)

    A joint vocabulary is what a joint subword model (one SentencePiece model over both
    languages) gives, and what sharing the source and target embeddings needs.
    """

    def __init__(self, src: Vocab, tgt: Vocab):
        for side, vocab in (("src", src), ("tgt", tgt)):
            if not isinstance(vocab, Vocab):
                raise ValueError(f"{side}: expected a Vocab, got {type(vocab).__name__}")
        self.src, self.tgt = src, tgt

    @classmethod
    def joint(cls, vocab: Vocab) -> "Vocabularies":
        return cls(vocab, vocab)

    @classmethod
    def build(cls, pairs: Iterable[tuple[Sequence[str], Sequence[str]]], min_freq: int = 1,
              joint: bool = False) -> "Vocabularies":
        """The vocabularies of tokenised (source tokens, target tokens) pairs: one per side, or
        with ``joint=True`` one over both sides. Tokens seen fewer than ``min_freq`` times are
        left out (``Vocab.build``). A vocabulary left with nothing but the special tokens could
        not learn anything: ``ValueError`` naming ``min_freq`` and the side."""
        pairs = list(pairs)
        if joint:
            vocabs = cls.joint(Vocab.build((tokens for pair in pairs for tokens in pair),
                                           min_freq=min_freq))
        else:
            vocabs = cls(Vocab.build((s for s, _ in pairs), min_freq=min_freq),
                         Vocab.build((t for _, t in pairs), min_freq=min_freq))
        for side, vocab in vocabs.sides():
            if len(vocab) <= len(Vocab.SPECIALS):
                side = {"src": "source", "tgt": "target"}.get(side, side)
                raise ValueError(f"min_freq {min_freq}: leaves the {side} vocabulary with only "
                                 f"its {len(Vocab.SPECIALS)} special tokens (no token of the "
                                 f"training data occurs {min_freq} times); give a smaller "
                                 f"min_freq")
        return vocabs

    def sides(self) -> list[tuple[str, Vocab]]:
        """[("joint", vocab)] or [("src", src), ("tgt", tgt)]: each vocabulary once."""
        return [("joint", self.src)] if self.is_joint else [("src", self.src), ("tgt", self.tgt)]

    @staticmethod
    def check_fits(vocabs: object, sizes: dict, where: str = "vocabs",
                   pad_id: Optional[int] = None) -> "Vocabularies":
        """``vocabs`` if it is a ``Vocabularies`` whose sides have the sizes a model expects
        (``sizes``: its configuration's ``vocab_sizes()``, e.g. ``{"src": 8000, "tgt": 8000}``),
        or None for a model that reads no tokens (``sizes`` empty); else ``ValueError`` naming
        ``where``. ``pad_id``, the configuration's padding id (``config.pad_id``), must be the
        vocabularies' own ``<pad>``: with any other id the model would mask a real token (an
        ``<eos>``, say) and attend to the padding."""
        if vocabs is None and not sizes:
            return None
        if not isinstance(vocabs, Vocabularies):
            raise ValueError(f"{where}: expected a Vocabularies (Vocabularies(src_vocab, "
                             f"tgt_vocab) or Vocabularies.joint(vocab)), got {type(vocabs).__name__}")
        for side, size in sizes.items():
            n = len(getattr(vocabs, side))
            if n != size:
                raise ValueError(f"{where}: the {side} vocabulary has {n} tokens but the model's "
                                 f"configuration says {side}_vocab_size={size}")
        if pad_id is not None and pad_id != Vocab.pad_id:
            side, vocab = vocabs.sides()[0]
            token = (repr(vocab.id_to_token(pad_id)) if isinstance(pad_id, int) and
                     0 <= pad_id < len(vocab) else "no token")
            raise ValueError(f"{where}: the model's configuration says pad_id={pad_id!r}, which "
                             f"is {token} in the {side} vocabulary; the vocabularies pad with "
                             f"id {Vocab.pad_id} ({Vocab.PAD!r})")
        return vocabs

    @property
    def is_joint(self) -> bool:
        return self.src is self.tgt

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Vocabularies) and self.is_joint == other.is_joint
                and self.src == other.src and self.tgt == other.tgt)

    def __repr__(self) -> str:
        if self.is_joint:
            return f"Vocabularies.joint({len(self.src)} tokens)"
        return f"Vocabularies(src={len(self.src)} tokens, tgt={len(self.tgt)} tokens)"

    def to_dict(self) -> dict:
        """{"joint": [tokens]} or {"src": [tokens], "tgt": [tokens]}, as checkpoints store it."""
        if self.is_joint:
            return {"joint": self.src.tokens}
        return {"src": self.src.tokens, "tgt": self.tgt.tokens}

    @classmethod
    def from_dict(cls, d: dict) -> "Vocabularies":
        if isinstance(d, dict) and set(d) == {"joint"}:
            return cls.joint(Vocab(d["joint"]))
        if isinstance(d, dict) and set(d) == {"src", "tgt"}:
            return cls(Vocab(d["src"]), Vocab(d["tgt"]))
        found = sorted(d) if isinstance(d, dict) else type(d).__name__
        raise ValueError(f"vocabularies: expected {{'joint': [...]}} or {{'src': [...], "
                         f"'tgt': [...]}}, got {found}")
