"""Token embedding (a table lookup, scaled), learned positions (GPT-2's) and the sinusoidal
positional encoding.

Derivation: docs/backprop.md#embedding.
"""
import numpy as np


def embedding_forward(ids, w, scale=1.0):
    """out[b, t] = scale * w[ids[b, t]].

    Shape: ids (B, T) int, w (V, D) -> out (B, T, D).
    """
    out = w[ids]                                     # (B, T, D), a gather (copy)
    if scale != 1.0:
        out *= scale
    return out, (ids, w.shape, scale)


def embedding_backward(dout, cache, padding_idx=None):
    """Gradient of a lookup: each row of the table receives the sum of the output gradients
    at the positions that read it, times the scale (a scatter-add). The padding row gets
    none, so the vector for ``<pad>`` never changes.

    Returns dw (V, D).
    """
    ids, w_shape, scale = cache
    dw = np.zeros(w_shape, dtype=dout.dtype)
    flat_ids = ids.reshape(-1)                       # (B*T,)
    flat_dout = dout.reshape(-1, w_shape[1])         # (B*T, D)
    np.add.at(dw, flat_ids, flat_dout)               # repeated ids accumulate, unlike dw[ids] += ...
    if scale != 1.0:
        dw *= scale
    if padding_idx is not None:
        dw[padding_idx] = 0
    return dw


def position_rows(table, start, t):
    """Rows start .. start + t - 1 of a per-position table (max_len, ...): the positions of t
    tokens, the first at ``start`` (incremental decoding passes the positions it has reached)."""
    if start < 0 or start + t > table.shape[0]:
        raise ValueError(f"positions: expected start + T <= max_len={table.shape[0]}, got start "
                         f"{start} and T {t}")
    return table[start:start + t]


def position_embedding_forward(x, w, start=0):
    """Learned positions (GPT-2's ``wpe``): out[b, t] = x[b, t] + w[start + t], the same row for
    every sequence of the batch. ``start`` is the position of x's first row (incremental
    decoding adds the positions it has reached).

    Shape: x (B, T, D), w (max_len, D) -> out (B, T, D).
    """
    t = x.shape[1]
    out = x + position_rows(w, start, t)             # (B, T, D); (T, D) broadcast over B
    return out, (start, t, w.shape)


def position_embedding_backward(dout, cache):
    """out = x + w[start + t] is a sum, so dx = dout; the table row start + t was added to every
    sequence of the batch, so it receives their sum, dw[start + t] = sum_b dout[b, t]. Rows
    outside start .. start + T - 1 were not read: zero.

    Returns dx (B, T, D), dw (max_len, D).
    """
    start, t, w_shape = cache
    dw = np.zeros(w_shape, dtype=dout.dtype)
    dw[start:start + t] = dout.sum(axis=0)           # (T, D): the batch's gradients, in order
    return dout, dw


def sinusoidal_positions(max_len, d_model, dtype=np.float64):
    """The fixed table of "Attention Is All You Need", section 3.5.

    PE[pos, 2i] = sin(pos / 10000^(2i / d_model)),  PE[pos, 2i+1] = cos(pos / 10000^(2i / d_model)).
    Computed in float64 and cast. Shape: (max_len, d_model). It has no parameters and no gradient
    of its own: the gradient flows through ``x + PE`` to x unchanged.
    """
    pos = np.arange(max_len, dtype=np.float64)[:, None]                 # (L, 1)
    inv_freq = np.exp(-np.log(10000.0) * np.arange(0, d_model, 2) / d_model)  # (ceil(D/2),)
    angles = pos * inv_freq                                             # (L, ceil(D/2))
    pe = np.zeros((max_len, d_model), dtype=np.float64)
    pe[:, 0::2] = np.sin(angles)
    pe[:, 1::2] = np.cos(angles[:, : d_model // 2])
    return pe.astype(dtype)
