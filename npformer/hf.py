"""GPT-2 from the Hugging Face format, without PyTorch: ``config.json``, ``model.safetensors``
(read with the safetensors package's NumPy API) and ``tokenizer.json`` (the tokenizers package).
Both packages come with the extra ``hf`` (``pip install "npformer[hf]"``).

    model = nf.GPT.from_pretrained("path/to/gpt2")      # builds from read_gpt2's result
    config, weights, eos_id = read_gpt2("path/to/gpt2")  # GPTConfig, {npformer name: array}
    tokenizer = load_tokenizer("path/to/gpt2")

This module reads files into a configuration and arrays; it builds no model (``nn.gpt`` calls it).

``pytorch_model.bin`` is refused: it is a pickle, and loading a pickle runs whatever code it holds.

GPT-2's linear layers are ``Conv1D`` modules, which store their weight as (in, out), the
transpose of a Linear's (out, in); the four of them are listed in ``CONV1D_TRANSPOSED`` and
transposed on the way in. The fused ``c_attn`` (D, 3D) holds the query, key and value columns in
that order, as npformer's fused ``in_proj_weight`` (3D, D) holds their rows.
"""
import contextlib
import json
import re
import warnings
from pathlib import Path

import numpy as np

from .configs import GPTConfig
from .validation import check_flag, check_int, check_real

# The Conv1D weights of every block: stored (in, out), transposed on loading.
CONV1D_TRANSPOSED = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight",
                     "mlp.c_proj.weight")
# Per-block buffers that older GPT-2 files store (the causal mask and its fill value): not weights.
BUFFERS = ("attn.bias", "attn.masked_bias")
_BUFFER = re.compile(r"h\.\d+\.attn\.(bias|masked_bias)")
# Hugging Face's activation names -> npformer's
ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu",
               "relu": "relu"}
SAFETENSORS, INDEX, PICKLE = "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin"
MAX_JSON_BYTES = 16 << 20   # config.json and the index: a few KB in practice, refused past this
_BLOCK = re.compile(r"(?:transformer\.)?h\.(\d+)\.")     # a tensor of block N


def _require(package):
    try:
        return __import__(package)
    except ImportError:
        raise ValueError(f"reading the Hugging Face format needs the package {package!r}: "
                         f"pip install \"npformer[hf]\"") from None


