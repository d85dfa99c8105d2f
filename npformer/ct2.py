"""Export an encoder-decoder checkpoint to CTranslate2, and translate with the exported folder.

CTranslate2 (OpenNMT's C++ inference engine, ``pip install "npformer[ctranslate2]"``) is what
translation users deploy on CPUs. ``export_ctranslate2`` writes a ``TransformerSpec`` built from
the weights as they are (no retraining, no approximation unless ``quantization`` asks for one);
``load_exported`` reads such a folder back as something ``npformer translate`` / ``eval`` run
with ``--engine ctranslate2``:

    npformer export --checkpoint run/best --format ctranslate2 --out run/ct2 [--quantization int8]
    npformer translate --engine ctranslate2 --checkpoint run/ct2 "ein mann fährt fahrrad ."

How npformer's layout maps onto the spec:

- Self-attention's fused ``in_proj`` (q, k, v stacked, ``(3D, D)`` in torch's ``[out, in]``
  layout) is ``self_attention.linear[0]``; cross-attention's is split into ``attention.linear[0]``
  (the query rows) and ``attention.linear[1]`` (key and value rows, fused).
- npformer's encoder and decoder end in a LayerNorm, post-norm or pre-norm (as
  torch.nn.Transformer). The spec holds final norms only when built pre-norm, so it is built with
  ``pre_norm=True``, then set to the model's norm placement; the runtime applies the final norms
  whenever they are present.
- The sinusoidal table is npformer's, interleaved (sin, cos, sin, ...), given explicitly with the
  model's ``max_len`` rows (CTranslate2's default table is concatenated sin | cos).
- ``<pad> <bos> <eos> <unk>`` are CTranslate2's ``<blank> <s> </s> <unk>``. npformer never
  chooses ``<pad>`` or ``<bos>`` as a next token; the translator here suppresses them too.
- LayerNorm's epsilon is the model's (CTranslate2's default differs).

What the spec cannot hold is refused with a ValueError naming it: a language model (this is the
encoder-decoder export), ``qk_dim`` different from ``d_model``.

The folder also holds ``npformer.json``: the model's configuration, its npformer vocabularies
and its text settings (languages, lowercasing, the word tokenizer or the SentencePiece model), so
the exported model reads raw text exactly as the checkpoint does.

Integrity: ``npformer.json`` records the sha256 of every other file of the folder (``files``)
and, as its last field, the sha256 of its own content without that field (``sha256``: the
file cannot hold its own hash, so it holds the hash of the rest, as a checkpoint's trailer
does). ``load_exported`` checks both before CTranslate2 reads anything: a file that rotted or
was edited (a flipped byte in ``model.bin``, another ``layer_norm_epsilon`` in
``config.json``), a missing file or one that is not the export's is a ValueError naming it.
This guards against corruption, not against forgery: whoever rewrites ``npformer.json`` with
new hashes makes any folder pass (it is no signature). Exports written before the hashes were
recorded load with a warning that says to export again.
"""
import hashlib
import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import runtime
from .data.vocab import Vocab, Vocabularies
from .decoding.search import Hypothesis
from .decoding.translator import Translator
from .nn.transformer import default_capacity
from .checkpoint import checkpoint_paths, write_file_atomic, write_folder
from .registry import config_from_dict
from .version import VERSION

KIND = "npformer-ctranslate2-export"
META_FILE = "npformer.json"
QUANTIZATIONS = ("int8", "int8_float32", "int16", "float16", "bfloat16", "float32")
# npformer's specials -> CTranslate2's names for them (ids 0-3 in both)
SPECIALS = {Vocab.PAD: "<blank>", Vocab.BOS: "<s>", Vocab.EOS: "</s>", Vocab.UNK: "<unk>"}
_SUPPRESSED = [[SPECIALS[Vocab.PAD]], [SPECIALS[Vocab.BOS]]]     # never a next token
_CHUNK = 1 << 20                   # bytes read at a time when hashing


def require_ctranslate2():
    """The ``ctranslate2`` module, or a ValueError naming the extra that installs it."""
    try:
        import ctranslate2
    except ImportError:
        raise ValueError("ctranslate2 is not installed: pip install 'npformer[ctranslate2]'") from None
    return ctranslate2


def ct2_tokens(vocab):
    """An npformer ``Vocab`` as CTranslate2's token list: the specials renamed, nothing else."""
    tokens = vocab.tokens
    clash = sorted(set(tokens[4:]) & set(SPECIALS.values()))
    if clash:
        raise ValueError(f"vocabulary: the tokens {clash} are CTranslate2's special tokens, so "
                         f"the export cannot keep them apart from npformer's specials")
    return [SPECIALS.get(t, t) for t in tokens]


