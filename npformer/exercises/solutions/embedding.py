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


from npformer.functional.embedding import embedding_backward  # yours, its docstring:
# "dout (B, T, D) -> dw (V, D), of dout's dtype."
