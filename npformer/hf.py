"""Hugging Face model folders, without PyTorch: ``config.json``, the safetensors weights and
``tokenizer.json`` (the tokenizers package; extra ``hf``: ``pip install "npformer[hf]"``).

    model = nf.from_pretrained("path/to/folder")         # gpt2, llama, qwen2 or qwen3
    model = nf.GPT.from_pretrained("path/to/gpt2")      # GPT-2 only: builds from read_gpt2's result
    config, weights, eos_id = read_gpt2("path/to/gpt2")  # GPTConfig, {npformer name: array}
    tokenizer = load_tokenizer("path/to/folder")

``pytorch_model.bin`` is refused: it is a pickle, and loading a pickle runs whatever code it holds.

**GPT-2.** Its linear layers are ``Conv1D`` modules, which store their weight as (in, out), the
transpose of a Linear's (out, in); the four of them are listed in ``CONV1D_TRANSPOSED`` and
transposed on the way in. The fused ``c_attn`` (D, 3D) holds the query, key and value columns in
that order, as npformer's fused ``in_proj_weight`` (3D, D) holds their rows.

**The Llama family** (``llama``: Llama 2 and 3, SmolLM, TinyLlama; ``qwen2``; ``qwen3``) is
npformer's GPT with RMSNorm, SwiGLU, rotary positions and grouped-query attention: a preset of
``GPTConfig``'s fields (``read_model_config``), not a class of its own. Its separate q, k and v
projections fill rows of the fused ``in_proj_weight``, its gate and up projections rows of the
SwiGLU's fused ``linear1``: ``LLAMA_RENAMES`` is the table, ``hf_parameter(config, name)`` says
where any Hugging Face tensor (``model.layers.3.self_attn.k_proj.weight``) lives in npformer
(the LoRA adapters find ``q_proj`` ... ``down_proj`` through it). Its weights are read by
``from_pretrained`` straight from the files' bytes, memory-mapped, tensor by tensor into the
model's buffer: float32, float16 and bfloat16 (float32's upper 16 bits, widened exactly).

Everything a file claims is checked before it is acted on: the layers the headers hold before
``num_hidden_layers`` is believed, every name, shape and dtype before a weight is read, every
weight finite. This module builds a model only in ``from_pretrained`` (through the
configuration's registered class); ``nn.gpt`` calls the rest.
"""
import contextlib
import json
import re
import warnings
from pathlib import Path
from typing import NamedTuple

import numpy as np

from .configs import GPTConfig, check_rope_scaling
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


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs):
    """A JSON object as a dict, refusing a key given twice (Python's json keeps the last
    silently: an index naming one tensor in two shards would load either)."""
    obj = {}
    for key, value in pairs:
        if key in obj:
            raise _DuplicateKey(f"{_short(key)} appears twice in one JSON object (which one "
                                f"is meant?)")
        obj[key] = value
    return obj


def read_json(file):
    """The JSON value a small file holds (config.json, an index); ValueError naming the file for
    anything else: too large, not UTF-8, not JSON, nested too deeply for Python to read, a
    number it cannot hold (an integer of thousands of digits), or an object giving one key
    twice."""
    try:
        size = file.stat().st_size
        if size > MAX_JSON_BYTES:
            raise ValueError(f"{file}: {size:,} bytes, more than the {MAX_JSON_BYTES:,} a "
                             f"Hugging Face JSON file needs; not a model's file")
        return json.loads(file.read_bytes().decode("utf-8"), object_pairs_hook=_unique_keys)
    except RecursionError:
        raise ValueError(f"{file}: not a JSON file npformer can read (nested too deeply)") from None
    except _DuplicateKey as e:
        raise ValueError(f"{file}: {e}") from None
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


def read_json_object(folder, name, missing):
    """(the Path of ``folder / name``, the JSON object it holds). ValueError naming the folder
    where the file is absent (``missing`` says what the folder was expected to be), or the file
    where it holds no JSON object."""
    file = Path(folder) / name
    if not file.is_file():
        raise ValueError(f"{folder}: no {name} ({missing})")
    raw = read_json(file)
    if not isinstance(raw, dict):
        raise ValueError(f"{file}: expected a JSON object, got {type(raw).__name__}")
    return file, raw


def _config_json(path):
    """(the Path of a folder's config.json, the JSON object it holds)."""
    return read_json_object(model_folder(path), "config.json",
                            "expected a Hugging Face model folder")


