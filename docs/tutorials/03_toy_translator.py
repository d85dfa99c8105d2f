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
# # 3. Training the toy translator, and reading its cross-attention
#
# `npformer toy` trains a small encoder–decoder Transformer (2 + 2 layers, d_model 64) on a
# built-in Chinese→English grammar: `我 有 一个 苹果` → `i have an apple`, with agreement,
# plurals and a/an. This chapter runs the same recipe from Python, watches the validation
# loss fall, translates sentences it never saw, and draws where each English word looked in
# the Chinese sentence: the decoder's **cross-attention**.

# %%
import tempfile

import matplotlib.pyplot as plt
import numpy as np
from npformer.cli.plot import attention_maps
from npformer.fonts import readable_text
from npformer.training.metrics_log import read_metrics_log
from npformer.training.toy import TOY_MODEL, TOY_TRAIN, run_toy

print("model:", TOY_MODEL)
print("training:", TOY_TRAIN)

# %% [markdown]
# ## Train
#
# The recipe's 14 epochs of 47 updates take about 20 s on two cores. Every epoch ends with a
# validation on pairs never trained on; `best` keeps the weights of the lowest validation loss.

# %%
run = tempfile.mkdtemp(prefix="toy_")


def on_eval(record):
    print(f"epoch {record['epoch']:2d}  step {record['step']:4d}  "
          f"validation loss {record['loss']:.3f}  exact match {record['exact_match']:.3f}")


result = run_toy(seed=0, out_dir=run, quiet=True, on_eval=on_eval)
print(f"trained {result.train_seconds:.0f} s; exact match: training pairs "
      f"{result.train_exact_match:.3f}, held-out pairs {result.heldout_exact_match:.3f}")

# %% [markdown]
# The metrics log (`metrics.jsonl`) holds one record per logging interval and per validation;
# `npformer plot --metrics` draws it. Here, the training loss by step:

# %%
records = read_metrics_log(f"{run}/metrics.jsonl")
train = [(r["step"], r["loss"]) for r in records if r["event"] == "train"]
fig, ax = plt.subplots(figsize=(5, 3))
ax.plot(*zip(*train))
ax.set_xlabel("step")
ax.set_ylabel("training loss (label-smoothed)")
ax.set_yscale("log")
fig.tight_layout()
plt.show()

# %% [markdown]
# ## Translate
#
# The held-out pairs are word combinations never seen in training: a model that learnt the
# grammar, not the sentences, gets them right.

# %%
model, vocabs = result.trainer.model, result.data.vocabs
translator = result.trainer.task.translator(model)
for zh, en, hyp in result.examples:
    print(f"{zh}  ->  {hyp}   ({'right' if hyp == en else 'reference: ' + en})")

# %% [markdown]
# ## Where did each word look?
#
# Re-running the model on the source and its own translation leaves every attention layer's
# weights in `attn_weights`. In the last decoder layer's cross-attention, row $t$ is the
# English token being predicted after position $t$ and each column a Chinese word: a good
# translator attends to the word it is translating (`两个` for *two*, `苹果` for *apples*).

# %%
sentence = "我们 有 两个 红色的 苹果"
maps, src_tokens, tgt_tokens, text = attention_maps(model, vocabs, sentence)
print(sentence, "->", text)
last = max(k for k in maps if k.endswith("cross_attn"))
weights = maps[last]                             # (heads, target, source)
with readable_text(src_tokens + tgt_tokens):
    fig, axes = plt.subplots(1, len(weights), figsize=(2.8 * len(weights) + 1, 3.2))
    for h, ax in enumerate(axes):
        ax.imshow(weights[h], vmin=0, vmax=1, cmap="viridis")
        ax.set_xticks(range(len(src_tokens)), src_tokens, rotation=90)
        ax.set_yticks(range(len(tgt_tokens)), tgt_tokens if h == 0 else [""] * len(tgt_tokens))
        ax.set_title(f"{last}, head {h}", fontsize=8)
    fig.tight_layout()
    plt.show()
mean = weights.mean(axis=0)
for t, tok in enumerate(tgt_tokens[1:] + ["<eos>"]):
    print(f"predicting {tok!r:12} looks most at {src_tokens[int(np.argmax(mean[t]))]}")

# %% [markdown]
# The same pictures, for every layer and head, from the command line:
#
#     npformer toy --out runs/toy
#     npformer plot --checkpoint runs/toy/best --sentence "我们 有 两个 红色的 苹果"
#
# Next: [4. A character GPT on tiny Shakespeare](04_char_gpt.ipynb).
