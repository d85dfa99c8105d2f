"""LoRA fine-tuning (Hu et al. 2021): the base weights frozen, each chosen projection learning a
low-rank update (alpha / r) B A, as Hugging Face PEFT's ``LoraConfig`` makes them.

    model = nf.from_pretrained("path/to/SmolLM2-135M")
    nf.lora.apply(model, rank=8, alpha=16, dropout=0.05, target_modules=["q_proj", "v_proj"])
    ...train: only the adapters are in model.flat_params, the optimizer and the clipping...
    nf.lora.merge(model)        # W += (alpha / r) B A in place (eval only); unmerge undoes it

Target names: PEFT's (``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``, ``gate_proj``, ``up_proj``,
``down_proj``), found through the Llama family's tensor map (``npformer.families``):
``k_proj`` is the key rows of the fused ``in_proj_weight``, ``gate_proj`` the gate rows of
SwiGLU's ``linear1``. npformer's own names work for any GPT and the translator: ``in_proj``
(the attention's fused projection: one adapter over all its rows; a cross-attention gets one
for its query rows and one for its key and value rows, which come from another input),
``out_proj``, ``linear1``, ``linear2``, ``generator``.

The adapters are :class:`npformer.nn.lora.LoRA` modules, children of the projection they adapt
(``blocks.3.self_attn.lora_q_proj.A``). A checkpoint of a LoRA run holds them alone
(:func:`adapter_state`) and records its base by folder and by :func:`base_sha256`. This module
is the surgery alone: PEFT's files and the merged export are ``npformer.lora_files``', rebuilding a
LoRA run from its checkpoint ``npformer.training.lora_runs``'s.
"""
import hashlib
import re
from dataclasses import asdict, dataclass, field

import numpy as np

from . import families
from .nn.attention import MultiHeadAttention
from .nn.linear import Linear
from .nn.lora import LoRA
from .nn.module import Module
from .parts import is_gated
from .validation import check_int, check_real

# The family whose module names PEFT's targets are for a model that records none (Llama's:
# q_proj ... down_proj); a model of a family takes its own (GPT-2's c_attn, c_proj, c_fc)
PEFT_FAMILY = families.get("llama")
NPFORMER_TARGETS = ("in_proj", "out_proj", "linear1", "linear2", "generator")
DEFAULT_TARGETS = PEFT_FAMILY.default_targets    # PEFT's default for the Llama family
SETTINGS = ("rank", "alpha", "dropout", "target_modules")   # what apply's messages name


@dataclass
class LoRASettings:
    """What ``apply`` was given, and the base it adapts (``base``: {"folder", "kind",
    "model_type", "sha256"} where known)."""
    rank: int
    alpha: float
    dropout: float
    targets: tuple
    seed: int = 0
    base: dict = field(default_factory=dict)

    def to_dict(self):
        d = asdict(self)
        d["targets"] = list(self.targets)
        return d

    @classmethod
    def from_dict(cls, d, where="lora"):
        try:
            return cls(rank=int(d["rank"]), alpha=float(d["alpha"]), dropout=float(d["dropout"]),
                       targets=tuple(str(t) for t in d["targets"]), seed=int(d.get("seed", 0)),
                       base=dict(d.get("base") or {}))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{where}: expected rank, alpha, dropout and targets, got "
                             f"{d!r:.120} ({e})") from None


# -- finding the targets ------------------------------------------------------------------------
def named_modules(model, prefix=""):
    """(dotted path, module) of every module of ``model`` (the model itself as "")."""
    yield prefix, model
    for name, child in model._modules.items():
        yield from named_modules(child, f"{prefix}.{name}" if prefix else name)


def _module_at(model, path):
    m = model
    for part in path.split("."):
        m = m._modules[part]
    return m


def peft_family(config):
    """The family whose Hugging Face module names a model of ``config`` is adapted by: the one
    its configuration records, or ``PEFT_FAMILY`` for one that records none."""
    family = getattr(config, "family", None)
    return PEFT_FAMILY if family is None else families.get(family, "config.family")


def peft_modules(family, name):
    """The modules inside a block that the PEFT target ``name`` names for ``family``: a target
    name's (GPT-2's ``c_proj``: the attention's and the MLP's), or one module by its path in
    the block (``attn.c_proj``, as an exported adapter names it where its last part is
    ambiguous); () for anything else."""
    if name in family.peft_targets:
        return family.peft_targets[name]
    modules = {m for group in family.peft_targets.values() for m in group}
    return (name,) if name in modules else ()