def _field_reader(file, raw):
    """``field(name, check, default=None, **bounds)``: config.json's ``name`` through ``check``
    (a missing key takes ``default``; without one it is refused); the error names the file and
    the key."""
    def field(name, check, default=None, **bounds):
        if name not in raw and default is None:
            raise ValueError(f"{file}: {name}: missing")
        try:
            return check(name, raw.get(name, default), **bounds)
        except ValueError as e:
            raise ValueError(f"{file}: {e}") from None
    return field


def read_config(path, warn=True):
    """The ``GPTConfig`` of a Hugging Face GPT-2 folder's ``config.json`` and its
    ``eos_token_id`` (None where it names none, or one the model cannot produce: see
    :func:`producible_ends`, which warns with ``warn``). ValueError naming the file and the
    field, by its name in config.json, for anything npformer's GPT cannot be. (Any supported
    type: :func:`read_model_config`.)"""
    file, raw = _config_json(path)
    if raw.get("model_type") != "gpt2":
        raise ValueError(f"{file}: model_type: expected 'gpt2', got "
                         f"{_short(raw.get('model_type'))}")
    return _gpt2_config(file, raw, warn)


def producible_ends(file, key, ids, vocab_size, warn=True):
    """The end-of-text ids among ``ids`` (``file``'s ``key``: non-negative ints) that a model of
    ``vocab_size`` tokens can produce: one int, a tuple of them (generation stops at any), or
    None. An id of ``vocab_size`` or more is dropped with one warning naming the file (with
    ``warn``), as transformers loads such a folder (GPT2Config(vocab_size=101) keeps GPT-2's
    end id 50256): the end id matters only to generation, which then stops at the other ids or
    only at its length limit."""
    ids = tuple(dict.fromkeys(ids))
    kept = tuple(i for i in ids if i < vocab_size)
    if warn and len(kept) < len(ids):
        lost = ", ".join(str(i) for i in ids if i >= vocab_size)
        then = (f"generation stops at {', '.join(map(str, kept))} or at the length limit"
                if kept else "generation stops only at the length limit")
        warnings.warn(f"{file}: {key}: {lost} cannot be produced by a model of vocab_size="
                      f"{vocab_size} (ids 0 to {vocab_size - 1}); {then}", stacklevel=2)
    return None if not kept else kept[0] if len(kept) == 1 else kept


