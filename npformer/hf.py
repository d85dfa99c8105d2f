"""Hugging Face model folders, without PyTorch: one loader for every family.

    model = nf.from_pretrained("path/to/folder")    # gpt2, llama, qwen2 or qwen3
    config, eos, model_type = read_model_config("path/to/folder")
    tokenizer = load_tokenizer("path/to/folder")

A folder's ``config.json`` names its family (``model_type``, ``npformer.families``), which
says what the rest means: its ``GPTConfig`` with the family's defaults, one tensor map (each
Hugging Face tensor -> an npformer parameter, the rows of it the tensor fills, stored
transposed or not: GPT-2's Conv1D weights are), its end ids. The files themselves are read by
``npformer.formats`` (JSON within bounds, the folder and its shards, safetensors through the
header: float32, float16 and bfloat16, widened exactly). ``pytorch_model.bin`` is refused: it
is a pickle, and loading a pickle runs whatever code it holds.

Everything a file claims is checked before it is acted on: the layers the headers hold before
the layer count is believed, every name, shape and dtype before a weight is read, every weight
finite. The model is built through the configuration's registered class (``npformer.registry``
gives ``GPTConfig`` its ``model_class``); this loader sits above the layers, and
``GPT.from_pretrained`` calls it from inside the method, never at import.
"""
import numpy as np

from . import families
from .families import producible_ends
from .formats.folder import config_json, model_folder, stored_tensors
from .formats.json import read_json, read_json_object
from .formats.safetensors import FLOAT_DTYPES, StoredTensor, chunks, copy_into, read_header, \
    read_tensor
from .formats.tokenizer import TextTokenizer, load_tokenizer
from .nn.init import uninitialised


def _config_json(path):
    """(the Path of a folder's config.json, the JSON object it holds)."""
    return config_json(path)


def read_model_config(path, warn=True):
    """``(GPTConfig, eos ids, model_type)`` of a folder's ``config.json``, for every family
    (``npformer.families``, one module each; any other ``model_type`` is refused,
    naming it). The eos ids are an int, a tuple of ints (Llama 3 ends with any of several) or
    None, as the family's end-id rule finds them; an id the model cannot produce is left out
    (:func:`~npformer.families.producible_ends`, which warns with ``warn``: False where the
    caller loads the folder next, which warns). ValueError naming the file and the field for
    anything npformer's GPT cannot be."""
    folder = model_folder(path)
    file, raw = _config_json(folder)
    try:
        family = families.get(raw.get("model_type"))
    except ValueError as e:
        raise ValueError(f"{file}: {e}") from None
    config = family.from_hf_config(raw, file)
    return config, family.end_ids(folder, raw, config.vocab_size, warn), family.name


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


def _check_block_count(config, family, names, folder, where):
    """config.json's layer count decides how many names are listed next: it may claim no more
    blocks than the headers hold tensors of (a lying 10**9 is refused here, before a single
    name is listed)."""
    pattern = family.layer_pattern
    blocks = {int(m.group(1)) for m in map(pattern.match, names) if m}
    if config.n_layers > len(blocks):
        raise ValueError(f"{folder / 'config.json'}: {family.layers_key}: {config.n_layers} "
                         f"blocks, but {where} holds tensors of {len(blocks)} "
                         f"({family.layer.format('N')}*); the files do not describe one model")


def _unprefixed(family, found, where):
    """The stored tensors by their names less the family's optional prefix (GPT2LMHeadModel's
    files say ``transformer.h.0...``, the original gpt2 ones ``h.0...``)."""
    if not family.prefix:
        return found
    stored, spelled = {}, {}
    for key, tensor in found.items():
        short = key[len(family.prefix):] if key.startswith(family.prefix) else key
        if short in stored:
            raise ValueError(f"{where}: holds both {spelled[short]!r} and {key!r}")
        stored[short], spelled[short] = tensor, key
    return stored


