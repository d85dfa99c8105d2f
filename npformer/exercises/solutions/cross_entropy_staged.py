"""Exercise, staged: softmax cross-entropy with ignore_index and label smoothing, one named
intermediate at a time, before the fused exercise.

Derivation: docs/backprop.md#cross-entropy (section "Cross-entropy").

The forward is a chain, each line one value (the cache holds them all, by name); logits (N, V),
targets (N,) integers, eps the smoothing; valid = targets != ignore_index, count = its sum:
    e = exp(logits - m)   (N, V); m, the row's largest logit, only keeps exp finite: it
                          cancels in logp, so treat it as a constant
    z = sum(e)            (N, 1)   over the classes
    logp = logits - m - log z   (N, V)
    nll = -logp[n, targets[n]]  (N,)   (an ignored row reads class 0; valid drops it below)
    smooth = -mean(logp)  (N,)     over the classes
    per_token = (1 - eps) nll + eps smooth   (N,)
    loss = sum(per_token * valid) / count    a number
Write ``cross_entropy_staged_backward``: given dout = dL/dloss (a number), the gradient of every
value, one line each, in the order given (from loss back to logits): each is dL/d(that value),
the shape of the value. logits is used twice (by e and by logp): its gradient sums both. Leave
a line None to have the ones before it checked; the check names the first wrong line and those
that use it.
"""
import numpy as np


def cross_entropy_staged_forward(logits, targets, ignore_index=-100, label_smoothing=0.0):
    """Returns (loss, cache); the cache is {name: value} of the chain."""
    n = len(targets)
    valid = targets != ignore_index
    shifted = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(shifted)
    z = e.sum(axis=-1, keepdims=True)
    logp = shifted - np.log(z)
    nll = -logp[np.arange(n), np.where(valid, targets, 0)]
    smooth = -logp.mean(axis=-1)
    per_token = (1 - label_smoothing) * nll + label_smoothing * smooth
    loss = (per_token * valid).sum() / valid.sum()
    return float(loss), dict(targets=np.where(valid, targets, 0), valid=valid, eps=label_smoothing,
                             e=e, z=z, logp=logp, nll=nll, smooth=smooth, per_token=per_token)


def cross_entropy_staged_backward(dout, cache):
    """dout (a number) -> {name: gradient} of per_token, smooth, nll, logp, z, e and logits."""
    c = cache
    vocab = c["logp"].shape[-1]
    # --- your code ---
    dper_token = dout * c["valid"] / c["valid"].sum()        # (N,)
    dsmooth = c["eps"] * dper_token                           # (N,)
    dnll = (1 - c["eps"]) * dper_token                        # (N,)
    dlogp = -dsmooth[:, None] / vocab - dnll[:, None] * np.eye(vocab)[c["targets"]]  # (N, V)
    dz = -dlogp.sum(axis=-1, keepdims=True) / c["z"]          # (N, 1)
    de = np.repeat(dz, vocab, axis=1)                         # (N, V)
    dlogits = dlogp + de * c["e"]                             # (N, V): from logp and e
    # --- end of your code ---
    return dict(per_token=dper_token, smooth=dsmooth, nll=dnll, logp=dlogp, z=dz, e=de,
                logits=dlogits)