def _gpt2_config(file, raw, warn=True):
    field = _field_reader(file, raw)

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
        eos = producible_ends(file, "eos_token_id", [field("eos_token_id", check_int, minimum=0)],
                              sizes["vocab_size"], warn)
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
    """{tensor name: shard file} of an index's ``weight_map`` (at least one): every shard a
    relative file name inside the model folder (no absolute path, no ``..``). A shard that is a symbolic link is
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
    if not weight_map:
        raise ValueError(f"{index}: its weight_map maps no tensor to a shard file (it is {{}}); "
                         f"expected the model's tensor names")
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
            if not files[shard].is_file():
                raise ValueError(f"{index}: weight_map[{_short(name)}]: names {_short(shard)}, "
                                 f"which is not a file of {folder}")
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
                    if key in found:
                        raise ValueError(f"{file}: holds {_short(key)}, which "
                                         f"{found[key][0].name} holds too; which is meant?")
                    found[key] = (file, tuple(f.get_slice(key).get_shape()))
        except (OSError, safetensors.SafetensorError) as e:
            raise ValueError(f"{file}: not a readable safetensors file ({e})") from None
    return found, where


# GPTConfig's size fields by their names in config.json (for check_memory's message)
GPT2_SIZE_KEYS = {"d_model": "n_embd", "n_layers": "n_layer", "max_len": "n_positions",
                  "d_ff": "n_inner"}
LLAMA_SIZE_KEYS = {"d_model": "hidden_size", "d_ff": "intermediate_size",
                   "n_layers": "num_hidden_layers", "max_len": "max_position_embeddings"}


def _check_fits(config, folder, keys):
    """Refuse a config.json whose sizes this machine cannot hold (``ModelConfig.check_memory``,
    in closed form: the weights, their gradients and the rotary tables of max_len positions)
    before its parameters' shapes are listed (after its block count is held against the files'
    headers): a lying ``n_embd`` of 10**9 would otherwise fail inside NumPy ("array is too
    big") without naming the file. ``keys``: the size fields by their names in config.json."""
    try:
        config.check_memory(names=keys)
    except ValueError as e:
        raise ValueError(f"{folder / 'config.json'}: {e}") from None


def _check_block_count(config, names, pattern, field, spelled, folder, where):
    """config.json's layer count (``field``) decides how many names are listed next: it may
    claim no more blocks than the headers hold tensors of (a lying 10**9 is refused here, before
    a single name is listed). ``pattern`` matches a block's tensor names, its group 1 the block."""
    blocks = {int(m.group(1)) for m in map(pattern.match, names) if m}
    if config.n_layers > len(blocks):
        raise ValueError(f"{folder / 'config.json'}: {field}: {config.n_layers} blocks, but "
                         f"{where} holds tensors of {len(blocks)} ({spelled}); the files do not "
                         f"describe one model")


def read_gpt2(path, dtype=np.float32):
    """A Hugging Face GPT-2 folder as ``(GPTConfig in dtype, {npformer parameter name: array},
    eos_token_id or None)``: the tensors checked against config.json by name and shape (from
    the files' headers, before any is read) and the Conv1D ones transposed. ValueError naming
    the file for a missing config, another model type, a pickle, missing, unexpected or
    mis-shaped tensors. ``nf.GPT.from_pretrained`` builds the model from it."""
    folder = model_folder(path)
    config, eos = read_config(folder)        # (its one warning of an end id out of reach)
    config = config.replace(dtype=dtype)
    found, where = _read_tensors(folder)
    # config.json's n_layer decides how many names are listed below: it may claim no more
    # blocks than the headers hold tensors of (a lying n_layer of 10**9 is refused here)
    _check_block_count(config, found, _BLOCK, "n_layer", "h.N.*", folder, where)
    _check_fits(config, folder, GPT2_SIZE_KEYS)
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


# -- the Llama family ------------------------------------------------------------------------------
LLAMA_FAMILY = ("llama", "qwen2", "qwen3")
MODEL_TYPES = ("gpt2",) + LLAMA_FAMILY

# The rename table of the Llama family: each Hugging Face module -> (the npformer parameter its
# weight goes to, less the "weight"/"bias" it ends with, and the part of that parameter's rows
# it fills; None: all of them). A block's modules are model.layers.N.<module>, npformer's
# blocks.N.<parameter>. The three attention projections fill the fused in_proj_weight (rows
# [q | k | v]: H, then H_kv, then H_kv heads), the gate and up projections the SwiGLU's fused
# linear1 (rows [gate | up], d_ff each).
LLAMA_BLOCK_RENAMES = {
    "self_attn.q_proj": ("self_attn.in_proj_", "q"),
    "self_attn.k_proj": ("self_attn.in_proj_", "k"),
    "self_attn.v_proj": ("self_attn.in_proj_", "v"),
    "self_attn.o_proj": ("self_attn.out_proj.", None),
    "self_attn.q_norm": ("self_attn.q_norm.", None),        # qwen3
    "self_attn.k_norm": ("self_attn.k_norm.", None),        # qwen3
    "mlp.gate_proj": ("ffn.linear1.", "gate"),
    "mlp.up_proj": ("ffn.linear1.", "up"),
    "mlp.down_proj": ("ffn.linear2.", None),
    "input_layernorm": ("norm1.", None),
    "post_attention_layernorm": ("norm2.", None),
}
LLAMA_RENAMES = {
    "model.embed_tokens": ("tok_embed.", None),
    "model.norm": ("norm.", None),
    "lm_head": ("generator.", None),                        # untied only
}
# per-block buffers that older Llama files store (the rotary frequencies): not weights
_LLAMA_BUFFER = re.compile(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq")
_LLAMA_BLOCK = re.compile(r"model\.layers\.(\d+)\.")
# the Hugging Face defaults of the fields a Llama-family config.json may leave out (a size it
# leaves out is refused: no model has the default size of its class)
LLAMA_DEFAULTS = {
    "llama": dict(num_key_value_heads=None, head_dim=None, max_position_embeddings=2048,
                  attention_bias=False, mlp_bias=False),
    "qwen2": dict(num_key_value_heads=32, head_dim=None, max_position_embeddings=32768),
    "qwen3": dict(num_key_value_heads=32, head_dim=128, max_position_embeddings=32768,
                  attention_bias=False),
}
ROPE_THETA = 10000.0                   # Hugging Face's default_theta


def _rows(config, part):
    """The rows of a fused npformer parameter that ``part`` ("q", "k", "v", "gate", "up"; None:
    all) fills, as a slice."""
    q = config.n_heads * config.head_size
    kv = (config.n_kv_heads or config.n_heads) * config.head_size
    return {None: slice(None), "q": slice(0, q), "k": slice(q, q + kv),
            "v": slice(q + kv, q + 2 * kv), "gate": slice(0, config.d_ff),
            "up": slice(config.d_ff, 2 * config.d_ff)}[part]


def llama_names(config):
    """{Hugging Face tensor name: (npformer parameter name, rows)} of every tensor a
    Llama-family model of ``config`` (a ``GPTConfig``) has, in npformer's parameter order:
    ``model.named_parameters()[name].data[rows]`` is the tensor. Which exist (biases, the
    query/key norms, an untied lm_head) the configuration's parameters decide."""
    shapes = config.parameter_shapes()
    names = {}
    modules = [(f"model.layers.{i}.{theirs}", f"blocks.{i}.{ours}", part)
               for i in range(config.n_layers)
               for theirs, (ours, part) in LLAMA_BLOCK_RENAMES.items()]
    modules += [(theirs, ours, part) for theirs, (ours, part) in LLAMA_RENAMES.items()]
    for theirs, ours, part in modules:
        for suffix in ("weight", "bias"):
            if ours + suffix in shapes:
                names[f"{theirs}.{suffix}"] = (ours + suffix, _rows(config, part))
    order = {name: i for i, name in enumerate(shapes)}
    return dict(sorted(names.items(), key=lambda item: (order[item[1][0]],
                                                        item[1][1].start or 0)))


def hf_parameter(config, name):
    """Where the Hugging Face tensor ``name`` (e.g. ``model.layers.3.self_attn.k_proj.weight``)
    of a Llama-family model of ``config`` lives in npformer: ``(parameter name, rows)``, the
    tensor being ``parameters[parameter name].data[rows]`` (for k_proj, the key rows of the
    fused ``in_proj_weight``). ValueError for a name the model does not have."""
    match = _LLAMA_BLOCK.match(name)
    layer = int(match.group(1)) if match else None
    if layer is not None and layer >= config.n_layers:
        raise ValueError(f"{name}: the model has {config.n_layers} layers (0 to "
                         f"{config.n_layers - 1})")
    single = config.replace(n_layers=1) if layer is not None else config
    key = name if layer is None else f"model.layers.0.{name[match.end():]}"
    found = llama_names(single).get(key)
    if found is None:
        raise ValueError(f"{name}: not a tensor of this model (npformer.hf.llama_names "
                         f"lists them: a bias, a query/key norm or an lm_head only where the "
                         f"configuration has one)")
    ours, rows = found
    if layer is not None:
        ours = f"blocks.{layer}." + ours[len("blocks.0."):]
    return ours, rows


def read_model_config(path, warn=True):
    """``(GPTConfig, eos ids, model_type)`` of a folder's ``config.json``, for every supported
    ``model_type`` (gpt2, llama, qwen2, qwen3; any other is refused, naming it). The eos ids
    are an int, a tuple of ints (Llama 3 ends with any of several) or None: for the Llama
    family, ``generation_config.json``'s ``eos_token_id``, else config.json's, else
    ``tokenizer_config.json``'s ``eos_token`` looked up in ``tokenizer.json``; an id the model
    cannot produce is left out (:func:`producible_ends`, which warns with ``warn``: False
    where the caller loads the folder next, which warns). ValueError naming the file and the
    field for anything npformer's GPT cannot be."""
    folder = model_folder(path)
    file, raw = _config_json(folder)
    model_type = raw.get("model_type")
    if model_type == "gpt2":
        return (*_gpt2_config(file, raw, warn), model_type)
    if model_type not in LLAMA_FAMILY:
        raise ValueError(f"{file}: model_type: expected one of {', '.join(MODEL_TYPES)}, got "
                         f"{_short(model_type)}")
    config = _llama_config(file, raw, model_type)
    return config, _eos_ids(folder, raw, config.vocab_size, warn), model_type


def _llama_config(file, raw, model_type):
    """The GPTConfig preset of a Llama, Qwen2 or Qwen3 config.json (sizes checked under their
    Hugging Face names first, so that an error names the key of the file)."""
    field = _field_reader(file, raw)
    defaults = LLAMA_DEFAULTS[model_type]

    def optional(name, check, **bounds):
        """A key that may be missing or null: Hugging Face's default (None: none)."""
        value = raw.get(name, defaults.get(name))
        if value is None:
            return None
        try:
            return check(name, value, **bounds)
        except ValueError as e:
            raise ValueError(f"{file}: {e}") from None

    hidden, heads = field("hidden_size", check_int), field("num_attention_heads", check_int)
    sizes = dict(vocab_size=field("vocab_size", check_int), d_model=hidden, n_heads=heads,
                 d_ff=field("intermediate_size", check_int),
                 n_layers=field("num_hidden_layers", check_int),
                 max_len=field("max_position_embeddings", check_int,
                               defaults["max_position_embeddings"]))
    kv = optional("num_key_value_heads", check_int) or heads
    head_dim = optional("head_dim", check_int)
    if head_dim is None and hidden % heads:
        raise ValueError(f"{file}: hidden_size: expected a multiple of num_attention_heads="
                         f"{heads} (config.json gives no head_dim), got {hidden}")
    if heads % kv:
        raise ValueError(f"{file}: num_key_value_heads: expected a divisor of "
                         f"num_attention_heads={heads} (each key/value head serves a group of "
                         f"query heads), got {kv}")
    size = head_dim or hidden // heads
    if size % 2:
        name = "head_dim" if head_dim else f"hidden_size / num_attention_heads ({hidden} / {heads})"
        raise ValueError(f"{file}: {name}: expected an even head size (rotary positions turn "
                         f"pairs of dimensions), got {size}")
    activation = raw.get("hidden_act", "silu")
    if activation != "silu":
        raise ValueError(f"{file}: hidden_act: expected 'silu' (the SwiGLU of the "
                         f"{model_type} family), got {_short(activation)}")
    if optional("use_sliding_window", check_flag):
        raise ValueError(f"{file}: use_sliding_window: npformer's attention sees every earlier "
                         f"position; expected false, got true")
    layer_types = raw.get("layer_types")
    if layer_types is not None and (not isinstance(layer_types, list) or
                                    any(t != "full_attention" for t in layer_types)):
        raise ValueError(f"{file}: layer_types: npformer's attention sees every earlier "
                         f"position; expected only 'full_attention', got {_short(layer_types)}")
    if model_type == "qwen2":                  # q, k and v add a bias; o_proj and the MLP none
        qkv_bias, proj_bias = True, False
    else:                                      # attention_bias: q, k, v and o; mlp_bias: the MLP
        attention_bias = optional("attention_bias", check_flag)
        mlp_bias = bool(optional("mlp_bias", check_flag))
        if attention_bias != mlp_bias:
            raise ValueError(f"{file}: mlp_bias: npformer's GPT has one flag for the biases of "
                             f"o_proj and the MLP, so expected attention_bias's value "
                             f"{attention_bias}, got {mlp_bias}")
        qkv_bias = proj_bias = attention_bias
    theta, scaling = _rope(file, raw, sizes["max_len"])
    options = dict(dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, norm_first=True,
                   positions="rotary", norm="rmsnorm", ffn="gated", activation="silu",
                   layer_norm_eps=field("rms_norm_eps", check_real, 1e-6, minimum=0,
                                        min_open=True),
                   tie_embeddings=field("tie_word_embeddings", check_flag, False),
                   n_kv_heads=kv, head_dim=head_dim, qkv_bias=qkv_bias, proj_bias=proj_bias,
                   qk_norm=model_type == "qwen3", rope_theta=theta, rope_scaling=scaling)
    try:
        return GPTConfig(**sizes, **options)
    except ValueError as e:                   # none expected: every rule was checked above
        raise ValueError(f"{file}: {e}") from None


def _rope(file, raw, max_len):
    """(rope_theta, rope_scaling for GPTConfig) of a config.json: Hugging Face's older keys
    (``rope_theta``, ``rope_scaling``) or transformers 5's ``rope_parameters`` (the theta
    inside), read as transformers reads them: a ``rope_scaling`` that is null or an empty
    object counts as absent, and ``rope_parameters`` is read instead; a ``rope_theta`` inside
    the object read wins over the top-level one. Rotary positions as they are ("default") or
    Llama 3's rescaling ("llama3"); anything else is refused, naming the key."""
    name = "rope_scaling" if raw.get("rope_scaling") not in (None, {}) else "rope_parameters"
    rope = raw.get(name)
    if rope is None:
        rope = {}
    if not isinstance(rope, dict) or any(isinstance(v, dict) for v in rope.values()):
        raise ValueError(f"{file}: {name}: expected one object of rotary settings such as "
                         f"{{'rope_type': 'llama3', 'factor': 8.0, ...}}, got {_short(rope)}")
    theta = rope.get("rope_theta", raw.get("rope_theta", ROPE_THETA))
    theta_name = f"{name}.rope_theta" if "rope_theta" in rope else "rope_theta"
    try:
        theta = check_real(theta_name, theta, minimum=0, min_open=True)
        for key, where in (("partial_rotary_factor", raw), ("partial_rotary_factor", rope)):
            if where.get(key, 1.0) != 1.0:
                raise ValueError(f"{key}: npformer turns every pair of a head; expected 1.0, "
                                 f"got {_short(where[key])}")
    except ValueError as e:
        raise ValueError(f"{file}: {e}") from None
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind == "default":
        return theta, None
    if kind != "llama3":
        raise ValueError(f"{file}: {name}: rope_type: expected 'default' or 'llama3' (the "
                         f"rotary rescalings npformer builds), got {_short(kind)}")
    try:                            # the configuration's own check, named as config.json's keys
        return theta, check_rope_scaling(
            {"original_max_position_embeddings": max_len, **rope}, name)
    except ValueError as e:
        raise ValueError(f"{file}: {e}") from None


def _eos_ids(folder, raw, vocab_size, warn):
    """The end-of-text ids of a Llama-family folder (``read_model_config``): an int, a tuple of
    ints, or None."""
    sources = []
    generation = folder / "generation_config.json"
    if generation.is_file():
        data = read_json(generation)
        if not isinstance(data, dict):
            raise ValueError(f"{generation}: expected a JSON object, got {type(data).__name__}")
        sources.append((generation, data))
    sources.append((folder / "config.json", raw))
    for file, data in sources:
        value = data.get("eos_token_id")
        if value is None:
            continue
        ids = value if isinstance(value, list) else [value]
        if not ids:
            continue
        for i in ids:
            if not isinstance(i, int) or isinstance(i, bool) or i < 0:
                raise ValueError(f"{file}: eos_token_id: expected a token id (an int from 0) "
                                 f"or a list of them, got {_short(value)}")
        return producible_ends(file, "eos_token_id", ids, vocab_size, warn)
    return _tokenizer_config_eos(folder, vocab_size, warn)


def _tokenizer_config_eos(folder, vocab_size, warn):
    """tokenizer_config.json's ``eos_token`` (a string, or {"content": string}) as its id in
    tokenizer.json (:func:`producible_ends`); None where either file or the entry is
    missing."""
    file = folder / "tokenizer_config.json"
    if not file.is_file() or not (folder / "tokenizer.json").is_file():
        return None
    data = read_json(file)
    token = data.get("eos_token") if isinstance(data, dict) else None
    if isinstance(token, dict):
        token = token.get("content")
    if token is None:
        return None
    if not isinstance(token, str):
        raise ValueError(f"{file}: eos_token: expected a token (a string), got {_short(token)}")
    i = load_tokenizer(folder).token_to_id(token)
    if i is None:
        raise ValueError(f"{file}: eos_token: {_short(token)} is not a token of "
                         f"{folder / 'tokenizer.json'}")
    return producible_ends(file, f"eos_token {_short(token)}", [i], vocab_size, warn)


# -- safetensors, read through the header ----------------------------------------------------------
# safetensors' dtype names -> the NumPy dtype their bytes are read as (bfloat16: as uint16, then
# widened: a bfloat16 is the upper 16 bits of a float32)
FLOAT_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16}
ITEMSIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I64": 8,
             "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1}
MAX_HEADER_BYTES = 100 << 20           # the format's own limit
CHUNK = 1 << 20                        # elements converted at a time


class StoredTensor(NamedTuple):
    file: Path
    dtype: str                         # safetensors' name: "F32", "BF16", ...
    shape: tuple
    start: int                         # byte offset of its data in the file


def _counts(value, length=None):
    """Whether a header's value is a list of non-negative ints (of ``length`` items)."""
    return (isinstance(value, list) and (length is None or len(value) == length) and
            all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in value))


