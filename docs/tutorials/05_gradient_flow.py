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
# # 5. Gradient flow: post-norm against pre-norm
#
# The original Transformer normalises *after* each residual addition (post-norm,
# $x \leftarrow \text{LN}(x + f(x))$); most models since normalise the branch's input
# instead (pre-norm, $x \leftarrow x + f(\text{LN}(x))$). The difference is where the
# gradient flows. In pre-norm the residual path from the loss to every layer is a plain sum,
# so each layer gets a gradient of about the same size. In post-norm every layer norm on the
# way down rescales it, and at initialisation the layers near the output get far larger
# gradients than those near the input (Xiong et al., 2020, *On Layer Normalization in the
# Transformer Architecture*), which is why post-norm needs a learning-rate warm-up and
# deep post-norm stacks are hard to train.
#
# Every training run logs each layer's gradient norm (before clipping) at every logging
# interval, in `metrics.jsonl`'s "train" records (`grad_norms`). This chapter trains the toy
# translator with 6 + 6 layers both ways for 60 updates and draws them.

# %%
import json
import tempfile
from pathlib import Path

from IPython.display import Image, display
from npformer.cli.main import main
from npformer.training.toy import toy_trainer

runs = {}
for name, norm_first in (("post-norm", False), ("pre-norm", True)):
    out = Path(tempfile.mkdtemp()) / name
    trainer, _ = toy_trainer(seed=0, n_train=1000, model_kwargs=dict(
        n_encoder_layers=6, n_decoder_layers=6, norm_first=norm_first, dropout=0.0),
        train_kwargs=dict(max_steps=60, warmup_steps=10, log_every=5, eval_every=100,
                          out_dir=str(out), quiet=True))        # one validation, at the end
    summary = trainer.fit()
    runs[name] = out / "metrics.jsonl"
    print(f"{name}: {summary['step']} updates, validation loss {summary['best_loss']:.3f}")

# %% [markdown]
# ## What the log holds
#
# One "train" record, shortened: the update's whole gradient norm and each layer's, in the
# order of depth (embeddings, encoder layers, the encoder's final norm, decoder layers, ...).

# %%
first = next(json.loads(line) for line in open(runs["post-norm"], encoding="utf-8")
             if '"grad_norms"' in line)
print("step", first["step"], " grad_norm", round(first["grad_norm"], 3))
for layer, norm in first["grad_norms"].items():
    print(f"  {layer:20s} {norm:.4f}")

# %% [markdown]
# ## The picture
#
# `npformer plot --grad-norms` draws one panel per run: each layer's gradient norm against
# depth, a line per logged step (dark: early, light: late).

# %%
plots = tempfile.mkdtemp()
main(["plot", "--grad-norms", str(runs["post-norm"]), str(runs["pre-norm"]), "--out", plots])
display(Image(filename=f"{plots}/grad_norms.png"))

# %% [markdown]
# ## Reading it
#
# Compare, in each panel, the decoder's top layers with the encoder's bottom ones. The ratio
# below is the gradient norm of the last decoder layer over that of the first encoder layer,
# at the first logged step and the last.

# %%
for name, path in runs.items():
    records = [json.loads(line) for line in open(path, encoding="utf-8") if '"grad_norms"' in line]
    for rec in (records[0], records[-1]):
        g = rec["grad_norms"]
        print(f"{name:10s} step {rec['step']:3d}: decoder.layers.5 / encoder.layers.0 = "
              f"{g['decoder.layers.5'] / g['encoder.layers.0']:.2f}")

# %% [markdown]
# In the run stored here, post-norm's last decoder layer got about seven times the gradient of
# its first encoder layer at step 5, pre-norm's under twice; and after the same 60 updates the
# pre-norm model's validation loss is far below the post-norm one's (printed at the top).
#
# Try it deeper (`n_encoder_layers=12`) or without the warm-up (`warmup_steps=0`): the
# post-norm run's top layers take ever larger steps than its bottom ones, while the pre-norm
# run's stay alike. Any runs' logs can be compared so from the command line, e.g. the toy at
# 2 and at 6 layers:
#
#     npformer toy --out runs/toy2
#     npformer toy --out runs/toy6 --layers 6
#     npformer plot --grad-norms runs/toy2/metrics.jsonl runs/toy6/metrics.jsonl
#
# Next: [6. Decoding: greedy, beam and sampling](06_decoding.ipynb).
