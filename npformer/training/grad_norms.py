"""Per-layer gradient norms: the L2 norm of each layer's share of the gradient, the metric that
shows where a deep stack's gradient vanishes or explodes (post-norm against pre-norm).

A layer is a parameter's module path cut after its layer index (``encoder.layers.0``,
``blocks.3``), or its module path where it has none (``src_embed``, ``decoder.norm``,
``generator``). The norms are read from the gradients' views into ``model.flat_grads``, in the
order of ``named_parameters()`` (the order of depth), and never change them.
"""
import math

import numpy as np

from ..optim.clip import sum_of_squares


def layer_of(name):
    """The layer a parameter ``name`` belongs to: ``encoder.layers.0.ffn.linear1.weight`` ->
    ``encoder.layers.0``; ``decoder.norm.weight`` -> ``decoder.norm``; ``weight`` -> ``weight``."""
    parts = name.split(".")
    for i, part in enumerate(parts[:-1]):
        if part.isdigit():
            return ".".join(parts[:i + 1])
    return ".".join(parts[:-1]) or name


def layer_grad_norms(model):
    """``{layer: ||grad||}`` of the model's current gradients, layers in the order of depth
    (``named_parameters()``'s), each the square root of its parameters' sums of squares."""
    squares = {}
    for name, p in model.named_parameters():
        if p.grad is None:                      # frozen (npformer.lora): no gradient to log
            continue
        layer = layer_of(name)
        squares[layer] = squares.get(layer, 0.0) + float(sum_of_squares(np.ravel(p.grad)))
    return {layer: math.sqrt(sq) for layer, sq in squares.items()}