def read_header(file):
    """{tensor name: StoredTensor} of a safetensors file, from its header alone (8 bytes of
    length, then JSON). Every entry is checked against the file: a known dtype, a shape of
    non-negative ints, data offsets inside the file that span exactly shape x itemsize bytes.
    ValueError naming the file (and the tensor) otherwise."""
    try:
        size = file.stat().st_size
        with open(file, "rb") as f:
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else None
            if n is None or n > min(MAX_HEADER_BYTES, size - 8):
                raise ValueError(f"{file}: not a safetensors file (its first 8 bytes give a "
                                 f"header of {n} bytes; the file has {size})")
            text = f.read(n)
    except OSError as e:
        raise ValueError(f"{file}: cannot be read ({e.strerror or e})") from None
    try:
        header = json.loads(text.decode("utf-8"), object_pairs_hook=_unique_keys)
    except (RecursionError, UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"{file}: not a safetensors file (its header is not a JSON object "
                         f"npformer can read: {str(e) or 'nested too deeply'})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{file}: not a safetensors file (its header is a JSON "
                         f"{type(header).__name__}, not an object)")
    base, data_bytes = 8 + n, size - 8 - n
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype = entry.get("dtype") if isinstance(entry, dict) else None
        shape = entry.get("shape") if isinstance(entry, dict) else None
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not isinstance(dtype, str) or dtype not in ITEMSIZES or not _counts(shape) or \
                not _counts(offsets, 2):
            raise ValueError(f"{file}: {_short(name)}: expected a dtype, a shape and two data "
                             f"offsets, got {_short(entry)}")
        begin, end = offsets
        need = int(np.prod(shape, dtype=object)) * ITEMSIZES[dtype]
        if not begin <= end <= data_bytes or end - begin != need:
            raise ValueError(f"{file}: {_short(name)}: its data offsets {offsets} do not hold "
                             f"a {dtype} tensor of shape {tuple(shape)} ({need} bytes) inside "
                             f"the file's {data_bytes} bytes of data")
        tensors[name] = StoredTensor(file, dtype, tuple(shape), base + begin)
    return tensors