def _peft_plan(model, name, called="target_modules"):
    """[(host path, weight attribute, start, stop, label)] of PEFT target ``name`` (of the
    model's family, :func:`peft_family`) in every layer, through the family's tensor map
    (``npformer.families.parameter_of``); ValueError (naming the targets as ``called``) where
    this model has no such layer."""
    config = model.config
    family = peft_family(config)
    if name in family.gated_targets and not is_gated(config):
        raise ValueError(f"{called}: {name!r}: this model's feed-forward is not gated "
                         f"(linear1 and linear2 of an MLP): target linear1, or a gated "
                         f"model's {name}")
    plan = []
    shapes = dict(model.named_parameters())
    for i in range(config.n_layers):
        for module in peft_modules(family, name):
            ours, rows, _ = families.parameter_of(family, config,
                                                  family.layer.format(i) + f"{module}.weight")
            host, attr = ours.rsplit(".", 1)
            start, stop, _ = rows.indices(shapes[ours].data.shape[0])
            plan.append((host, attr, start, stop, name))
    return plan


def _own_plan(model, name):
    """[(host path, weight attribute, start, stop, label)] of npformer's target ``name``."""
    plan = []
    for path, m in named_modules(model):
        leaf = path.rsplit(".", 1)[-1]
        if name == "in_proj" and isinstance(m, MultiHeadAttention):
            rows = m.in_proj_weight.data.shape[0]
            if leaf == "multihead_attn":           # cross-attention: two inputs, two adapters
                plan += [(path, "in_proj_weight", 0, m.qk_dim, "in_proj_q"),
                         (path, "in_proj_weight", m.qk_dim, rows, "in_proj_kv")]
            else:
                plan.append((path, "in_proj_weight", 0, rows, "in_proj"))
        elif isinstance(m, Linear) and leaf == name:
            plan.append((path, "weight", 0, m.out_features, None))
    return plan


def available_targets(model):
    """The target names this model has: PEFT's (a GPT whose rename table finds them) and
    npformer's."""
    names = []
    if _has_layers(model):
        for name in peft_family(model.config).peft_targets:
            try:
                _peft_plan(model, name)
                names.append(name)
            except ValueError:
                pass
    return names + [n for n in NPFORMER_TARGETS
                    if (plan := _own_plan(model, n)) and _tied(model, plan) is None]


def _tied(model, plan):
    """(host weight, the parameter name it is stored under) of the first entry of ``plan`` whose
    weight is another module's parameter (a tied generator: the embedding's), or None."""
    own = {id(p): name for name, p in model.named_parameters()}
    for host, attr, *_ in plan:
        name = own[id(getattr(_module_at(model, host), attr))]
        if name != f"{host}.{attr}":
            return f"{host}.{attr}", name
    return None


def _has_layers(model):
    config = getattr(model, "config", None)
    return getattr(config, "capability", None) == "causal_lm" and hasattr(model, "blocks")


def split_names(names):
    """The names in ``names`` (strings), each also split at commas and spaces, as fine-tuning
    tools' command lines write them (``q_proj,v_proj``); empty pieces dropped."""
    return [n for name in names for n in re.split(r"[,\s]+", name) if n]


def target_names(target_modules, called="target_modules"):
    """The target names ``target_modules`` gives (a name, a list of names, or names separated
    by commas), each once in order; ValueError (naming them as ``called``) for anything else or
    none."""
    if isinstance(target_modules, str):
        target_modules = [target_modules]
    try:
        targets = list(target_modules)
    except TypeError:
        raise ValueError(f"{called}: expected a list of names, got "
                         f"{target_modules!r:.60}") from None
    names = split_names(targets) if all(isinstance(t, str) for t in targets) else []
    if not names:
        raise ValueError(f"{called}: expected a non-empty list of names, got "
                         f"{target_modules!r:.80}")
    return list(dict.fromkeys(names))


def plan_targets(model, target_modules, called="target_modules"):
    """[(host path, weight attribute, start, stop, label)] of every adapter ``target_modules``
    (:func:`target_names`) asks for; ValueError (naming the targets as ``called``) for a name
    that matches nothing (and what exists), or two that name the same rows."""
    plan, seen = [], {}
    for name in target_names(target_modules, called):
        if _has_layers(model) and peft_modules(peft_family(model.config), name):
            found = _peft_plan(model, name, called)
        elif name in NPFORMER_TARGETS:
            found = _own_plan(model, name)
        else:
            found = []
        if not found:
            raise ValueError(f"{called}: {name!r} matches no module of this "
                             f"{type(model).__name__}; it has {', '.join(available_targets(model))}")
        tied = _tied(model, found)
        if tied is not None:
            raise ValueError(f"{called}: {name!r} shares its weight with {tied[1]} "
                             f"(tie_embeddings): an adapter merged into {tied[0]} would change "
                             f"the embedding too; adapt other projections")
        for host, attr, start, stop, label in found:
            for (h, a, s0, s1), other in seen.items():
                if h == host and a == attr and start < s1 and s0 < stop:
                    raise ValueError(f"{called}: {other!r} and {name!r} adapt the same "
                                     f"rows of {host}.{attr}; name one of them")
            seen[(host, attr, start, stop)] = name
            plan.append((host, attr, start, stop, label or name))
    return plan


