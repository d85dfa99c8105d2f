"""PEFT's adapter folders and the merged export of a LoRA model, through the family's tensor
map (``npformer.families``): :func:`save_peft` / :func:`load_peft` write and read PEFT's
``adapter_config.json`` and ``adapter_model.safetensors``; :func:`save_merged` writes a Hugging
Face folder of the merged weights. The adapters themselves are ``npformer.lora``'s."""
import json
import os
import shutil
import warnings
from pathlib import Path

import numpy as np

from . import families
from .checkpoint import write_file_atomic
from .formats.json import read_json_object
from .formats.safetensors import FLOAT_DTYPES, read_header, read_tensor, write_safetensors
from .lora import (adapters, adapters_or_refuse, apply, check_settings, load_adapter_state,
                   peft_family, settings, weight_name)

PEFT_PREFIX = "base_model.model."       # PeftModel's key prefix before the model's own names
PEFT_NAMES = {"rank": "r", "alpha": "lora_alpha", "dropout": "lora_dropout",
              "target_modules": "target_modules"}           # their keys in adapter_config.json


def base_family(model):
    """The family whose Hugging Face names a LoRA model's files use: the one its configuration
    records (``lora.peft_family``: Llama's names for a model that records none), or, for a run
    recorded before configurations named their family, the ``model_type`` its base records."""
    s = settings(model)
    recorded = s.base.get("model_type") if s else None
    if getattr(model.config, "family", None) is None and recorded is not None:
        return families.get(recorded, "the base's model_type")
    return peft_family(model.config)


def hf_modules(model):
    """{(npformer weight, start, stop): (Hugging Face module name as PEFT keys it, stored
    transposed)} of every weight of ``model`` in its family's tensor map
    (:func:`base_family`)."""
    family = base_family(model)
    shapes = {k: v.data.shape for k, v in model.named_parameters()}
    names = {}
    for hf, (ours, rows, transposed) in families.tensor_names(family, model.config).items():
        if hf.endswith(".weight") and ours in shapes:
            start, stop, _ = rows.indices(shapes[ours][0])
            names[(ours, start, stop)] = (family.prefix + hf[:-len(".weight")], transposed)
    return names


def _target_name(family, module):
    """How adapter_config.json's target_modules names ``module`` (a block's, less the family's
    prefix): its last part (``q_proj``, ``c_attn``), or its path in the block where the last
    part names another module too (GPT-2's ``attn.c_proj`` and ``mlp.c_proj``)."""
    inner = family.layer_pattern.sub("", module, count=1)
    leaf = inner.rsplit(".", 1)[-1]
    same = [m for m in family.blocks if m.rsplit(".", 1)[-1] == leaf]
    return leaf if len(same) == 1 else inner


def peft_state(model):
    """({PEFT key: array}, [target_modules names], fan_in_fan_out) of the model's adapters:
    ``base_model.model.<module>.lora_A.weight`` (r, in) and ``lora_B.weight`` (out, r), the
    same for a layer stored transposed (GPT-2's Conv1D), which PEFT marks with
    ``fan_in_fan_out``."""
    family = base_family(model)
    names = hf_modules(model)
    tensors, leaves, transposed = {}, [], set()
    for _, lora in adapters_or_refuse(model):
        key = (weight_name(model, lora), lora.start, lora.stop)
        if key not in names:
            raise ValueError(f"export --format peft: the adapter {lora.target} of {key[0]} rows "
                             f"{key[1]}:{key[2]} is no Hugging Face module of "
                             f"{family.display} (PEFT names it by module: adapt "
                             f"{', '.join(family.peft_targets)} instead)")
        module, flipped = names[key]
        tensors[f"{PEFT_PREFIX}{module}.lora_A.weight"] = lora.A.data
        tensors[f"{PEFT_PREFIX}{module}.lora_B.weight"] = lora.B.data
        leaves.append(_target_name(family, module[len(family.prefix):]))
        transposed.add(flipped)
    if len(transposed) > 1:
        raise ValueError("export --format peft: the adapted layers are stored some transposed, "
                         "some not; PEFT's fan_in_fan_out is one flag for all")
    return tensors, list(dict.fromkeys(leaves)), transposed.pop()


