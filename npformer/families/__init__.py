"""Model families: what each family (GPT-2, Llama, Mistral, Qwen, Gemma, ...) *is*, one small module each, declared as
data (:class:`~npformer.families.base.Family`): the block fields, the reading of config.json
with its defaults, one tensor map (Hugging Face name -> npformer parameter, rows, transposed),
the end ids, the PEFT target names and the display name. The loader, LoRA's Hugging Face
names, the PEFT files, the merged export and the command line read them here; nothing else
knows a family's tensor names.

    family = families.get("qwen2")           # by config.json's model_type
    names = families.tensor_names(family, config)

A new family is one module here that declares a ``FAMILY`` (found by scanning the package;
docs/architecture.md has the checklist).
"""
import pkgutil
from importlib import import_module

from ..formats.json import short
from .base import Family, parameter_of, producible_ends, rows, tensor_names

# every module of this package that declares a FAMILY, by name: a new family is one new module
MODULES = tuple(m.name for m in pkgutil.iter_modules(__path__) if m.name != "base")
FAMILIES = {f.name: f for f in (getattr(import_module(f"{__name__}.{m}"), "FAMILY", None)
                                for m in MODULES) if f is not None}


def names():
    """The families' names (config.json's ``model_type``), in registry order."""
    return tuple(FAMILIES)


def spelled(joiner="or"):
    """The families' display names as a message or a help string lists them: "GPT-2, Llama,
    Qwen2 or Qwen3"."""
    shown = [f.display for f in FAMILIES.values()]
    return shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} {joiner} {shown[-1]}"


def get(name, where="model_type"):
    """The family named ``name`` (config.json's ``model_type``); ValueError naming ``where``
    and the families for anything else."""
    if not isinstance(name, str) or name not in FAMILIES:
        raise ValueError(f"{where}: expected one of {', '.join(FAMILIES)}, got {short(name)}")
    return FAMILIES[name]


__all__ = ["FAMILIES", "Family", "get", "names", "parameter_of", "producible_ends", "rows",
           "spelled", "tensor_names"]