# -- apply, merge, unmerge ----------------------------------------------------------------------
def setting_names(names=None):
    """{setting: what a message calls it}: ``names`` (a caller's own names for some of
    ``SETTINGS``, such as npformer lm's ``--lora-rank``) over the arguments' names."""
    unknown = sorted(set(names or ()) - set(SETTINGS))
    if unknown:
        raise ValueError(f"names: expected keys among {', '.join(SETTINGS)}, got "
                         f"{', '.join(map(repr, unknown))}")
    return {**{s: s for s in SETTINGS}, **(names or {})}


def check_settings(rank, alpha, dropout, names=None):
    """(rank, alpha, dropout) checked: rank a positive int, alpha a finite number > 0, dropout
    in [0, 1). ValueError naming the setting as ``names`` calls it (:func:`setting_names`)."""
    called = setting_names(names)
    rank = check_int(called["rank"], rank)
    alpha = check_real(called["alpha"], alpha, minimum=0, min_open=True)
    dropout = check_real(called["dropout"], dropout, minimum=0, maximum=1, max_open=True)
    return rank, alpha, dropout


def default_targets(model):
    """PEFT's default targets for ``model``'s family (``q_proj`` and ``v_proj`` for Llama's,
    ``c_attn`` for GPT-2's; :func:`peft_family`)."""
    if not _has_layers(model):
        return DEFAULT_TARGETS
    return peft_family(model.config).default_targets


def adapters(model):
    """[(dotted path, LoRA)] of the adapters of ``model``, in parameter order."""
    return [(path, m) for path, m in named_modules(model) if isinstance(m, LoRA)]


def settings(model):
    """The model's ``LoRASettings`` (None: no adapters)."""
    return getattr(model, "lora", None)


def apply(model, rank=8, alpha=None, dropout=0.0, target_modules=None, seed=0, names=None):
    """Freeze every weight of ``model`` and give each projection ``target_modules`` names (None:
    :func:`default_targets`, PEFT's default for the model's family) a LoRA update of ``rank`` (``alpha`` default: the rank, a scale alpha / r of 1), with
    dropout ``dropout`` on its input (PEFT's ``lora_dropout``), A drawn from ``seed``, B zero.
    In place; returns the model, whose ``flat_params`` now holds the adapters alone (the
    optimizer, the clipping and a data-parallel reduction see nothing else) and ``model.lora``
    its ``LoRASettings``. ``names``: what a refused setting is called in the ValueError
    ({"rank": "--lora-rank", ...}, :func:`setting_names`; default the arguments' names)."""
    if not isinstance(model, Module):
        raise ValueError(f"model: expected an npformer model, got {type(model).__name__}")
    if settings(model) is not None:
        raise ValueError("model: already has LoRA adapters (apply once; a new model for others)")
    called = setting_names(names)
    rank, alpha, dropout = check_settings(rank, rank if alpha is None else alpha, dropout, called)
    if target_modules is None:
        target_modules = default_targets(model)
    plan = plan_targets(model, target_modules, called["target_modules"])
    params = dict(model.named_parameters())
    dtypes = {p.data.dtype for p in params.values()}
    dtype = dtypes.pop() if len(dtypes) == 1 else np.dtype(np.float32)
    narrowest = min(plan, key=lambda t: min(t[3] - t[2],
                                            params[f"{t[0]}.{t[1]}"].data.shape[1]))
    host, attr, start, stop, label = narrowest
    width = min(stop - start, params[f"{host}.{attr}"].data.shape[1])
    if rank > width:
        shape = (stop - start, params[f"{host}.{attr}"].data.shape[1])
        raise ValueError(f"{called['rank']}: expected at most {width}, the width of the "
                         f"narrowest targeted layer ({label} at {host}.{attr}, {shape[0]} x "
                         f"{shape[1]}), got {rank}")
    model.freeze()                                      # no gradient, no Adam state
    rng = np.random.default_rng(seed)
    dropout_rng = getattr(model, "rng", None) or np.random.default_rng(seed)
    for host, attr, start, stop, label in plan:
        m = _module_at(model, host)
        in_features = params[f"{host}.{attr}"].data.shape[1]
        lora = LoRA(in_features, start, stop, rank, alpha, dropout, rng=rng,
                    dropout_rng=dropout_rng, dtype=dtype, target=label)
        lora.weight_name = f"{host}.{attr}"
        name = "lora" if (attr == "weight" and label in NPFORMER_TARGETS) else f"lora_{label}"
        setattr(m, name, lora)
        m.adapters.append(lora)
    lora_settings = LoRASettings(rank, alpha, dropout, tuple(target_names(target_modules)), seed)
    object.__setattr__(model, "lora", lora_settings)
    model.flatten_parameters()
    model.train(model.training)                         # the adapters take the model's mode
    return model