def adapter_config(model, base_name_or_path, leaves, fan_in_fan_out=False):
    s = settings(model)
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path":
            base_name_or_path, "r": s.rank, "lora_alpha": s.alpha, "lora_dropout": s.dropout,
            "target_modules": sorted(leaves), "bias": "none", "fan_in_fan_out": fan_in_fan_out,
            "use_rslora": False, "use_dora": False, "modules_to_save": None,
            "init_lora_weights": True, "inference_mode": True, "layers_to_transform": None,
            "layers_pattern": None, "rank_pattern": {}, "alpha_pattern": {}}


def save_peft(model, out, base_name_or_path=None):
    """Write ``out/adapter_config.json`` and ``out/adapter_model.safetensors`` (float32 or the
    model's dtype) as PEFT's ``save_pretrained`` does; ``PeftModel.from_pretrained(base, out)``
    loads them. Returns the folder."""
    tensors, leaves, fan_in_fan_out = peft_state(model)
    base = base_name_or_path or settings(model).base.get("folder") or ""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_safetensors(out / "adapter_model.safetensors", tensors)
    config = json.dumps(adapter_config(model, str(base), leaves, fan_in_fan_out), indent=2,
                        sort_keys=True) + "\n"
    write_file_atomic(out / "adapter_config.json", lambda f: f.write(config.encode()))
    return out


# PEFT's settings that npformer's LoRA does not implement, at the value that turns them off (a
# None one also off when empty or false, as PEFT versions write them); any other is refused
PEFT_UNSUPPORTED = {"use_dora": False, "use_rslora": False, "bias": "none",
                    "modules_to_save": None, "layers_to_transform": None, "rank_pattern": {},
                    "alpha_pattern": {}, "exclude_modules": None,
                    "layer_replication": None, "trainable_token_indices": None,
                    "use_bdlora": None, "lora_bias": False, "target_parameters": None}


def read_peft_config(folder):
    """(rank, alpha, dropout, targets, base_model_name_or_path, fan_in_fan_out) of a PEFT
    folder's adapter_config.json; ValueError naming the file and the key for anything
    npformer's LoRA is not."""
    file, raw = read_json_object(folder, "adapter_config.json", "not a PEFT adapter folder")
    if raw.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"{file}: peft_type: expected 'LORA', got {raw.get('peft_type')!r}")
    for key, plain in PEFT_UNSUPPORTED.items():
        value = raw.get(key)
        if not (value is None or value == plain or
                (plain is None and (value is False or value in ([], {})))):
            raise ValueError(f"{file}: {key}: npformer's LoRA reads {plain!r} only, got "
                             f"{raw[key]!r:.60}")
    targets = raw.get("target_modules")
    if isinstance(targets, str) or not isinstance(targets, list) or not targets:
        raise ValueError(f"{file}: target_modules: expected a list of module names, got "
                         f"{targets!r:.60}")
    try:
        rank, alpha, dropout = check_settings(raw.get("r"), raw.get("lora_alpha", 8),
                                              raw.get("lora_dropout", 0.0), PEFT_NAMES)
    except ValueError as e:
        raise ValueError(f"{file}: {e}") from None
    fan_in_fan_out = raw.get("fan_in_fan_out", False)
    if not isinstance(fan_in_fan_out, bool):
        raise ValueError(f"{file}: fan_in_fan_out: expected true or false, got "
                         f"{fan_in_fan_out!r:.60}")
    return rank, alpha, dropout, targets, raw.get("base_model_name_or_path"), fan_in_fan_out


def _warn_of_another_base(model, file, named):
    """Warn once where the adapter's ``base_model_name_or_path`` (``named``, read from
    ``file``) names a folder here that is not the one ``model`` was read from
    (``model.name_or_path``). (A hub name that is no folder here, or a model of unknown
    origin, is not judged.)"""
    ours = getattr(model, "name_or_path", None)
    if not (isinstance(named, str) and named and ours and os.path.isdir(named)):
        return
    if not os.path.samefile(named, ours):
        warnings.warn(f"{file}: base_model_name_or_path names {named}, but the base it is applied "
                      f"to was read from {ours}: the adapter was trained for another model",
                      stacklevel=3)


