"""The hidden layer of the feed-forward block after its first linear: dropout(activation(h)).

The composition of :mod:`.activations` and :mod:`.dropout`, as one forward/backward pair so that
a backend can fuse the two element-wise passes (npformer.kernels does). Derivation: the chain
rule through docs/backprop.md#activations and #dropout:

    out = act(h) * keep * scale      =>      dh = dout * keep * scale * act'(h)
"""
from .activations import ACTIVATIONS
from .dropout import dropout_backward, dropout_forward


def check_activation(activation):
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation: expected one of {sorted(ACTIVATIONS)}, got {activation!r}")


def activation_dropout_forward(h, activation, p, rng, training=True):
    """Shape: h (...) -> out (...), same shape. ``activation`` is a key of ``ACTIVATIONS``;
    dropout as :func:`dropout_forward` (identity when not training or p == 0)."""
    check_activation(activation)
    act_forward, _ = ACTIVATIONS[activation]
    a, act_cache = act_forward(h)                     # (...) activation(h)
    out, drop_cache = dropout_forward(a, p, rng, training)
    return out, (activation, act_cache, drop_cache)


def activation_dropout_backward(dout, cache):
    """dh = act'(h) * (dout * keep * scale): dropout's backward, then the activation's."""
    activation, act_cache, drop_cache = cache
    _, act_backward = ACTIVATIONS[activation]
    return act_backward(dropout_backward(dout, drop_cache), act_cache)
