"""Boolean attention masks. Convention throughout npformer: True means "may attend".

Masks are built small and broadcast: (B, 1, 1, S) for key padding, (1, 1, T, T) for causality,
so that ``scores`` of shape (B, H, T_q, T_k) can be masked without copying a mask per head.
"""
import numpy as np


def padding_mask(ids, pad_id):
    """Keys that are real tokens. ids (B, S) -> (B, 1, 1, S) bool."""
    return (ids != pad_id)[:, None, None, :]


def causal_mask(t, start=0, window=None):
    """Query i may see keys 0..i. -> (1, 1, T, T) bool, lower triangular. With ``start``: T new
    queries at positions start .. start + T - 1 over start + T keys (the cached ones first), so
    query i sees keys 0 .. start + i -> (1, 1, T, start + T).

    ``window`` (sliding-window attention, Mistral's ``sliding_window``): the query at position p
    sees only the last ``window`` keys, itself included: keys k with p - k < window, as
    transformers' ``sliding_window_overlay`` (kv_idx > q_idx - window). None: every earlier key.
    """
    keep = np.ones((t, start + t), dtype=bool)
    mask = np.tril(keep, k=start)
    if window is not None:
        mask &= np.triu(keep, k=start - window + 1)               # p - k <= window - 1
    return mask[None, None]


def decoder_self_mask(tgt_ids, pad_id):
    """Causal AND key not padding. tgt_ids (B, T) -> (B, 1, T, T) bool."""
    return causal_mask(tgt_ids.shape[1]) & padding_mask(tgt_ids, pad_id)