def _stored_tensors(folder):
    """({tensor name: StoredTensor} of the folder's safetensors files, what to name in an
    error: model.safetensors or the index), the headers alone read. A sharded folder's index
    and shards must agree: every tensor in exactly one shard, the one the index names."""
    shard_map, where = _tensor_files(folder)
    files = list(dict.fromkeys(shard_map.values())) if shard_map else [where]
    found = {}
    for file in files:
        for name, tensor in read_header(file).items():
            if name in found:
                raise ValueError(f"{file}: holds {_short(name)}, which {found[name].file.name} "
                                 f"holds too; which is meant?")
            if shard_map is not None and shard_map.get(name) != file:
                raise ValueError(f"{where}: weight_map[{_short(name)}]: expected {file.name}, "
                                 f"which holds it, got {_short(shard_map.get(name))}")
            found[name] = tensor
    if shard_map is not None:
        for name, file in shard_map.items():
            if name not in found:
                raise ValueError(f"{where}: weight_map[{_short(name)}]: {file.name} does not "
                                 f"hold it")
    return found, where


def _converted(tensor, name):
    """(offset, float array) chunks of a stored tensor's values, flat, read from its file a
    chunk at a time (``CHUNK`` elements into one reused buffer: each chunk is valid until the
    next is read) and widened to float32 where stored as bfloat16; ValueError for a dtype that
    is not floating point. Read, not memory-mapped: a mapped file's pages stay in the process's
    memory as long as the map, read ones are the page cache's."""
    if tensor.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{tensor.file}: {name}: expected floating-point weights (F32, F16, "
                         f"BF16, F64), got {tensor.dtype}")
    count = int(np.prod(tensor.shape))
    if count == 0:
        return
    buffer = np.empty(min(count, CHUNK), dtype=FLOAT_DTYPES[tensor.dtype])
    with open(tensor.file, "rb") as f:
        f.seek(tensor.start)
        for i in range(0, count, CHUNK):
            part = buffer[:min(CHUNK, count - i)]
            if f.readinto(memoryview(part).cast("B")) != part.nbytes:   # the header said so
                raise ValueError(f"{tensor.file}: {name}: the file ends inside the tensor")
            if tensor.dtype == "BF16":
                part = (part.astype(np.uint32) << 16).view(np.float32)      # exact
            yield i, part


