"""Exercise: the linear layer, y = x W^T + b (PyTorch's layout: W is (D_out, D_in)).

Derivation: docs/backprop.md#linear (section "Linear").

Shapes: x (..., D_in), w (D_out, D_in), b (D_out,) -> y (..., D_out).
Write ``linear_backward``: given dout = dL/dy (..., D_out), return dx (..., D_in),
dw (D_out, D_in) and db (D_out,). Every row of x uses the same W and b.
"""


from npformer.functional.linear import linear_forward  # given, its docstring:
# "y = x @ w.T + b. Returns (y, cache)."


from npformer.functional.linear import linear_backward  # yours, its docstring:
# "dout (..., D_out) -> dx (..., D_in), dw (D_out, D_in), db (D_out,)."
