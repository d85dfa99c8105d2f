# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 1. One layer by hand, and its gradient check
#
# Every layer of npformer is a pair of functions: a **forward** that computes the output and
# keeps what the backward needs (the *cache*), and a **backward** that turns the gradient of
# the loss with respect to the output into the gradients with respect to every input:
#
#     out, cache = f_forward(...)
#     grads = f_backward(dout, cache)
#
# This chapter writes the simplest one, the linear layer $y = x W^\top + b$, by hand, derives
# its backward, and lets `nf.gradcheck` say whether each gradient is right. The derivation in
# full is in [docs/backprop.md](../backprop.md#linear).

# %%
import numpy as np
import npformer as nf
from npformer.functional import linear_forward, linear_backward

rng = np.random.default_rng(0)
N, D_in, D_out = 4, 3, 2                  # 4 rows (a batch of tokens), 3 features in, 2 out
x = rng.standard_normal((N, D_in))
w = rng.standard_normal((D_out, D_in))    # PyTorch's layout: (out_features, in_features)
b = rng.standard_normal(D_out)

# %% [markdown]
# ## The forward
#
# Each output row is every input feature times a weight, summed, plus a bias:
# $y_{nj} = \sum_i x_{ni} W_{ji} + b_j$. In NumPy that is one product.

# %%
def my_linear_forward(x, w, b):
    out = x @ w.T + b                     # (N, D_in) @ (D_in, D_out) -> (N, D_out)
    return out, (x, w)                    # the cache: what the backward will need


y, cache = my_linear_forward(x, w, b)
y_ref, _ = linear_forward(x, w, b)
print("y =\n", y.round(4))
print("same as npformer's:", np.allclose(y, y_ref))

# %% [markdown]
# ## The backward
#
# Let $L$ be the loss and $dY = \partial L / \partial y$ (shape `(N, D_out)`, given to the
# backward as `dout`). The chain rule, one index at a time:
#
# - $x_{ni}$ reaches the loss through every $y_{nj}$, with slope $W_{ji}$:
#   $dX_{ni} = \sum_j dY_{nj} W_{ji}$, so $dX = dY\,W$.
# - $W_{ji}$ reaches it through $y_{nj}$ of every row $n$, with slope $x_{ni}$:
#   $dW_{ji} = \sum_n dY_{nj} x_{ni}$, so $dW = dY^\top X$.
# - $b_j$ is added to every row: $db_j = \sum_n dY_{nj}$.
#
# Check the shapes: each gradient has the shape of what it is the gradient of.

# %%
def my_linear_backward(dout, cache):
    x, w = cache
    dx = dout @ w                         # (N, D_out) @ (D_out, D_in) -> (N, D_in)
    dw = dout.T @ x                       # (D_out, N) @ (N, D_in) -> (D_out, D_in)
    db = dout.sum(axis=0)                 # (D_out,)
    return dx, dw, db


dout = rng.standard_normal((N, D_out))
for name, mine, ref in zip(("dx", "dw", "db"), my_linear_backward(dout, cache),
                           linear_backward(dout, linear_forward(x, w, b)[1])):
    print(f"{name}: shape {mine.shape}, same as npformer's: {np.allclose(mine, ref)}")

# %% [markdown]
# ## The gradient check
#
# Agreeing with npformer proves nothing if both are wrong. A gradient check asks the
# definition instead: nudge one input entry by $\pm h$ and see how a scalar of the output moves,
# $\frac{f(x + h) - f(x - h)}{2h}$. `nf.gradcheck` does this for every entry of every input,
# with the scalar $\sum \text{out} \cdot \text{dout}$ for a random probe `dout`, and compares
# with what the backward said. It wants `f(*inputs) -> (out, backward)` and float64 inputs.

# %%
def f(x, w, b):
    out, cache = my_linear_forward(x, w, b)
    return out, lambda dout: my_linear_backward(dout, cache)


result = nf.gradcheck(f, [x, w, b], names=["x", "w", "b"])
print(result)
assert result

# %% [markdown]
# ## What a mistake looks like
#
# A classic slip: averaging the bias gradient over the rows instead of summing it (the loss
# is already a mean; the layer must not divide again). The check names the input, the worst
# entry, and both values: here the analytic one is a quarter of the numeric one, since
# $N = 4$.

# %%
def wrong_backward(dout, cache):
    dx, dw, db = my_linear_backward(dout, cache)
    return dx, dw, db / len(dout)          # the bug


def f_wrong(x, w, b):
    out, cache = my_linear_forward(x, w, b)
    return out, lambda dout: wrong_backward(dout, cache)


wrong = nf.gradcheck(f_wrong, [x, w, b], names=["x", "w", "b"])
print(wrong)
assert not wrong

# %% [markdown]
# Next: [2. Attention step by step](02_attention_step_by_step.ipynb). To practise, `npformer
# exercises start DIR` writes the backward passes of every layer for you to fill in.
