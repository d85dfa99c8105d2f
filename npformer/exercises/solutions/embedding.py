"""Exercise: the token embedding, out[b, t] = scale * w[ids[b, t]] (a scaled table lookup).

Derivation: docs/backprop.md#embedding (section "Embedding").

Shapes: ids (B, T) integers, w (V, D) -> out (B, T, D).
Write ``embedding_backward``: given dout (B, T, D), return dw (V, D). A row of w read at several
positions receives the sum of their gradients; the row ``padding_idx`` (when given) gets none.
The ids are integers: they have no gradient.
"""
import numpy as np


from npformer.functional.embedding import embedding_forward  # given, its docstring:
# "out = scale * w[ids]. Returns (out, cache)."


def embedding_backward(dout, cache, padding_idx=None):
    """dout (B, T, D) -> dw (V, D), of dout's dtype."""
    ids, w_shape, scale = cache
    # --- your code ---
    dw = np.zeros(w_shape, dtype=dout.dtype)
    flat_ids = ids.reshape(-1)                       # (B*T,)
    flat_dout = dout.reshape(-1, w_shape[1])         # (B*T, D)
    np.add.at(dw, flat_ids, flat_dout)               # repeated ids accumulate
    if scale != 1.0:
        dw *= scale
    if padding_idx is not None:
        dw[padding_idx] = 0
    return dw
    # --- end of your code ---