# -- export -----------------------------------------------------------------------------------
def _activation(cs, name):
    table = {"relu": cs.Activation.RELU, "gelu": cs.Activation.GELU,
             "gelu_tanh": cs.Activation.GELUTanh}
    if name not in table:
        raise ValueError(f"activation {name!r}: CTranslate2 export supports {sorted(table)}")
    return table[name]


def check_exportable(model):
    """ValueError naming what CTranslate2's TransformerSpec cannot hold."""
    cfg = model.config
    if getattr(cfg, "capability", None) != "seq2seq" or cfg.arch != "transformer":
        raise ValueError(f"checkpoint: CTranslate2 export takes an encoder-decoder "
                         f"('transformer') model, got a {getattr(cfg, 'arch', None)!r} model")
    if cfg.qk_dim is not None and cfg.qk_dim != cfg.d_model:
        raise ValueError(f"checkpoint: qk_dim={cfg.qk_dim} differs from d_model={cfg.d_model}; "
                         f"CTranslate2's attention projects queries and keys to d_model")
    if cfg.activation not in ("relu", "gelu", "gelu_tanh"):
        raise ValueError(f"checkpoint: activation {cfg.activation!r} has no CTranslate2 "
                         f"counterpart")


def _linear(spec, weight, bias):
    spec.weight = np.ascontiguousarray(weight, dtype=np.float32)
    spec.bias = np.ascontiguousarray(bias, dtype=np.float32)


def _norm(spec, weights, name):
    spec.gamma = weights[name + ".weight"]
    spec.beta = weights[name + ".bias"]


def _self_attention_and_ffn(layer, w, p, ffn_norm):
    """What encoder and decoder layers share: self-attention (fused QKV, output projection,
    norm1) and the feed-forward block (its norm is ``ffn_norm``)."""
    att = layer.self_attention
    _linear(att.linear[0], w[p + "self_attn.in_proj_weight"], w[p + "self_attn.in_proj_bias"])
    _linear(att.linear[1], w[p + "self_attn.out_proj.weight"], w[p + "self_attn.out_proj.bias"])
    _norm(att.layer_norm, w, p + "norm1")
    _linear(layer.ffn.linear_0, w[p + "ffn.linear1.weight"], w[p + "ffn.linear1.bias"])
    _linear(layer.ffn.linear_1, w[p + "ffn.linear2.weight"], w[p + "ffn.linear2.bias"])
    _norm(layer.ffn.layer_norm, w, p + ffn_norm)


def build_spec(model, vocabs):
    """A ``ctranslate2.specs.TransformerSpec`` holding ``model``'s weights and ``vocabs``."""
    require_ctranslate2()
    from ctranslate2.specs import common_spec as cs, transformer_spec as ts

    check_exportable(model)
    cfg = model.config
    w = {k: np.asarray(v, dtype=np.float32) for k, v in model.state_dict().items()}
    if cfg.share_all_embeddings:
        w["tgt_embed.weight"] = w["src_embed.weight"]
    if cfg.tie_embeddings:
        w["generator.weight"] = w["tgt_embed.weight"]
    d = cfg.d_model
    spec = ts.TransformerSpec.from_config(
        (cfg.n_encoder_layers, cfg.n_decoder_layers), cfg.n_heads, pre_norm=True,
        activation=_activation(cs, cfg.activation))
    # built pre-norm so that the final norms exist; then the model's own placement
    spec.encoder.pre_norm = spec.decoder.pre_norm = bool(cfg.norm_first)
    positions = np.ascontiguousarray(model.positions, dtype=np.float32)        # (max_len, D)

    enc = spec.encoder
    enc.embeddings[0].weight = w["src_embed.weight"]
    enc.position_encodings.encodings = positions
    _norm(enc.layer_norm, w, "encoder.norm")
    for i, layer in enumerate(enc.layer):
        _self_attention_and_ffn(layer, w, f"encoder.layers.{i}.", ffn_norm="norm2")

    dec = spec.decoder
    dec.embeddings.weight = w["tgt_embed.weight"]
    dec.position_encodings.encodings = positions
    _norm(dec.layer_norm, w, "decoder.norm")
    for i, layer in enumerate(dec.layer):
        p = f"decoder.layers.{i}."
        _self_attention_and_ffn(layer, w, p, ffn_norm="norm3")
        cross, wq, bq = layer.attention, w[p + "multihead_attn.in_proj_weight"], \
            w[p + "multihead_attn.in_proj_bias"]
        _linear(cross.linear[0], wq[:d], bq[:d])                                   # queries
        _linear(cross.linear[1], wq[d:], bq[d:])                                   # keys, values
        _linear(cross.linear[2], w[p + "multihead_attn.out_proj.weight"],
                w[p + "multihead_attn.out_proj.bias"])
        _norm(cross.layer_norm, w, p + "norm2")
    _linear(dec.projection, w["generator.weight"],
            w.get("generator.bias", np.zeros(cfg.tgt_vocab_size, np.float32)))

    spec.config.layer_norm_epsilon = float(cfg.layer_norm_eps)
    spec.config.unk_token, spec.config.bos_token = SPECIALS[Vocab.UNK], SPECIALS[Vocab.BOS]
    spec.config.eos_token, spec.config.decoder_start_token = SPECIALS[Vocab.EOS], SPECIALS[Vocab.BOS]
    spec.register_source_vocabulary(ct2_tokens(vocabs.src))
    spec.register_target_vocabulary(ct2_tokens(vocabs.tgt))
    return spec