def merge(model):
    """W[rows] += (alpha / r) B A for every adapter, in place: the model then computes the same
    function without the adapters' extra products (eval only). The rows' base values are kept
    aside (the adapter's ``kept``) until ``unmerge`` puts them back."""
    for _, lora in adapters_or_refuse(model):
        if not lora.merged:
            weight = _weight_of(model, lora)
            lora.kept = weight[lora.rows].copy()
            weight[lora.rows] += lora.delta_weight()
            lora.merged = True
    return model


def unmerge(model):
    """Undo ``merge``: the base rows kept aside go back, bit for bit (subtracting the update
    again would round differently, and the base's sha256 would no longer match its checkpoints'
    record)."""
    for _, lora in adapters_or_refuse(model):
        if lora.merged:
            _weight_of(model, lora)[lora.rows] = lora.kept
            lora.kept, lora.merged = None, False
    return model


def adapters_or_refuse(model):
    found = adapters(model)
    if not found:
        raise ValueError("model: has no LoRA adapters (npformer.lora.apply adds them)")
    return found


def weight_name(model, lora):
    """The parameter name of the weight ``lora`` updates (``apply`` records it)."""
    if lora.weight_name is None:
        raise ValueError(f"LoRA {lora.target}: not attached to a model (npformer.lora.apply)")
    return lora.weight_name


def _weight_of(model, lora):
    host, attr = weight_name(model, lora).rsplit(".", 1)
    return getattr(_module_at(model, host), attr).data


# -- the base and the adapters' arrays ---------------------------------------------------------
def is_adapter_name(name):
    return ".lora" in name and name.rsplit(".", 1)[-1] in ("A", "B")


def base_identity(model):
    """A LoRA model's settings, the sha256 of its frozen base filled in once (what its
    checkpoints record and what data-parallel ranks compare), or None without adapters."""
    lora_settings = settings(model)
    if lora_settings is not None and "sha256" not in lora_settings.base:
        lora_settings.base["sha256"] = base_sha256(model)
    return lora_settings


def base_sha256(model):
    """sha256 of the base weights (every parameter that is not an adapter's: name, shape, dtype
    and bytes, in parameter order); a merged model is refused (unmerge gives the base back)."""
    if any(lora.merged for _, lora in adapters(model)):
        raise ValueError("model: its adapters are merged into the base weights; unmerge first")
    h = hashlib.sha256()
    for name, p in model.named_parameters():
        if not is_adapter_name(name):
            h.update(f"{name}{tuple(p.data.shape)}{p.data.dtype.str}".encode())
            h.update(np.ascontiguousarray(p.data).data)
    return h.hexdigest()


def adapter_state(model):
    """{name: copy} of the adapters' arrays (A and B of each), in parameter order."""
    return {name: p.data.copy() for name, p in model.named_parameters() if is_adapter_name(name)}


def load_adapter_state(model, arrays, where):
    """Copy adapter arrays into ``model`` (LoRA applied with the same settings): every name
    present, none extra, each of its shape and the model's dtype, every value finite.
    ValueError naming ``where`` and the entries otherwise; nothing is copied then."""
    own = {name: p for name, p in model.named_parameters() if is_adapter_name(name)}
    missing = [k for k in own if k not in arrays]
    extra = [k for k in arrays if k not in own]
    wrong = []
    for k, p in own.items():
        if k in arrays:
            a = arrays[k]
            if tuple(a.shape) != p.data.shape:
                wrong.append(f"{k}: expected shape {p.data.shape}, got {tuple(a.shape)}")
            elif a.dtype != p.data.dtype:
                wrong.append(f"{k}: expected {p.data.dtype}, got {a.dtype}")
            elif not np.isfinite(a).all():
                wrong.append(f"{k}: holds {int(np.size(a) - np.isfinite(a).sum())} non-finite "
                             f"value(s)")
    if missing or extra or wrong:
        parts = ([f"missing {missing[:5]}"] if missing else []) + \
                ([f"unexpected {extra[:5]}"] if extra else []) + wrong[:5]
        raise ValueError(f"{where}: does not hold this model's adapters: " + "; ".join(parts))
    for k, p in own.items():
        p.data[...] = arrays[k]
    return model