def load_peft(model, folder):
    """Apply and load a PEFT adapter folder (``adapter_config.json``,
    ``adapter_model.safetensors``) onto ``model`` (its base, frozen here). Every key of the file
    must be an adapter of the config's targets and every adapter must be there, each of its
    shape, in a floating-point dtype (float32, float64, float16 or bfloat16, read as the model's
    weights are: ``npformer.formats.safetensors.read_tensor``) and finite in the model's. Returns the model."""
    rank, alpha, dropout, targets, base_name, fan_in_fan_out = read_peft_config(folder)
    folder = Path(folder)
    file = Path(folder) / "adapter_model.safetensors"
    if not file.is_file():
        raise ValueError(f"{folder}: no adapter_model.safetensors")
    stored = read_header(file)
    try:
        apply(model, rank, alpha, dropout, targets, names=PEFT_NAMES)
    except ValueError as e:
        raise ValueError(f"{folder / 'adapter_config.json'}: {e}") from None
    names = hf_modules(model)
    arrays = {}
    wanted = {}
    for path, lora in adapters(model):
        module, transposed = names[(weight_name(model, lora), lora.start, lora.stop)]
        if fan_in_fan_out != transposed:
            raise ValueError(f"{folder / 'adapter_config.json'}: fan_in_fan_out: expected "
                             f"{str(transposed).lower()} for {module} of a "
                             f"{base_family(model).display} base (stored "
                             f"{'(in, out)' if transposed else '(out, in)'}), got "
                             f"{str(fan_in_fan_out).lower()}")
        wanted[f"{PEFT_PREFIX}{module}.lora_A.weight"] = f"{path}.A"
        wanted[f"{PEFT_PREFIX}{module}.lora_B.weight"] = f"{path}.B"
    missing = [k for k in wanted if k not in stored]
    extra = [k for k in stored if k not in wanted]
    wrong = [f"{k}: expected floating-point weights ({', '.join(FLOAT_DTYPES)}), got {t.dtype}"
             for k, t in stored.items() if k in wanted and t.dtype not in FLOAT_DTYPES]
    if missing or extra or wrong:
        parts = ([f"missing {missing[:4]}"] if missing else []) + \
                ([f"unexpected {extra[:4]}"] if extra else []) + wrong[:4]
        raise ValueError(f"{file}: does not hold the adapters of its adapter_config.json for "
                         f"this model: " + "; ".join(parts))
    dtype = np.dtype(model.config.dtype)
    for key, ours in wanted.items():
        arrays[ours] = read_tensor(stored[key], key, dtype)
    load_adapter_state(model, arrays, str(file))
    model.lora.base = {"folder": None, "kind": "peft"}
    _warn_of_another_base(model, folder / "adapter_config.json", base_name)
    return model


# -- the merged model ---------------------------------------------------------------------------
WEIGHT_FILES = (".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack", ".ckpt")


def merged_tensors(model):
    """{Hugging Face name: float32 array} of a model of a family (:func:`base_family`) with its
    adapters' updates added (the model itself unchanged), each stored as its family stores it
    (GPT-2's Conv1D weights transposed)."""
    params = dict(model.named_parameters())
    deltas = {}
    for _, lora in adapters(model):
        if not lora.merged:
            deltas.setdefault(weight_name(model, lora), []).append(lora)
    out = {}
    for hf, (ours, rows, transposed) in families.tensor_names(base_family(model),
                                                              model.config).items():
        value = np.array(params[ours].data[rows], dtype=np.float32)
        start, _, _ = rows.indices(params[ours].data.shape[0])
        for lora in deltas.get(ours, ()):
            stop = start + value.shape[0]
            if start <= lora.start and lora.stop <= stop:
                value[lora.start - start:lora.stop - start] += lora.delta_weight()
        out[hf] = np.ascontiguousarray(value.T) if transposed else value
    return out


def save_merged(model, base_folder, out, dtype="float32"):
    """A Hugging Face folder of the merged model (``transformers`` loads it): the base folder's
    config.json (its ``torch_dtype`` set to ``dtype``), tokenizer and generation files, and
    one model.safetensors of the weights with the adapters added, in float32 or bfloat16."""
    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"dtype: expected float32 or bfloat16, got {dtype!r}")
    base_folder, out = Path(base_folder), Path(out)
    _, config = read_json_object(base_folder, "config.json", "the base model's folder is needed "
                                 "for its configuration and tokenizer")
    out.mkdir(parents=True, exist_ok=True)
    for item in sorted(base_folder.iterdir()):
        if item.is_file() and not item.name.endswith(WEIGHT_FILES) and \
                not item.name.endswith(".index.json") and item.name != "config.json":
            shutil.copyfile(item, out / item.name)
    config["torch_dtype"] = dtype
    text = json.dumps(config, indent=2) + "\n"
    write_file_atomic(out / "config.json", lambda f: f.write(text.encode()))
    write_safetensors(out / "model.safetensors", merged_tensors(model), dtype)
    return out