def _is_export(folder):
    try:
        return json.loads((Path(folder) / META_FILE).read_text("utf-8")).get("kind") == KIND
    except (OSError, ValueError, AttributeError):
        return False


def check_export_target(out, inputs=(), overwrite=False, is_earlier=None, marker=META_FILE,
                        what="CTranslate2 export"):
    """Refuse an ``out`` that exists (unless ``overwrite`` and it is an earlier export or an
    empty folder), that is a file, or that holds one of ``inputs`` (paths the export reads).
    ``is_earlier(folder)``: whether a folder is an earlier export of this format, ``what``,
    recognised by its ``marker`` file (default: a CTranslate2 export's)."""
    is_earlier = _is_export if is_earlier is None else is_earlier
    out = Path(out)
    for path in inputs:
        real, target = os.path.realpath(path), os.path.realpath(out)
        if real == target or real.startswith(target + os.sep) or \
                os.path.splitext(real)[0] == target:     # run/best would shadow run/best.npz
            raise ValueError(f"--out {out}: holds the input {path}; export to another folder "
                             f"(nothing was written)")
    if out.is_file():
        raise ValueError(f"--out {out}: is a file, expected a folder to create")
    if out.exists():
        if not overwrite:
            raise ValueError(f"--out {out}: already exists; pass --overwrite to replace it")
        if any(out.iterdir()) and not is_earlier(out):
            raise ValueError(f"--out {out}: exists and is not an npformer {what} (no {marker}); "
                             f"--overwrite only replaces an earlier export")


def _sha256_file(path, sync=False):
    """The sha256 of the file ``path`` (read a chunk at a time); ``sync``: fsync it too."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
        if sync:
            os.fsync(f.fileno())
    return h.hexdigest()


def _meta_text(meta):
    return json.dumps(meta, indent=1, ensure_ascii=False) + "\n"


def _meta_digest(meta):
    """The sha256 of ``npformer.json``'s text without its last field, ``sha256`` (the file
    cannot hold its own hash): the text ``_meta_text`` writes for the other fields."""
    rest = {k: v for k, v in meta.items() if k != "sha256"}
    return hashlib.sha256(_meta_text(rest).encode("utf-8")).hexdigest()


def export_ctranslate2(loaded, out, quantization=None, overwrite=False):
    """Write ``loaded`` (a ``LoadedCheckpoint``) as a CTranslate2 model folder ``out``.

    The folder is written under a temporary name beside ``out`` (every file fsync-ed, its
    sha256 recorded in ``npformer.json``) and renamed into place, so an interrupted export
    leaves no half-written model; an existing ``out`` is replaced only with ``overwrite`` and
    only if it is an earlier export. Returns the folder's path."""
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization: expected one of {QUANTIZATIONS} or None, got "
                         f"{quantization!r}")
    out = Path(out)
    inputs = [str(p) for p in checkpoint_paths(loaded.path)]
    check_export_target(out, inputs, overwrite=overwrite)
    spec = build_spec(loaded.model, loaded.vocabs)
    spec.validate()
    spec.optimize(quantization=quantization)
    meta = {"kind": KIND, "npformer_version": VERSION, "quantization": quantization or "float32",
            "checkpoint": str(loaded.path), "config": loaded.model.config.to_dict(),
            "vocabularies": loaded.vocabs.to_dict(), "extra": loaded.meta.get("extra") or {}}

    def write(tmp):
        try:
            spec.save(str(tmp))
            meta["files"] = {name: _sha256_file(tmp / name, sync=True)
                             for name in sorted(os.listdir(tmp))}
            meta["sha256"] = _meta_digest(meta)
            write_file_atomic(tmp / META_FILE, lambda f: f.write(_meta_text(meta).encode("utf-8")))
        except OSError as e:                         # a full disk: name the folder being written
            if e.filename is None and e.errno is not None:
                raise OSError(e.errno, e.strerror, str(out)) from e
            raise
    # again just before the rename: --out may have appeared while the export took its time
    return write_folder(out, write, check=lambda: check_export_target(out, inputs,
                                                                      overwrite=overwrite))


