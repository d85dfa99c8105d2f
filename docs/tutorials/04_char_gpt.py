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
# # 4. A character GPT on tiny Shakespeare, for 45 seconds
#
# A GPT is the decoder alone: it reads characters and predicts the next one. `npformer lm`
# trains one on any text file (nanoGPT's first run); here the same recipe trains for 45 s on
# two cores, and a sample after each validation shows it learn: first random characters, then
# spaces and line breaks, then words and speaker names.
#
# The text is tiny Shakespeare (1.1 MB), found as `npformer lm --data tinyshakespeare` finds it:
# the file `npformer download tinyshakespeare` keeps in the data folder (`$NPFORMER_DATA`, else
# `~/.cache/npformer/multi30k`). Where it is not there yet, this cell fetches it, checking its
# sha256; where that fails too (no network), the chapter stops with a one-line message.

# %%
import tempfile
from pathlib import Path

from npformer.data.download import download, text_file
from npformer.training.language_model import LM_MODEL, LM_TRAIN, lm_trainer

try:
    path, _ = text_file("tinyshakespeare")
except ValueError:                                  # not downloaded yet: fetch it
    try:
        path = download("tinyshakespeare", progress=False)[0]
    except (OSError, ValueError) as error:          # no network, or wrong bytes (a proxy page)
        raise SystemExit(f"tiny Shakespeare is not downloaded and could not be fetched ({error}); "
                         f"run `npformer download tinyshakespeare`, then this chapter") from None
text = path.read_text(encoding="utf-8")
print(f"{len(text):,} characters, {len(set(text))} distinct; it begins:\n")
print(text[:200])

# %% [markdown]
# ## The model and the recipe
#
# 4 blocks of width 192 with 6 heads and rotary positions (Llama's block: RMSNorm and a SwiGLU
# feed-forward), a context of 128 characters; AdamW
# with a cosine schedule. To fit a minute, this run keeps the first 200,000 characters (the
# last tenth of them validates), warms up in 20 updates instead of 100 and validates every 25
# updates, where the full recipe validates every 300. The first update also compiles the
# Numba kernels it has not met yet (they are cached on disk for the next time).

# %%
print("model:", LM_MODEL)
print("training:", LM_TRAIN)
run = tempfile.mkdtemp(prefix="shakespeare_")
part = Path(run) / "part.txt"
part.write_text(text[:200_000], encoding="utf-8")
trainer, data = lm_trainer(part, train_kwargs=dict(time_budget=45, warmup_steps=20,
                                                   eval_every_steps=25, out_dir=run, quiet=True),
                           sample_tokens=120)
print(f"{trainer.model.num_parameters():,} parameters")

# %% [markdown]
# ## Train, watching the samples
#
# After each validation the model continues the validation text's first character for 120
# characters (temperature 0.8). The validation loss is in nats per character: $\ln 65 \approx
# 4.2$ is a uniform guess over the characters.

# %%
def on_eval(record):
    print(f"step {record['step']:4d}  {record['seconds']:5.1f} s  "
          f"validation loss {record['val_loss']:.3f}")
    print("    " + trainer.task.examples()[0].replace("\n", "\n    ") + "\n")


summary = trainer.fit(on_eval=on_eval)
print("stopped by", summary["stop_reason"], "after", summary["step"], "updates")

# %% [markdown]
# ## Longer runs
#
# The full recipe, `npformer lm --data tinyshakespeare --out runs/shakespeare`, trains this
# model for 15 minutes: on a slow two-core VM it reached a validation loss of 1.55 (1,371
# updates; GPT-2's block, `--arch gpt`, reached 1.59 there), and on a machine fast enough for
# all 2,200 updates the GPT block reached 1.50. A sample of the 15-minute run, recorded in
# BENCHMARKS.md (not re-run here; `npformer sample --checkpoint RUN/best --prompt "ROMEO:"
# --max-new-tokens 300 --temperature 0.8 --seed 0`):
#
# ```text
# ROMEO:
# Ha, who, talk for maid, husband the traitor.
#
# LADY CAPULET:
# Fellows bites merry, my lord. Yet, Williament, I saw
# ```
#
# Next: [5. Gradient flow: post-norm against pre-norm](05_gradient_flow.ipynb).
