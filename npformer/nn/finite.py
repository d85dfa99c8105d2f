"""Where a model's values stop being finite: logits that hold a NaN or an infinity although
every weight is finite (a weight near float32's largest value, 3.4e38, whose products overflow)
would be sampled as if they were a distribution. A decoder state checks its logits
(:func:`check_logits`) and names the first layer whose output is not finite.

    check_logits(logits, model, ids)      # ValueError naming e.g. blocks.0.ffn.linear1
    first_nonfinite_layer(model, ids)     # "blocks.0.ffn.linear1", or None
"""
import numpy as np


def _named_modules(module, prefix=""):
    """(dotted name, module) of ``module``'s descendants, depth first (the model itself not
    included)."""
    for name, child in module._modules.items():
        yield prefix + name, child
        yield from _named_modules(child, prefix + name + ".")


def first_nonfinite_layer(model, ids):
    """The name of the first layer, in the order a forward pass of ``ids`` (B, T) runs them,
    whose output holds a value that is not finite (an inner layer before the block that holds
    it), or None where every output is finite. The model runs in eval mode; every module's
    ``forward`` is watched for the pass and restored after it."""
    found = []

    def watched(name, forward):
        def forward_and_check(*args, **kwargs):
            out = forward(*args, **kwargs)
            if not found and isinstance(out, np.ndarray) and not np.isfinite(out).all():
                found.append(name)
            return out
        return forward_and_check

    modules = [(name, m) for name, m in _named_modules(model) if hasattr(m, "forward")]
    own = {id(module): module.__dict__["forward"] for _, module in modules
           if "forward" in module.__dict__}  # a forward set on the module itself, kept
    for name, module in modules:
        object.__setattr__(module, "forward", watched(name, module.forward))
    try:
        with model.evaluating(), np.errstate(all="ignore"):
            model.forward(ids)
    finally:
        for _, module in modules:
            if id(module) in own:
                object.__setattr__(module, "forward", own[id(module)])
            else:
                del module.forward           # the class's own forward again
    return found[0] if found else None


def check_logits(logits, model, ids):
    """``logits`` unchanged where every value is finite; otherwise ValueError naming the first
    layer of ``model`` whose output is not finite for the tokens ``ids`` (B, T) that gave
    them (the last ``model.max_len`` of them are run again to find it)."""
    if np.isfinite(logits).all():
        return logits
    layer = first_nonfinite_layer(model, ids[:, -model.max_len:])
    where = (f"{layer} is the first layer whose output is not finite" if layer else
             "no layer's output was in a forward pass of the same tokens")
    raise ValueError(f"the model's logits are not finite, so no token can be drawn from them: "
                     f"{where} (a weight that is not finite, or finite weights whose products "
                     f"overflow {np.dtype(model.dtype).name}'s range)")