# -- running an exported folder ---------------------------------------------------------------
@dataclass
class CT2Model:
    """An exported model loaded in CTranslate2: what ``Translator`` checks (``config``,
    ``max_len``) and the engine that decodes (``translator``, a ``ctranslate2.Translator``)."""
    config: object
    translator: object

    @property
    def max_len(self):
        return self.config.max_len


@dataclass
class ExportedModel:
    """An export read back: the fields of a ``LoadedCheckpoint`` that translation reads."""
    model: CT2Model
    vocabs: Vocabularies
    meta: dict
    path: str

    def translator(self, tokenize, detokenize, batch_size=None):
        """A ``CT2Translator`` of this model (what ``make_translator`` asks for)."""
        return CT2Translator(self.model, self.vocabs, tokenize, detokenize, batch_size)


def _read_vocabulary_file(folder, names):
    for name in names:
        path = folder / name
        if path.exists():
            try:
                if name.endswith(".json"):
                    return path, json.loads(path.read_text("utf-8"))
                return path, path.read_text("utf-8").splitlines()
            except (OSError, ValueError, RecursionError) as e:
                raise ValueError(f"{path}: unreadable vocabulary ({e})") from None
    return None, None


def check_export_files(folder, meta):
    """Check the folder's files against the sha256 that ``meta`` (its ``npformer.json``, read)
    records: ``npformer.json``'s own content, then every other file, read once; the files must
    be exactly the ones it lists. ValueError naming the first file that differs."""
    folder, meta_path = Path(folder), Path(folder) / META_FILE
    again = "export the checkpoint again"
    if "files" not in meta and "sha256" not in meta:
        warnings.warn(f"{meta_path}: written before exports recorded the sha256 of their files, "
                      f"so a corrupted file cannot be detected; {again} (npformer export "
                      f"--overwrite) to have them checked", UserWarning, stacklevel=3)
        return
    if meta.get("sha256") != _meta_digest(meta):
        raise ValueError(f"{meta_path}: its content does not match the sha256 it records "
                         f"(edited or corrupted since the export); {again}")
    files = meta.get("files")
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        raise ValueError(f"{meta_path}: expected 'files', the sha256 of each file of the "
                         f"export, got {files!r:.60}")
    present = sorted(p.name for p in folder.iterdir() if p.name != META_FILE)
    for name in present:
        if name not in files or not (folder / name).is_file():
            raise ValueError(f"{folder / name}: is not a file of this export ({META_FILE} "
                             f"lists {sorted(files)}); move it out of the folder")
    for name, recorded in files.items():
        if name not in present:
            raise ValueError(f"{folder / name}: missing; {META_FILE} records it as a file of "
                             f"the export; {again}")
        digest = _sha256_file(folder / name)
        if digest != recorded:
            raise ValueError(f"{folder / name}: its sha256 {digest[:16]}... is not the one "
                             f"{META_FILE} records ({str(recorded)[:16]}...): the file changed "
                             f"or rotted since the export; {again}")


