"""Subword units: SentencePiece pieces of the word tokenizer's output (optional dependency).

``SubwordTokenizer.train(texts, vocab_size)`` learns one joint BPE model over both languages'
training text; ``tokenize`` then turns a sentence into pieces and ``detokenize`` glues pieces back
into text::

    text --npformer.data.tokenize--> words --SentencePiece--> pieces --model--> pieces
         <--detokenize------------- words <--decode--------- pieces

Running SentencePiece on the word tokenizer's output (not on raw text) keeps the word tokenizer's
punctuation rules and its exact detokenizer; SentencePiece only splits rare words into pieces
(``schlagzeuger`` -> ``▁schlag zeug er``), so no word of the test set is out of vocabulary.
Normalisation is the word tokenizer's (NFC, optional lowercasing): SentencePiece's own is off.

``pretokenized=True`` skips the word tokenizer: the text arrives tokenised already (the papers'
Moses preprocessing, ``npformer.data.moses``), ``tokenize`` only splits it into pieces and
``detokenize`` gives the tokenised text back (tokens joined by single spaces).

Needs the ``sentencepiece`` package: ``pip install "npformer[subword]"``. The trained model is
kept as bytes (``model_proto``) and saved inside every checkpoint, base64-encoded.
"""
import base64
import io

from .tokenize import detokenize as detokenize_words
from .tokenize import tokenize as tokenize_words

NAME = "npformer-word+sentencepiece"


def _sentencepiece():
    try:
        import sentencepiece
    except ImportError as exc:                                     # pragma: no cover
        raise ImportError("subword units need the sentencepiece package: "
                          "pip install 'npformer[subword]' (or: pip install sentencepiece)") from exc
    return sentencepiece


class SubwordTokenizer:
    """Word tokenizer + SentencePiece model. Picklable; ``to_text``/``from_text`` round-trip it."""

    def __init__(self, model_proto, lowercase=True, pretokenized=False):
        if not isinstance(model_proto, (bytes, bytearray)) or not model_proto:
            got = "empty bytes" if isinstance(model_proto, (bytes, bytearray)) else \
                type(model_proto).__name__
            raise ValueError(f"model_proto: expected the bytes of a SentencePiece model, got {got}")
        self.model_proto, self.lowercase = bytes(model_proto), bool(lowercase)
        self.pretokenized = bool(pretokenized)
        self._load()

    def _load(self):
        self._sp = _sentencepiece().SentencePieceProcessor()
        try:
            self._sp.LoadFromSerializedProto(self.model_proto)
        except Exception as exc:        # sentencepiece raises RuntimeError/OSError by version
            raise ValueError(f"model_proto: not a valid SentencePiece model ({exc})") from None

    @classmethod
    def train(cls, texts, vocab_size=8000, lowercase=True, model_type="bpe", pretokenized=False):
        """Learn a model with ``vocab_size`` pieces from an iterable of raw sentences (of
        tokenised ones with ``pretokenized``)."""
        if not isinstance(vocab_size, int) or isinstance(vocab_size, bool) or vocab_size < 16:
            raise ValueError(f"vocab_size: expected an integer >= 16, got {vocab_size!r}")
        words = (lambda t: t.split()) if pretokenized else \
            (lambda t: tokenize_words(t, lowercase=lowercase))
        lines = [" ".join(words(t)) for t in texts]
        if not any(lines):
            raise ValueError("texts: no words to learn subword units from")
        model = io.BytesIO()
        _sentencepiece().SentencePieceTrainer.train(
            sentence_iterator=iter(lines), model_writer=model, vocab_size=vocab_size,
            model_type=model_type, character_coverage=1.0, normalization_rule_name="identity",
            add_dummy_prefix=True, split_digits=False, hard_vocab_limit=False,
            # on tokenised text, merge within a token whatever its characters (as subword-nmt
            # does: ``&apos;s`` one piece), not only within one Unicode script
            split_by_unicode_script=not pretokenized,
            bos_id=-1, eos_id=-1, pad_id=-1, unk_id=0, num_threads=1, minloglevel=2)
        return cls(model.getvalue(), lowercase, pretokenized)

    def tokenize(self, text):
        """Sentence -> list of pieces (strings; a piece starting with ``▁`` begins a word)."""
        words = text.split() if self.pretokenized else tokenize_words(text, lowercase=self.lowercase)
        return self.pieces(words)

    def detokenize(self, pieces):
        """Pieces -> sentence (tokenised text if ``pretokenized``). ``<unk>`` pieces (words the
        model could not spell) are dropped."""
        words = self.words(pieces)
        return " ".join(words) if self.pretokenized else detokenize_words(words)

    def pieces(self, words):
        """Words (tokens) -> pieces: the SentencePiece step alone."""
        return self._sp.encode(" ".join(words), out_type=str)

    def words(self, pieces):
        """Pieces -> words, ``<unk>`` pieces dropped: the SentencePiece step back."""
        return self._sp.decode([p for p in pieces if p != "<unk>"]).split()

    def to_text(self):
        """The model as ASCII text (base64), for a checkpoint's JSON metadata."""
        return base64.b64encode(self.model_proto).decode("ascii")

    @classmethod
    def from_text(cls, text, lowercase=True, pretokenized=False):
        try:
            proto = base64.b64decode(text.encode("ascii"), validate=True)
        except (ValueError, AttributeError) as exc:
            raise ValueError(f"subword model: expected base64 text, got {type(text).__name__} "
                             f"({exc})") from None
        return cls(proto, lowercase, pretokenized)

    def __len__(self):
        return self._sp.get_piece_size()

    def __getstate__(self):
        return {"model_proto": self.model_proto, "lowercase": self.lowercase,
                "pretokenized": self.pretokenized}

    def __setstate__(self, state):
        self.model_proto, self.lowercase = state["model_proto"], state["lowercase"]
        self.pretokenized = state.get("pretokenized", False)
        self._load()
