"""Exercise: inverted dropout, out = x * keep / (1 - p), keep[i] = 0 with probability p.

Derivation: docs/backprop.md#dropout (section "Dropout").

Shapes: x (...) -> out (...), the same shape. The mask comes from npformer's own ``keep_mask``,
so your dropout drops the very units the library's does. When not training (or p == 0) the
forward is the identity and its cache is None.
Write ``dropout_backward``: given dout (...), return dx (...).
"""
from npformer.functional.dropout import keep_mask


from npformer.functional.dropout import dropout_forward  # given, its docstring:
# "Returns (out, cache); cache None when dropout is off."


from npformer.functional.dropout import dropout_backward  # yours, its docstring:
# "dout (...) -> dx (...)."
