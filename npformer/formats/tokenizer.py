"""A Hugging Face folder's ``tokenizer.json``, read by the tokenizers package (extra ``hf``:
``pip install "npformer[hf]"``): ``load_tokenizer`` gives the library's object,
``TextTokenizer`` the interface of npformer's character tokenizer."""
from pathlib import Path

import numpy as np

from .folder import model_folder, require


def load_tokenizer(path):
    """The ``tokenizers.Tokenizer`` of a folder's ``tokenizer.json``."""
    file = model_folder(path) / "tokenizer.json"
    if not file.is_file():
        raise ValueError(f"{file.parent}: no tokenizer.json (npformer reads the tokenizers "
                         f"package's format; the Hugging Face hub has it for gpt2)")
    return _tokenizer_file(file)


class TextTokenizer:
    """A folder's ``tokenizer.json`` with :class:`npformer.data.characters.CharTokenizer`'s
    interface (``encode(text, name) -> int64 ids``, ``decode(ids) -> str``), so a language-model
    task or ``npformer sample`` takes either; ``token(id)`` names a token (the end-of-text one
    in ``--trace``: only such tokenizers have one). ``path``: the folder (or the file itself)."""

    def __init__(self, path):
        path = Path(path)
        self.tokenizer = _tokenizer_file(path) if path.is_file() else load_tokenizer(path)
        self.path = path if path.is_file() else path / "tokenizer.json"

    def __len__(self):
        return self.tokenizer.get_vocab_size()

    def encode(self, text, name="text"):
        return np.asarray(self.tokenizer.encode(text).ids, dtype=np.int64)

    def decode(self, ids):
        return self.tokenizer.decode([int(i) for i in ids])

    def token(self, i):
        return self.tokenizer.id_to_token(int(i))

    def check_fits(self, vocab_size, model):
        """Refuse (ValueError naming this file and ``model``, the file that gives the model's
        ``vocab_size`` embedding rows) a tokenizer that cannot be the model's:

        - one with an id of ``vocab_size`` or more, which the model has no row for;
        - one that leaves half of the rows or more without a token. Models round their
          embedding up past their tokenizer (to a multiple of 64 to 1024, or with a reserve:
          Qwen2.5 has 151,665 tokens in 151,936 rows, phi-2 50,295 in 51,200), always by fewer
          rows than the tokenizer has; a 3-token tokenizer for 300 rows is another model's.
        """
        vocab = self.tokenizer.get_vocab(with_added_tokens=True)
        top = max(vocab.values(), default=-1)
        if top >= vocab_size:
            raise ValueError(f"{self.path}: has token ids up to {top}, but {model} gives the "
                             f"model {vocab_size} embedding rows (ids 0 to {vocab_size - 1}); "
                             f"not this model's tokenizer")
        if 2 * len(vocab) <= vocab_size:
            raise ValueError(f"{self.path}: {len(vocab)} tokens, but {model} gives the model "
                             f"{vocab_size} embedding rows; a model pads its tokenizer's "
                             f"vocabulary by fewer rows than it holds, so this is not the "
                             f"model's tokenizer")


def _tokenizer_file(file):
    """The ``tokenizers.Tokenizer`` of a tokenizer.json, its bytes read here and handed over as
    text: the library takes a path only as UTF-8, which a folder's name need not be."""
    require("tokenizers")
    from tokenizers import Tokenizer
    try:
        text = Path(file).read_bytes().decode("utf-8")
    except OSError as e:
        raise ValueError(f"{file}: cannot be read ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{file}: not a tokenizers file (not UTF-8 text: {e})") from None
    try:
        return Tokenizer.from_str(text)
    except Exception as e:               # the Rust library's own exception type
        raise ValueError(f"{file}: not a tokenizers file ({str(e).splitlines()[0]})") from None