def _copy_into(tensor, name, dest):
    """A stored tensor's values into ``dest`` (a contiguous view of a parameter), a chunk at a
    time; ValueError naming the file and the tensor for a value that is not finite in dest's
    dtype."""
    flat = dest.reshape(-1)
    assert np.shares_memory(flat, dest), "a parameter's rows must be one contiguous block"
    for i, part in _converted(tensor, name):
        out = flat[i:i + len(part)]
        with np.errstate(over="ignore", invalid="ignore"):    # refused just below
            out[...] = part
        if not np.isfinite(out).all():
            bad = int(np.flatnonzero(~np.isfinite(out))[0])
            raise ValueError(f"{tensor.file}: {name}: expected finite weights (in "
                             f"{flat.dtype}), got {float(part[bad])} at flat index {i + bad}")


def read_tensor(tensor, name, dtype):
    """A stored tensor (:func:`read_header`'s) as a new array of ``dtype`` and its shape, read a
    chunk at a time as the model's weights are (:func:`_copy_into`: bfloat16 and float16
    widened exactly); ValueError naming the file and ``name`` for a dtype that is not floating
    point or a value that is not finite in ``dtype``."""
    out = np.empty(tensor.shape, dtype)
    _copy_into(tensor, name, out)
    return out


def _check_llama_files(folder, config, model_type):
    """{Hugging Face name: (StoredTensor, npformer parameter, rows)} of a Llama-family folder,
    every claim checked from the headers before a weight is read: as many blocks as
    num_hidden_layers, no tensor missing, none unexpected, each of its shape and of a
    floating-point dtype."""
    stored, where = _stored_tensors(folder)
    _check_block_count(config, stored, _LLAMA_BLOCK, "num_hidden_layers", "model.layers.N.*",
                       folder, where)
    _check_fits(config, folder, LLAMA_SIZE_KEYS)
    names = llama_names(config)
    shapes = config.parameter_shapes()
    missing = [name for name in names if name not in stored]
    extra = sorted(name for name in stored if name not in names
                   and not _LLAMA_BUFFER.fullmatch(name)
                   and not (name == "lm_head.weight" and config.tie_embeddings))
    wrong = []
    for name, (ours, rows) in names.items():
        if name in stored:
            shape = shapes[ours]
            expected = (len(range(shape[0])[rows]), *shape[1:])
            if stored[name].shape != expected:
                wrong.append(f"{name}: expected {expected}, got {stored[name].shape}")
            elif stored[name].dtype not in FLOAT_DTYPES:
                wrong.append(f"{name}: expected floating-point weights (F32, F16, BF16, F64), "
                             f"got {stored[name].dtype}")
    if config.tie_embeddings and "lm_head.weight" in stored and \
            stored["lm_head.weight"].shape != shapes["tok_embed.weight"]:
        wrong.append(f"lm_head.weight: expected {shapes['tok_embed.weight']} (tied to "
                     f"model.embed_tokens.weight), got {stored['lm_head.weight'].shape}")
    if missing or extra or wrong:
        parts = ([f"missing {missing}"] if missing else []) + \
                ([f"unexpected {extra}"] if extra else []) + \
                ([f"wrong [{'; '.join(wrong)}]"] if wrong else [])
        raise ValueError(f"{where}: does not hold the {model_type} model of its config.json: "
                         + ", ".join(parts))
    return {name: (stored[name], ours, rows) for name, (ours, rows) in names.items()}, stored