def _short(value):
    """repr of a value from a file, cut to a readable length."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def read_json(file):
    """The JSON value a small file holds (config.json, an index); ValueError naming the file for
    anything else: too large, not UTF-8, not JSON, nested too deeply for Python to read, or a
    number it cannot hold (an integer of thousands of digits)."""
    try:
        size = file.stat().st_size
        if size > MAX_JSON_BYTES:
            raise ValueError(f"{file}: {size:,} bytes, more than the {MAX_JSON_BYTES:,} a "
                             f"Hugging Face JSON file needs; not a model's file")
        return json.loads(file.read_bytes().decode("utf-8"))
    except RecursionError:
        raise ValueError(f"{file}: not a JSON file npformer can read (nested too deeply)") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{file}: not a JSON file ({e})") from None
    except ValueError as e:
        if str(e).startswith(f"{file}:"):
            raise
        raise ValueError(f"{file}: not a JSON file npformer can read ({e})") from None


def model_folder(path):
    """``path`` as the Path of a Hugging Face model folder; ValueError saying a folder was
    expected for a file or nothing (a pickle is named as one)."""
    folder = Path(path)
    if folder.is_file() and folder.name == PICKLE:
        raise ValueError(f"{folder}: a pickle (pytorch_model.bin), which npformer never loads; "
                         f"give the folder of a model.safetensors")
    if not folder.is_dir():
        raise ValueError(f"{path}: expected a Hugging Face model folder (config.json, "
                         f"model.safetensors, tokenizer.json), got "
                         f"{'a file' if folder.exists() else 'no such folder'}")
    return folder


def read_config(path):
    """The ``GPTConfig`` of a Hugging Face GPT-2 folder's ``config.json`` and its
    ``eos_token_id`` (None where it names none). ValueError naming the file and the field, by
    its name in config.json, for anything npformer's GPT cannot be."""
    file = model_folder(path) / "config.json"
    if not file.is_file():
        raise ValueError(f"{file.parent}: no config.json (expected a Hugging Face model folder)")
    raw = read_json(file)
    if not isinstance(raw, dict):
        raise ValueError(f"{file}: expected a JSON object, got {type(raw).__name__}")
    if raw.get("model_type") != "gpt2":
        raise ValueError(f"{file}: model_type: expected 'gpt2', got "
                         f"{_short(raw.get('model_type'))}")

    def field(name, check, default=None, **bounds):
        """config.json's ``name`` through ``check`` (the error names the file and the key)."""
        if name not in raw and default is None:
            raise ValueError(f"{file}: {name}: missing")
        try:
            return check(name, raw.get(name, default), **bounds)
        except ValueError as e:
            raise ValueError(f"{file}: {e}") from None

    def rate(name):
        return field(name, check_real, 0.1, minimum=0, maximum=1, max_open=True)

    activation = raw.get("activation_function", "gelu_new")
    if not isinstance(activation, str) or activation not in ACTIVATIONS:
        raise ValueError(f"{file}: activation_function: expected one of {sorted(ACTIVATIONS)}, "
                         f"got {_short(activation)}")
    for name, supported in (("add_cross_attention", False), ("scale_attn_weights", True),
                            ("scale_attn_by_inverse_layer_idx", False)):
        if raw.get(name, supported) != supported:
            raise ValueError(f"{file}: {name}: npformer's GPT supports only {supported}, got "
                             f"{_short(raw[name])}")
    resid, embd = rate("resid_pdrop"), rate("embd_pdrop")
    if resid != embd:
        warnings.warn(f"{file}: embd_pdrop {embd} differs from resid_pdrop {resid}; npformer's "
                      f"GPT has one rate for both and uses {resid} (only training sees it)")
    # every field is read (its error naming the file once) before the configuration is made
    d_model = field("n_embd", check_int)
    n_inner = raw.get("n_inner")
    sizes = dict(vocab_size=field("vocab_size", check_int), d_model=d_model,
                 n_heads=field("n_head", check_int),
                 d_ff=4 * d_model if n_inner is None else field("n_inner", check_int),
                 n_layers=field("n_layer", check_int), max_len=field("n_positions", check_int))
    options = dict(dropout=resid, attention_dropout=rate("attn_pdrop"),
                   layer_norm_eps=field("layer_norm_epsilon", check_real, 1e-5, minimum=0,
                                        min_open=True),
                   tie_embeddings=field("tie_word_embeddings", check_flag, True))
    eos = raw.get("eos_token_id")
    if eos is not None:
        eos = field("eos_token_id", check_int, minimum=0)
        if eos >= sizes["vocab_size"]:
            raise ValueError(f"{file}: eos_token_id: expected a token id in [0, vocab_size="
                             f"{sizes['vocab_size']}), got {eos}")
    try:
        config = GPTConfig(**sizes, **options, activation_dropout=0.0, norm_first=True,
                           activation=ACTIVATIONS[activation], positions="learned")
    except ValueError as e:                   # a rule between fields (d_model and n_heads)
        raise ValueError(f"{file}: {e}") from None
    return config, eos


