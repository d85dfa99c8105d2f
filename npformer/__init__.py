"""npformer: the Transformer in NumPy (the encoder-decoder of "Attention Is All You Need" and the
decoder-only GPT) with hand-derived backward passes.

    import numpy as np, npformer as nf
    model = nf.Transformer(src_vocab_size=100, tgt_vocab_size=100, d_model=64, n_heads=4, d_ff=128,
                           n_encoder_layers=2, n_decoder_layers=2)
    logits = model.forward(src, tgt_in)                          # (B, T, V)
    loss, dlogits = nf.cross_entropy(logits, tgt_out, ignore_index=0, label_smoothing=0.1)
    model.zero_grad(); model.backward(dlogits)
    opt = nf.Adam(model, lr=1e-3); opt.step()

    gpt = nf.GPT(vocab_size=65, d_model=128, n_heads=4, d_ff=512, n_layers=4, max_len=256)
    logits = gpt.forward(ids)                                    # (B, T, V), causal
    gpt2 = nf.GPT.from_pretrained("path/to/gpt2")                # Hugging Face folder (extra hf)
    llm = nf.from_pretrained("path/to/SmolLM2-135M")             # any npformer.families one
    nf.lora.apply(llm, rank=8, alpha=16, target_modules=["q_proj", "v_proj"])   # LoRA
"""
from . import functional, interop, lora, nn, optim
from .backend import get_backend, set_backend
from .configs import GPTConfig, TransformerConfig
from .gradcheck import GradcheckResult, gradcheck
from .hf import from_pretrained
from .loss import cross_entropy
from .nn import GPT, Transformer
from .optim import (Adam, AdamW, NoamSchedule, WarmupCosineSchedule, WarmupInverseSqrtSchedule,
                    WarmupLinearSchedule, clip_grad_norm)
from .registry import build_model
from .runtime import configure_runtime, set_deterministic

from .version import VERSION as __version__

__all__ = [
    "Adam", "AdamW", "GPT", "GPTConfig", "GradcheckResult", "NoamSchedule", "Transformer", "TransformerConfig",
    "WarmupCosineSchedule", "WarmupInverseSqrtSchedule", "WarmupLinearSchedule", "build_model",
    "clip_grad_norm",
    "configure_runtime", "cross_entropy", "from_pretrained", "functional", "get_backend",
    "gradcheck", "interop", "lora",
    "nn", "optim", "set_backend", "set_deterministic",
]