def load_exported(path, threads=None):
    """Read an export (``export_ctranslate2``'s folder) into an ``ExportedModel``; ValueError
    naming the folder if it is not one, naming the file if one is not as exported (its sha256,
    ``check_export_files``), or if its CTranslate2 vocabularies are not the ones npformer.json
    records."""
    ctranslate2 = require_ctranslate2()
    folder = Path(path)
    if not folder.is_dir() or not (folder / "model.bin").exists():
        raise ValueError(f"--checkpoint {path}: expected a CTranslate2 model folder (with "
                         f"model.bin), as `npformer export --format ctranslate2` writes")
    meta_path = folder / META_FILE
    try:
        meta = json.loads(meta_path.read_text("utf-8"))
    except OSError:
        raise ValueError(f"--checkpoint {path}: a CTranslate2 model without {META_FILE}; only "
                         f"folders written by `npformer export` carry npformer's text settings") from None
    except (ValueError, RecursionError) as e:      # RecursionError: brackets nested too deep
        raise ValueError(f"{meta_path}: not valid JSON ({e})") from None
    if not isinstance(meta, dict) or meta.get("kind") != KIND:
        raise ValueError(f"{meta_path}: expected kind {KIND!r}, got "
                         f"{meta.get('kind') if isinstance(meta, dict) else meta!r:.60}")
    check_export_files(folder, meta)
    try:
        config = config_from_dict(meta["config"])
        vocabs = Vocabularies.from_dict(meta["vocabularies"])
        Vocabularies.check_fits(vocabs, config.vocab_sizes(), str(meta_path),
                                pad_id=getattr(config, "pad_id", None))
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{meta_path}: bad configuration or vocabularies ({e})") from None
    expected = {"source": ct2_tokens(vocabs.src), "target": ct2_tokens(vocabs.tgt)}
    shared_path, shared = _read_vocabulary_file(folder, ("shared_vocabulary.json",
                                                         "shared_vocabulary.txt"))
    for side in ("source", "target"):
        file, tokens = ((shared_path, shared) if shared is not None else
                        _read_vocabulary_file(folder, (f"{side}_vocabulary.json",
                                                       f"{side}_vocabulary.txt")))
        if tokens is None:
            raise ValueError(f"--checkpoint {path}: no {side} vocabulary file")
        if tokens != expected[side]:
            raise ValueError(f"{file}: the CTranslate2 {side} vocabulary ({len(tokens)} tokens) "
                             f"is not the one {META_FILE} records ({len(expected[side])} tokens)")
    cores = threads or runtime.policy().cores
    try:
        engine = ctranslate2.Translator(str(folder), device="cpu", inter_threads=1,
                                        intra_threads=cores)
    except (RuntimeError, ValueError) as e:
        raise ValueError(f"--checkpoint {path}: CTranslate2 cannot load it ({e})") from None
    return ExportedModel(CT2Model(config, engine), vocabs, meta, str(folder))


class CT2Translator(Translator):
    """``Translator`` whose batches run in CTranslate2: the same tokenisation, batching and
    results; greedy decoding gives npformer's tokens. Beam search ranks finished hypotheses by
    CTranslate2's length normalisation (log-probability / length ** alpha), not GNMT's, so its
    choices can differ. Sampling is refused (CTranslate2's is not seeded from here), and the
    translations carry no per-token ``probs``: CTranslate2's keep ``<pad>`` and ``<bos>`` in the
    softmax, so they would not be npformer's."""

    def __init__(self, model, vocabs, tokenize, detokenize, batch_size=None):
        super().__init__(model, vocabs, tokenize, detokenize, batch_size)
        self._src_tokens = ct2_tokens(vocabs.src)
        self._tgt_ids = {t: i for i, t in enumerate(ct2_tokens(vocabs.tgt))}

    def search(self, src, method, beam_size, length_penalty, temperature, top_k, rng,
               max_new_tokens):
        pad = self.vocabs.src.pad_id
        sources = [[self._src_tokens[i] for i in row if i != pad] for row in src]
        capacity = (default_capacity(self.model.max_len, src.shape[1]) if max_new_tokens is None
                    else max_new_tokens)                 # npformer's decoder state holds as many
        options = dict(max_decoding_length=capacity, min_decoding_length=0, max_batch_size=0,
                       max_input_length=0, return_scores=True, suppress_sequences=_SUPPRESSED)
        if method == "beam":
            options.update(beam_size=beam_size, length_penalty=length_penalty)
        elif method == "sample":
            raise ValueError("method 'sample': a CTranslate2 export decodes greedily or with beam "
                             "search only (its sampling cannot be seeded from here, so a run "
                             "would not repeat); sample with the npformer engine")
        else:
            options.update(beam_size=1)
        results = self.model.translator.translate_batch(sources, **options)
        hyps = []
        for result in results:
            tokens = result.hypotheses[0]
            ids = [self._tgt_ids.get(t, self.vocabs.tgt.unk_id) for t in tokens]
            hyps.append(Hypothesis(ids=ids, score=float(result.scores[0]),
                                   finished=len(ids) < capacity))
        return hyps