def hf_names(config):
    """{npformer parameter name: (GPT-2 tensor name, stored transposed)} for ``config``."""
    names = {"tok_embed.weight": "wte.weight", "pos_embed.weight": "wpe.weight"}
    for i in range(config.n_layers):
        ours, theirs = f"blocks.{i}.", f"h.{i}."
        for a, b in (("norm1", "ln_1"), ("self_attn.out_proj", "attn.c_proj"), ("norm2", "ln_2"),
                     ("ffn.linear1", "mlp.c_fc"), ("ffn.linear2", "mlp.c_proj")):
            names[f"{ours}{a}.weight"], names[f"{ours}{a}.bias"] = f"{theirs}{b}.weight", f"{theirs}{b}.bias"
        names[f"{ours}self_attn.in_proj_weight"] = f"{theirs}attn.c_attn.weight"
        names[f"{ours}self_attn.in_proj_bias"] = f"{theirs}attn.c_attn.bias"
    names["norm.weight"], names["norm.bias"] = "ln_f.weight", "ln_f.bias"
    if not config.tie_embeddings:
        names["generator.weight"] = "lm_head.weight"
    return {ours: (theirs, theirs.endswith(CONV1D_TRANSPOSED)) for ours, theirs in names.items()}


def _tensor_files(folder):
    """{tensor name: safetensors file} of the folder (one file, or shards with an index)."""
    single, index = folder / SAFETENSORS, folder / INDEX
    if single.is_file():
        return None, single
    if index.is_file():
        return _shard_map(folder, index), index
    if (folder / PICKLE).is_file():
        raise ValueError(f"{folder}: holds only pytorch_model.bin, a pickle, which npformer never "
                         f"loads (it can run any code); use the model's model.safetensors "
                         f"(the Hugging Face hub offers it for gpt2)")
    raise ValueError(f"{folder}: no {SAFETENSORS} (expected a Hugging Face model folder)")


def _shard_map(folder, index):
    """{tensor name: shard file} of an index's ``weight_map``: every shard a relative file name
    inside the model folder (no absolute path, no ``..``). A shard that is a symbolic link is
    followed, as the folder's other files are: the Hugging Face cache's snapshot folders link
    every file to its blob outside them."""
    raw = read_json(index)
    weight_map = raw.get("weight_map") if isinstance(raw, dict) else None
    if not isinstance(weight_map, dict):
        got = (f"a JSON {type(raw).__name__}" if not isinstance(raw, dict) else
               "no weight_map" if "weight_map" not in raw else
               f"a weight_map of type {type(weight_map).__name__}")
        raise ValueError(f"{index}: expected a JSON object whose weight_map maps tensor names "
                         f"to shard files, got {got}")
    shards, files = {}, {}
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or not shard:
            raise ValueError(f"{index}: weight_map[{_short(name)}]: expected a shard file "
                             f"name, got {_short(shard)}")
        if shard not in files:
            path = Path(shard)
            if path.is_absolute() or ".." in path.parts:
                raise ValueError(f"{index}: weight_map[{_short(name)}]: {_short(shard)} leads "
                                 f"out of the model folder {folder}; expected a file inside it")
            files[shard] = folder / path
        shards[name] = files[shard]
    return shards


def _read_tensors(folder):
    """{GPT-2 name: (file, shape)} of every tensor, the shapes read from the headers alone."""
    safetensors = _require("safetensors")
    from safetensors import safe_open
    shard_map, where = _tensor_files(folder)
    files = sorted(set(shard_map.values())) if shard_map else [where]
    found = {}
    for file in files:
        try:
            with safe_open(str(file), framework="np") as f:
                for key in f.keys():
                    found[key] = (file, tuple(f.get_slice(key).get_shape()))
        except (OSError, safetensors.SafetensorError) as e:
            raise ValueError(f"{file}: not a readable safetensors file ({e})") from None
    return found, where


