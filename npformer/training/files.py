"""The recipe behind ``npformer train --src-file/--tgt-file``: a Transformer on your own parallel
text, one sentence a line, whitespace-tokenised (line i of the source file translates line i of
the target file), validated on a second pair of files if given::

    trainer, data = files_trainer("train.de", "train.en", "valid.de", "valid.en",
                                  train_kwargs={"epochs": 20, "out_dir": "runs/mine"})
    trainer.fit()

Options a caller leaves out take ``TransformerConfig``'s and ``TrainConfig``'s defaults.
"""
from dataclasses import dataclass

from ..data.textfile import read_parallel
from ..configs import TransformerConfig
from ..data.vocab import Vocabularies
from .translation import recipe_trainer


@dataclass
class ParallelData:
    train: list              # (source text, target text)
    valid: list              # empty without validation files
    vocabs: Vocabularies


def load_parallel_files(src_file, tgt_file, valid_src=None, valid_tgt=None, min_freq=1,
                        vocabs=None, max_len=None):
    """The pairs of the files and the vocabularies of the training pairs (one per side, tokens
    seen at least ``min_freq`` times), or ``vocabs`` if given (a resumed run's). ``ValueError``
    names the file for unequal line counts, an empty line or an empty file, and the option for
    a validation file given alone, and (with ``max_len``, the model's) for a line longer than
    the model holds."""
    if not (src_file and tgt_file):
        raise ValueError("src_file and tgt_file: both are needed (the training data)")
    train = read_parallel(src_file, tgt_file, "training data", max_len)
    valid = []
    if valid_src or valid_tgt:
        if not (valid_src and valid_tgt):
            raise ValueError("valid_src and valid_tgt: give both or neither")
        valid = read_parallel(valid_src, valid_tgt, "validation data", max_len)
    if vocabs is None:
        vocabs = Vocabularies.build(((s.split(), t.split()) for s, t in train), min_freq=min_freq)
    return ParallelData(train, valid, vocabs)


def files_trainer(src_file, tgt_file, valid_src=None, valid_tgt=None, min_freq=1,
                  model_kwargs=None, train_kwargs=None, seed=0, extra=None, saved=None):
    """The recipe's ``(Trainer, ParallelData)``. To resume, ``saved`` (a ``LoadedCheckpoint``)
    gives the vocabularies; the caller resumes the trainer from it when it is ready to."""
    max_len = (model_kwargs or {}).get("max_len") or TransformerConfig.max_len   # (its default)
    data = load_parallel_files(src_file, tgt_file, valid_src, valid_tgt, min_freq,
                               vocabs=None if saved is None else saved.vocabs, max_len=max_len)
    return recipe_trainer(data.vocabs, data.train, data.valid, {}, {}, model_kwargs, train_kwargs,
                          seed, extra=extra), data
