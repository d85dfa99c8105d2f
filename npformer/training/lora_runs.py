"""A LoRA run rebuilt from what its checkpoint records: the base it adapts checked by hash,
the adapters applied with the run's settings and loaded (:func:`rebuild`), and an adapter (a
PEFT folder or a run's checkpoint) put onto a base (:func:`load_adapter`). Loading the base a
checkpoint records is ``checkpointing.load_base``."""
import os

from ..checkpoint import load_checkpoint
from ..lora import LoRASettings, apply, base_sha256, load_adapter_state
from ..lora_files import load_peft

# the configuration fields a LoRA run may set apart from its base's (npformer lm --dropout)
RUN_DROPOUTS = ("dropout", "attention_dropout", "activation_dropout")


def run_dropouts(run_config, base_config, where, base_name="this model"):
    """{field: the run's rate} where a LoRA run's configuration ``run_config`` differs from its
    base's ``base_config`` (dicts) in a dropout rate alone; ValueError naming ``where`` (an
    adapter for another base model) where any other field differs. A run recorded before
    configurations named their family (no ``family``, or None) adapts its base's: the base
    says what it is, so the two are compared without it."""
    if run_config.get("family") is None:
        run_config = {**run_config, "family": base_config.get("family")}
    differ = sorted(k for k in set(run_config) | set(base_config)
                    if run_config.get(k) != base_config.get(k))
    if [k for k in differ if k not in RUN_DROPOUTS]:
        raise ValueError(f"{where}: is an adapter for another base model (its configuration "
                         f"differs from {base_name}'s in {', '.join(differ)})")
    return {k: run_config[k] for k in differ}


def check_base(model, recorded, where):
    """ValueError unless ``model``'s base weights hash to the sha256 ``recorded``."""
    expected = (recorded or {}).get("sha256")
    if expected is None:
        return
    got = base_sha256(model)
    if got != expected:
        raise ValueError(f"{where}: is an adapter for another base model (its base "
                         f"{recorded.get('folder', '?')} had weights of sha256 {expected[:16]}..., "
                         f"these have {got[:16]}...)")


def rebuild(base_model, lora_meta, arrays, where, dropouts=None):
    """``base_model`` with the adapters of a checkpoint applied and loaded: its settings
    (``lora_meta``), its base checked by hash, its arrays (``{name: array}``) checked.
    ``dropouts``: the run's own dropout rates (``GPT.reconfigured``), where they differ."""
    s = LoRASettings.from_dict(lora_meta, f"{where}: lora")
    check_base(base_model, s.base, where)
    if dropouts:
        base_model = base_model.reconfigured(**dropouts)
    apply(base_model, s.rank, s.alpha, s.dropout, s.targets, s.seed)
    base_model.lora.base = dict(s.base)
    return load_adapter_state(base_model, arrays, where)


def load_adapter(model, path):
    """Apply and load the adapter at ``path`` onto ``model`` (its base, frozen here): a PEFT
    folder (adapter_config.json) or a checkpoint of an npformer LoRA run (RUN/best), whose base
    must be this model (same configuration, same weights by sha256). Returns the model."""
    if os.path.isdir(path) and os.path.isfile(os.path.join(path, "adapter_config.json")):
        return load_peft(model, path)
    if os.path.isdir(path):
        path = os.path.join(path, "best")
    arrays, meta = load_checkpoint(path)
    where = f"adapter {path}"
    if "lora" not in meta:
        raise ValueError(f"{where}: holds no LoRA adapters (a checkpoint of npformer lm "
                         f"--lora-rank, or a PEFT folder with adapter_config.json)")
    theirs = meta.get("config") if isinstance(meta.get("config"), dict) else {}
    dropouts = run_dropouts(theirs, model.config.to_dict(), where)
    weights = {k[len("model/"):]: v for k, v in arrays.items() if k.startswith("model/")}
    return rebuild(model, meta["lora"], weights, where, dropouts=dropouts)
