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
from .lora import (PEFT_FAMILY, adapters, adapters_or_refuse, apply, check_settings,
                   load_adapter_state, settings, weight_name)

PEFT_PREFIX = "base_model.model."       # PeftModel's key prefix before the model's own names
LLAMA_TYPES = ("llama", "qwen2", "qwen3")
PEFT_NAMES = {"rank": "r", "alpha": "lora_alpha", "dropout": "lora_dropout",
              "target_modules": "target_modules"}           # their keys in adapter_config.json


def hf_modules(model):
    """{(npformer weight, start, stop): Hugging Face module name} of a Llama-family GPT."""
    shapes = {k: v.data.shape for k, v in model.named_parameters()}
    names = {}
    for hf, (ours, rows, _) in families.tensor_names(PEFT_FAMILY, model.config).items():
        if hf.endswith(".weight") and ours in shapes:
            start, stop, _ = rows.indices(shapes[ours][0])
            names[(ours, start, stop)] = hf[:-len(".weight")]
    return names


def _check_llama_base(model, what):
    s = settings(model)
    model_type = (s.base.get("model_type") if s else None) or _guess_model_type(model)
    if model_type not in LLAMA_TYPES:
        reason = ("GPT-2's attention is one fused Conv1D c_attn: its layers are stored "
                  "transposed (PEFT's fan_in_fan_out) and npformer writes no GPT-2 folder; a "
                  "GPT-2 run's checkpoints sample with npformer itself"
                  if model_type == "gpt2" else f"a base of model_type {model_type!r}")
        raise ValueError(f"{what}: written for LoRA runs on llama, qwen2 and qwen3 bases, not "
                         f"{reason}")
    return model_type


def _guess_model_type(model):
    c = model.config
    if getattr(c, "norm", None) == "rmsnorm" and getattr(c, "ffn", None) == "swiglu":
        return "llama"
    return "gpt2" if getattr(c, "capability", None) == "causal_lm" else getattr(c, "arch", None)


def peft_state(model):
    """({PEFT key: array}, [Hugging Face module leaf names]) of the model's adapters:
    ``base_model.model.<module>.lora_A.weight`` (r, in) and ``lora_B.weight`` (out, r)."""
    _check_llama_base(model, "export --format peft")
    names = hf_modules(model)
    tensors, leaves = {}, []
    for _, lora in adapters_or_refuse(model):
        key = (weight_name(model, lora), lora.start, lora.stop)
        module = names.get(key)
        if module is None:
            raise ValueError(f"export --format peft: the adapter {lora.target} of {key[0]} rows "
                             f"{key[1]}:{key[2]} is no Hugging Face module (PEFT names it by "
                             f"module: adapt q_proj, k_proj, ... instead of in_proj)")
        tensors[f"{PEFT_PREFIX}{module}.lora_A.weight"] = lora.A.data
        tensors[f"{PEFT_PREFIX}{module}.lora_B.weight"] = lora.B.data
        leaves.append(module.rsplit(".", 1)[-1])
    return tensors, list(dict.fromkeys(leaves))


def adapter_config(model, base_name_or_path, leaves):
    s = settings(model)
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path":
            base_name_or_path, "r": s.rank, "lora_alpha": s.alpha, "lora_dropout": s.dropout,
            "target_modules": sorted(leaves), "bias": "none", "fan_in_fan_out": False,
            "use_rslora": False, "use_dora": False, "modules_to_save": None,
            "init_lora_weights": True, "inference_mode": True, "layers_to_transform": None,
            "layers_pattern": None, "rank_pattern": {}, "alpha_pattern": {}}


def save_peft(model, out, base_name_or_path=None):
    """Write ``out/adapter_config.json`` and ``out/adapter_model.safetensors`` (float32 or the
    model's dtype) as PEFT's ``save_pretrained`` does; ``PeftModel.from_pretrained(base, out)``
    loads them. Returns the folder."""
    tensors, leaves = peft_state(model)
    base = base_name_or_path or settings(model).base.get("folder") or ""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_safetensors(out / "adapter_model.safetensors", tensors)
    config = json.dumps(adapter_config(model, str(base), leaves), indent=2, sort_keys=True) + "\n"
    write_file_atomic(out / "adapter_config.json", lambda f: f.write(config.encode()))
    return out


# PEFT's settings that npformer's LoRA does not implement, at the value that turns them off (a
# None one also off when empty or false, as PEFT versions write them); any other is refused
PEFT_UNSUPPORTED = {"use_dora": False, "use_rslora": False, "bias": "none",
                    "modules_to_save": None, "layers_to_transform": None, "rank_pattern": {},
                    "alpha_pattern": {}, "fan_in_fan_out": False, "exclude_modules": None,
                    "layer_replication": None, "trainable_token_indices": None,
                    "use_bdlora": None, "lora_bias": False, "target_parameters": None}


def read_peft_config(folder):
    """(rank, alpha, dropout, targets, base_model_name_or_path) of a PEFT folder's
    adapter_config.json; ValueError naming the file and the key for anything npformer's LoRA
    is not."""
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
    return rank, alpha, dropout, targets, raw.get("base_model_name_or_path")


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
    rank, alpha, dropout, targets, base_name = read_peft_config(folder)
    folder = Path(folder)
    _check_llama_base(model, f"{folder}")
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
        module = names[(weight_name(model, lora), lora.start, lora.stop)]
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
    """{Hugging Face name: float array} of a Llama-family model with its adapters' updates
    added (the model itself unchanged)."""
    params = dict(model.named_parameters())
    deltas = {}
    for _, lora in adapters(model):
        if not lora.merged:
            deltas.setdefault(weight_name(model, lora), []).append(lora)
    out = {}
    for hf, (ours, rows, _) in families.tensor_names(PEFT_FAMILY, model.config).items():
        value = np.array(params[ours].data[rows], dtype=np.float32)
        start, _, _ = rows.indices(params[ours].data.shape[0])
        for lora in deltas.get(ours, ()):
            stop = start + value.shape[0]
            if start <= lora.start and lora.stop <= stop:
                value[lora.start - start:lora.stop - start] += lora.delta_weight()
        out[hf] = value
    return out


def save_merged(model, base_folder, out, dtype="float32"):
    """A Hugging Face folder of the merged model (``transformers`` loads it): the base folder's
    config.json (its ``torch_dtype`` set to ``dtype``), tokenizer and generation files, and
    one model.safetensors of the weights with the adapters added, in float32 or bfloat16."""
    _check_llama_base(model, "export --format hf --merge")
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