def read_gpt2(path, dtype=np.float32):
    """A Hugging Face GPT-2 folder as ``(GPTConfig in dtype, {npformer parameter name: array},
    eos_token_id or None)``: the tensors checked against config.json by name and shape (from
    the files' headers, before any is read) and the Conv1D ones transposed. ValueError naming
    the file for a missing config, another model type, a pickle, missing, unexpected or
    mis-shaped tensors. ``nf.GPT.from_pretrained`` builds the model from it."""
    folder = model_folder(path)
    config, eos = read_config(folder)
    config = config.replace(dtype=dtype)
    found, where = _read_tensors(folder)
    # config.json's n_layer decides how many names are listed below: it may claim no more
    # blocks than the headers hold tensors of (a lying n_layer of 10**9 is refused here)
    blocks = {int(m.group(1)) for m in map(_BLOCK.match, found) if m}
    if config.n_layers > len(blocks):
        raise ValueError(f"{folder / 'config.json'}: n_layer: {config.n_layers} blocks, but "
                         f"{where} holds tensors of {len(blocks)} (h.N.*); the files do not "
                         f"describe one model")
    names = hf_names(config)
    shapes = config.parameter_shapes()
    prefix = "transformer."            # GPT2LMHeadModel's files; the original gpt2 ones have none
    stored = {}
    for key in found:
        short = key[len(prefix):] if key.startswith(prefix) else key
        if short in stored:
            raise ValueError(f"{where}: holds both {stored[short]!r} and {key!r}")
        stored[short] = key
    wanted = {theirs for theirs, _ in names.values()}
    missing = sorted(theirs for theirs in wanted if theirs not in stored)
    extra = sorted(k for k in stored if k not in wanted and not _BUFFER.fullmatch(k)
                   and not (k == "lm_head.weight" and config.tie_embeddings))
    wrong = []
    for ours, (theirs, transposed) in names.items():
        if theirs in stored:
            shape = found[stored[theirs]][1]
            expected = shapes[ours][::-1] if transposed else shapes[ours]
            if shape != tuple(expected):
                wrong.append(f"{theirs}: expected {tuple(expected)}, got {shape}")
    if missing or extra or wrong:
        parts = ([f"missing {missing}"] if missing else []) + \
                ([f"unexpected {extra}"] if extra else []) + \
                ([f"mis-shaped [{'; '.join(wrong)}]"] if wrong else [])
        raise ValueError(f"{where}: does not hold the GPT-2 of its config.json: " + ", ".join(parts))
    from safetensors import safe_open
    with contextlib.ExitStack() as stack:
        handles = {}

        def tensor(key):
            file = found[key][0]
            if file not in handles:
                handles[file] = stack.enter_context(safe_open(str(file), framework="np"))
            try:
                value = handles[file].get_tensor(key)
            except TypeError as e:            # e.g. bfloat16, which NumPy lacks
                raise ValueError(f"{file}: {key}: cannot be read as a NumPy array ({e})") from None
            if not np.issubdtype(value.dtype, np.floating) or not np.isfinite(value).all():
                raise ValueError(f"{file}: {key}: expected finite floating-point weights")
            return value

        weights = {}
        for ours, (theirs, transposed) in names.items():
            value = tensor(stored[theirs])
            weights[ours] = np.ascontiguousarray(value.T if transposed else value, dtype=dtype)
        if config.tie_embeddings and "lm_head.weight" in stored:
            head = tensor(stored["lm_head.weight"])
            if head.shape != found[stored["wte.weight"]][1] or \
                    not np.array_equal(head, tensor(stored["wte.weight"])):
                raise ValueError(f"{where}: lm_head.weight differs from wte.weight, but "
                                 f"config.json ties them (tie_word_embeddings)")
    return config, weights, eos


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
    _require("tokenizers")
    from tokenizers import Tokenizer
    try:
        return Tokenizer.from_file(str(file))
    except Exception as e:               # the Rust library's own exception type
        raise ValueError(f"{file}: not a tokenizers file ({str(e).splitlines()[0]})") from None


__all__ = ["ACTIVATIONS", "BUFFERS", "CONV1D_TRANSPOSED", "TextTokenizer", "hf_names",
           "load_tokenizer", "model_folder", "read_config", "read_gpt2", "read_json"]