def from_pretrained(path, dtype=np.float32):
    """The model of a Hugging Face folder, in eval mode: GPT-2 (``GPT.from_pretrained``), or a
    Llama, Qwen2 or Qwen3 (``model_type`` in config.json): its ``GPTConfig`` preset
    (:func:`read_model_config`), every tensor checked by name, shape and dtype from the
    safetensors headers before the model is built, then read tensor by tensor, memory-mapped,
    into the model's parameter buffer (bfloat16 widened exactly; every value must be finite).
    The model is built without initial weights (``nn.init.uninitialised``), so the peak memory
    is about the float32 weights once, plus one tensor of the files; its dropout generator
    starts from ``config.seed`` (nothing was drawn from it).
    ``model.eos_id``: the folder's end-of-text id, or a tuple of them (generation stops at any);
    an id the model cannot produce is left out with one warning (:func:`producible_ends`).
    ``dtype``: float32, or float64 for checks. ValueError naming the file for anything else."""
    folder = model_folder(path)
    if _config_json(folder)[1].get("model_type") == "gpt2":      # read (and warned about) once
        return GPTConfig.model_class.from_pretrained(folder, dtype)
    config, eos, model_type = read_model_config(folder)
    config = config.replace(dtype=dtype)
    plan, stored = _check_llama_files(folder, config, model_type)
    from .nn.init import uninitialised           # (npformer.nn reads GPT-2 through this file)
    try:                       # npformer.GPT (registered by npformer.registry), its buffers
        with uninitialised():  # untouched until the copies below write every weight
            model = config.model_class(config)
    except ValueError as e:                       # a size this machine cannot hold
        raise ValueError(f"{folder / 'config.json'}: {e}") from None
    model.name_or_path = str(folder)             # (a PEFT adapter's base_model_name_or_path)
    params = dict(model.named_parameters())
    for name, (tensor, ours, rows) in plan.items():
        _copy_into(tensor, name, params[ours].data[rows])
    if config.tie_embeddings and "lm_head.weight" in stored:
        embedding = params["tok_embed.weight"].data.reshape(-1)
        for i, part in _converted(stored["lm_head.weight"], "lm_head.weight"):
            if not np.array_equal(embedding[i:i + len(part)], part.astype(model.dtype)):
                raise ValueError(f"{stored['lm_head.weight'].file}: lm_head.weight differs from "
                                 f"model.embed_tokens.weight, but config.json ties them "
                                 f"(tie_word_embeddings)")
    model.eos_id = eos
    return model.eval()


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
    _require("tokenizers")
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


__all__ = ["ACTIVATIONS", "BUFFERS", "CONV1D_TRANSPOSED", "LLAMA_BLOCK_RENAMES", "LLAMA_FAMILY",
           "LLAMA_RENAMES", "MODEL_TYPES", "StoredTensor", "TextTokenizer", "from_pretrained",
           "hf_names", "hf_parameter", "llama_names", "load_tokenizer", "model_folder",
           "producible_ends", "read_config", "read_gpt2", "read_header", "read_json",
           "read_model_config"]
