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
# # 2. Attention step by step, with its heatmap
#
# Scaled dot-product attention, the heart of the Transformer:
#
# $$\text{Attention}(Q, K, V) = \text{softmax}\!\left(\frac{Q K^\top}{\sqrt{d_k}}\right) V$$
#
# Each query (a row of $Q$) scores every key, the scores become weights that sum to one, and the
# output is the weighted mean of the values. This chapter computes it one step at a time on a
# five-token sentence, draws the weights, masks the future as a decoder must, and checks the
# backward. Derivations: [docs/backprop.md](../backprop.md#attention).

# %%
import matplotlib.pyplot as plt
import numpy as np
import npformer as nf
from npformer.fonts import readable_text
from npformer.functional import (attention_backward, attention_forward, causal_mask,
                                 softmax_forward)

tokens = "我们 有 两个 红色的 苹果".split()        # "we have two red apples"
T, d_k = len(tokens), 8
rng = np.random.default_rng(1)
x = rng.standard_normal((T, d_k))                 # one vector per token
w_q, w_k, w_v = (rng.standard_normal((d_k, d_k)) / np.sqrt(d_k) for _ in range(3))
q, k, v = x @ w_q, x @ w_k, x @ w_v               # (T, d_k) each

# %% [markdown]
# ## Step 1: scores
#
# Query $i$ against key $j$ is a dot product, $q_i \cdot k_j$. Dividing by $\sqrt{d_k}$ keeps
# the scores' spread from growing with the width: the dot product of two random unit-variance
# vectors of width $d_k$ has variance $d_k$, and a softmax of large scores is nearly one-hot
# (its gradient nearly zero).

# %%
scores = q @ k.T / np.sqrt(d_k)                   # (T, T)
print("scores' std with the scale:", scores.std().round(2),
      " without:", (q @ k.T).std().round(2))

# %% [markdown]
# ## Step 2: weights
#
# A softmax over each row turns scores into weights: positive, summing to one. Subtracting
# the row's maximum first changes nothing mathematically and keeps `exp` from overflowing.

# %%
weights = np.exp(scores - scores.max(axis=1, keepdims=True))
weights /= weights.sum(axis=1, keepdims=True)
print("each row sums to", weights.sum(axis=1).round(6))


def heatmap(w, title):
    with readable_text(tokens):                   # a font with the Chinese glyphs
        fig, ax = plt.subplots(figsize=(4, 3.4))
        ax.imshow(w, vmin=0, vmax=1, cmap="viridis")
        ax.set_xticks(range(T), tokens, rotation=45)
        ax.set_yticks(range(T), tokens)
        ax.set_xlabel("key (attended to)")
        ax.set_ylabel("query")
        ax.set_title(title, fontsize=9)
        fig.tight_layout()
        plt.show()


heatmap(weights, "self-attention weights (random projections)")

# %% [markdown]
# ## Step 3: the output
#
# Each token's output is its row of weights times the values: a mixture of every token's
# value, mostly of those it attends to.

# %%
out = weights @ v                                 # (T, d_k)
ref, cache = attention_forward(q[None, None], k[None, None], v[None, None])
print("same as npformer's attention_forward:", np.allclose(out, ref[0, 0]))

# %% [markdown]
# ## A decoder may not look ahead
#
# When a decoder predicts token $i + 1$ it has seen only tokens $0..i$: the keys after the
# query are masked. npformer sets masked scores to $-\infty$ (never a "large negative"
# number, which would leak probability), so their weights are exactly zero.

# %%
mask = causal_mask(T)[0, 0]                       # (T, T), True where the query may look
masked, _ = softmax_forward(scores, mask)
print("weights above the diagonal:", masked[~mask].max())
heatmap(masked, "causal self-attention: the future masked")

# %% [markdown]
# ## The backward, checked
#
# Attention's backward runs the three steps in reverse: through the product with $V$, the
# softmax ($ds_i = p_i (dp_i - \sum_j dp_j p_j)$), and the scaled product $QK^\top$. The
# gradient check of chapter 1 confirms npformer's, masked or not.

# %%
def f(q, k, v):
    out, cache = attention_forward(q, k, v, mask=causal_mask(T))
    return out, lambda dout: attention_backward(dout, cache)


result = nf.gradcheck(f, [q[None, None].copy(), k[None, None].copy(), v[None, None].copy()],
                      names=["q", "k", "v"])
print(result)
assert result

# %% [markdown]
# Next: [3. The toy translator and its cross-attention](03_toy_translator.ipynb).
