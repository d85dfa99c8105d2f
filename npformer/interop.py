"""Exchange weights with the reference PyTorch module — without importing torch.

The reference (built in the tests when torch is installed)::

    src_embed   = nn.Embedding(V_src, d, padding_idx=pad_id)
    tgt_embed   = nn.Embedding(V_tgt, d, padding_idx=pad_id)
    transformer = nn.Transformer(d, h, n_enc, n_dec, d_ff, dropout, batch_first=True,
                                 norm_first=...)
    generator   = nn.Linear(d, V_tgt, bias=generator_bias)

Names differ in two ways only: torch's encoder and decoder live under ``transformer.``, and torch
keeps the feed-forward linears on the layer itself (``linear1``) where npformer groups them in a
``ffn`` module (``ffn.linear1``). Arrays are copied as NumPy arrays; torch tensors are accepted on
loading (anything ``np.asarray`` takes).
"""
import re

import numpy as np

_FFN = re.compile(r"\.ffn\.(linear[12])\.")


def to_torch_name(name):
    """npformer parameter name -> reference torch name."""
    if name.startswith(("encoder.", "decoder.")):
        name = "transformer." + name
    return _FFN.sub(r".\1.", name)


def from_torch_name(name):
    """reference torch name -> npformer parameter name."""
    if name.startswith("transformer."):
        name = name[len("transformer."):]
    return re.sub(r"\.layers\.(\d+)\.(linear[12])\.", r".layers.\1.ffn.\2.", name)


def _check_torch_layout(model):
    qk_dim = model.config.qk_dim
    if qk_dim is not None and qk_dim != model.config.d_model:
        raise ValueError(f"interop: qk_dim={qk_dim} differs from d_model={model.config.d_model}; "
                         f"torch.nn.Transformer has no such layout")


def to_torch_state_dict(model, grads=False):
    """{torch name: ndarray copy} of the parameters (or, with ``grads=True``, their gradients).

    With tied embeddings the shared matrix appears under both ``tgt_embed.weight`` and
    ``generator.weight`` (and ``src_embed.weight`` with ``share_all_embeddings``), as in a torch
    state dict.
    """
    _check_torch_layout(model)
    out = {}
    for name, p in model.named_parameters():
        out[to_torch_name(name)] = (p.grad if grads else p.data).copy()
    if model.config.share_all_embeddings:
        out["tgt_embed.weight"] = out["src_embed.weight"].copy()
    if model.config.tie_embeddings:
        out["generator.weight"] = out["tgt_embed.weight"].copy()
    return out


def load_torch_state_dict(model, state_dict):
    """Load a {torch name: array} mapping (the inverse of :func:`to_torch_state_dict`).

    Raises ValueError for missing, unexpected or mis-shaped entries (via ``load_state_dict``), and
    for tied models whose ``generator.weight`` differs from ``tgt_embed.weight`` (or, sharing all
    embeddings, whose ``tgt_embed.weight`` differs from ``src_embed.weight``).
    """
    _check_torch_layout(model)
    ours = {from_torch_name(k): v for k, v in state_dict.items()}
    cfg = model.config
    kept = "src_embed.weight" if cfg.share_all_embeddings else "tgt_embed.weight"
    copies = (["tgt_embed.weight"] if cfg.share_all_embeddings else []) + \
        (["generator.weight"] if cfg.tie_embeddings else [])
    for copy in copies:                      # every copy of the shared matrix must equal it
        if copy in ours:
            dup, emb = np.asarray(ours.pop(copy)), ours.get(kept)
            if emb is not None and (np.shape(dup) != np.shape(emb)
                                    or not np.array_equal(dup, np.asarray(emb))):
                raise ValueError(f"load_torch_state_dict: the model shares its embeddings, but "
                                 f"{copy} differs from {kept}")
    model.load_state_dict(ours)
    return model