def check_files(folder, family, config):
    """({Hugging Face name: (StoredTensor, npformer parameter, rows, transposed)}, {stored name:
    StoredTensor}) of a folder of ``family`` whose config.json gives ``config``, every claim
    checked from the headers before a weight is read: as many blocks as the layer count, no
    tensor missing, none unexpected, each of its shape and of a floating-point dtype."""
    found, where = stored_tensors(folder)
    stored = _unprefixed(family, found, where)
    _check_block_count(config, family, stored, folder, where)
    _check_fits(config, folder, family.size_keys)
    names = families.tensor_names(family, config)
    shapes = config.parameter_shapes()
    embedding = next(name for name, (ours, _, _) in names.items() if ours == "tok_embed.weight")
    missing = [name for name in names if name not in stored]
    extra = sorted(name for name in stored if name not in names and not family.is_buffer(name)
                   and not (name == family.head and config.tie_embeddings))
    wrong = []
    for name, (ours, rows, transposed) in names.items():
        if name in stored:
            shape = shapes[ours]
            expected = (len(range(shape[0])[rows]), *shape[1:])
            expected = expected[::-1] if transposed else expected
            if stored[name].shape != expected:
                wrong.append(f"{name}: expected {expected}, got {stored[name].shape}")
            elif stored[name].dtype not in FLOAT_DTYPES:
                wrong.append(f"{name}: expected floating-point weights (F32, F16, BF16, F64), "
                             f"got {stored[name].dtype}")
    head = family.head
    if config.tie_embeddings and head in stored and stored[head].shape != \
            shapes["tok_embed.weight"]:
        wrong.append(f"{head}: expected {shapes['tok_embed.weight']} (tied to {embedding}), got "
                     f"{stored[head].shape}")
    if missing or extra or wrong:
        parts = ([f"missing {missing}"] if missing else []) + \
                ([f"unexpected {extra}"] if extra else []) + \
                ([f"wrong [{'; '.join(wrong)}]"] if wrong else [])
        raise ValueError(f"{where}: does not hold the {family.display} model of its "
                         f"config.json: " + ", ".join(parts))
    return {name: (stored[name], ours, rows, transposed)
            for name, (ours, rows, transposed) in names.items()}, stored


def from_pretrained(path, dtype=np.float32):
    """The model of a Hugging Face folder of any family (``model_type`` in config.json), in
    eval mode: its ``GPTConfig`` (:func:`read_model_config`), every tensor checked by name,
    shape and dtype from the safetensors headers before the model is built (:func:`check_files`),
    then read tensor by tensor into the model's parameter buffer (bfloat16 widened exactly;
    every value must be finite; a tensor stored transposed, as GPT-2's Conv1D weights, is read
    whole then transposed). The model is built without initial weights
    (``nn.init.uninitialised``), so the peak memory is about the float32 weights once, plus one
    tensor of the files; its dropout generator starts from ``config.seed`` (nothing was drawn
    from it). ``model.eos_id``: the folder's end-of-text id, or a tuple of them (generation
    stops at any); an id the model cannot produce is left out with one warning
    (:func:`~npformer.families.producible_ends`). ``model.name_or_path``: the folder (a PEFT
    adapter's base_model_name_or_path). ``dtype``: float32, or float64 for checks. ValueError
    naming the file for anything else."""
    folder = model_folder(path)
    config, eos, model_type = read_model_config(folder)
    family = families.get(model_type)
    config = config.replace(dtype=dtype)
    plan, stored = check_files(folder, family, config)
    try:                       # npformer.GPT (registered by npformer.registry), its buffers
        with uninitialised():  # untouched until the copies below write every weight
            model = config.model_class(config)
    except ValueError as e:                       # a size this machine cannot hold
        raise ValueError(f"{folder / 'config.json'}: {e}") from None
    model.name_or_path = str(folder)
    params = dict(model.named_parameters())
    for name, (tensor, ours, rows, transposed) in plan.items():
        dest = params[ours].data[rows]
        if transposed:
            dest[...] = read_tensor(tensor, name, dest.dtype).T
        else:
            copy_into(tensor, name, dest)
    head = family.head
    if config.tie_embeddings and head in stored:
        embedding = next(n for n, (_, ours, _, _) in plan.items() if ours == "tok_embed.weight")
        flat = params["tok_embed.weight"].data.reshape(-1)
        for i, part in chunks(stored[head], head):
            if not np.array_equal(flat[i:i + len(part)], part.astype(model.dtype)):
                raise ValueError(f"{stored[head].file}: {head} differs from {embedding}, but "
                                 f"config.json ties them (tie_word_embeddings)")
    model.eos_id = eos
    return model.eval()


__all__ = ["FLOAT_DTYPES", "StoredTensor", "TextTokenizer", "check_files", "from_pretrained",
           "load_tokenizer", "model_folder", "producible_ends", "read_header", "read_json",
           "read_json_object", "read_model_config", "read_tensor"]
