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
# # 6. Decoding: greedy, beam and sampling, with the trace
#
# A trained decoder gives, at each step, a probability for every next token. *Decoding* is
# how we choose: the most likely token each time (greedy), the most likely whole sentences
# among a few kept at once (beam search), or a random draw (sampling). This chapter trains the
# toy translator quickly, writes greedy decoding by hand, and compares the three with
# npformer's `--trace`, which prints the probability of every chosen token.

# %%
import numpy as np
from npformer.decoding.translator import format_trace
from npformer.training.toy import run_toy

result = run_toy(seed=0, quiet=True, n_examples=0, train_kwargs=dict(epochs=8))
model, vocabs = result.trainer.model, result.data.vocabs
translator = result.trainer.task.translator(model)
print(f"held-out exact match {result.heldout_exact_match:.3f}")

# %% [markdown]
# ## Greedy decoding, by hand
#
# Start the target with `<bos>`; run the model on the source and the target so far; take the
# last position's logits, turn them into probabilities, append the most likely token; stop at
# `<eos>`. `<pad>` and `<bos>` are never output, so they get no probability: their logits
# are set to $-\infty$ before the softmax. (npformer's own search also keeps each layer's keys
# and values in a cache, so that a step costs one position, not the whole prefix; the result
# is the same.)

# %%
sentence = "他 买 一本 旧 书"
src = np.array([vocabs.src.encode(sentence.split())])
model.eval()
out = [vocabs.tgt.bos_id]
while len(out) < model.config.max_len:
    logits = model.forward(src, np.array([out]))[0, -1].astype(np.float64)   # (V,) scores
    logits[[vocabs.tgt.pad_id, vocabs.tgt.bos_id]] = -np.inf
    p = np.exp(logits - logits.max())
    p /= p.sum()
    best = int(np.argmax(p))
    print(f"  {vocabs.tgt.id_to_token(best):10s} p={p[best]:.4f}")
    if best == vocabs.tgt.eos_id:
        break
    out.append(best)
print("=>", " ".join(vocabs.tgt.decode(out)))

# %% [markdown]
# `translate(..., method="greedy")` gives the same tokens and probabilities; `format_trace`
# prints them as `npformer translate --trace` does:

# %%
greedy = translator.translate([sentence], method="greedy")[0]
print(format_trace(greedy))

# %% [markdown]
# ## Beam search
#
# Greedy commits to each token for good. Beam search keeps the `beam_size` most likely
# prefixes at every step (by the sum of their log-probabilities, divided by a length penalty
# so that short outputs are not favoured) and returns the best finished one. On a model this
# sure of itself, it mostly agrees with greedy; it matters where two continuations are close.
# In the run stored here, trained for 8 epochs instead of 14, the model still hesitates
# between *a* and *an* before *old*: the trace above shows the probability it gave the
# article it chose.

# %%
for sentence in ("他 买 一本 旧 书", "我们 有 两个 红色的 苹果", "小明 不 喜欢 猫"):
    g = translator.translate([sentence], method="greedy")[0].text
    b = translator.translate([sentence], method="beam", beam_size=4)[0].text
    print(f"{sentence:16s} greedy: {g:28s} beam 4: {b}")

# %% [markdown]
# ## Sampling
#
# Sampling draws each token from the distribution instead: `temperature` sharpens it (< 1) or
# flattens it (> 1), and `top_k` keeps only the k most likely tokens. At a high temperature the
# trace shows the model taking tokens it gives little probability to.

# %%
rng = np.random.default_rng(0)
for temperature in (0.5, 1.0, 2.0):
    t = translator.translate(["他 买 一本 旧 书"], method="sample", temperature=temperature,
                             rng=rng)[0]
    print(f"temperature {temperature}:")
    print(format_trace(t), "\n")

# %% [markdown]
# From the command line:
#
#     npformer translate --checkpoint runs/toy --trace "他 买 一本 旧 书"
#     npformer translate --checkpoint runs/toy --beam 4 "他 买 一本 旧 书"
#     npformer translate --checkpoint runs/toy --sample --temperature 2 --seed 0 "他 买 一本 旧 书"
#
# Back to [the tutorials' index](index.md).
