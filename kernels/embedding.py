"""Embedding lookup and its gradient as a parallel scatter-add (instead of ``np.add.at``).

Same names, shapes and cache as :mod:`npformer.functional.embedding`.
"""
import numba
import numpy as np
from numba import prange

from npformer import runtime

from ._jit import kernel
from npformer.functional.embedding import sinusoidal_positions  # noqa: F401  (same names)


@kernel(parallel=True, work=3)
def _gather(ids, w, scale, out):
    """out[n] = scale * w[ids[n]]; ids (N,), w (V, D), out (N, D)."""
    for n in prange(ids.shape[0]):
        row = w[ids[n]]
        for c in range(w.shape[1]):
            out[n, c] = row[c] * scale


@kernel(parallel=True, work=1)
def _scatter_add(ids, dout, scale, padding_idx, n_threads, dw):
    """dw[ids[n]] += scale * dout[n]. Threads own disjoint column blocks, so repeated ids never
    race, and every dw[i, c] sums its tokens in token order whatever the number of blocks: the
    result's bits do not depend on the thread count."""
    n_tok, d = dout.shape
    n_blocks = max(1, min(d, n_threads))
    for blk in prange(n_blocks):
        lo, hi = blk * d // n_blocks, (blk + 1) * d // n_blocks
        for n in range(n_tok):
            i = ids[n]
            if i != padding_idx:
                for c in range(lo, hi):
                    dw[i, c] += dout[n, c] * scale


def embedding_forward(ids, w, scale=1.0):
    """out[b, t] = scale * w[ids[b, t]]. ids (B, T) int, w (V, D) -> out (B, T, D)."""
    flat = np.ascontiguousarray(ids.reshape(-1), dtype=np.int64)
    if flat.size and (flat.min() < 0 or flat.max() >= w.shape[0]):
        raise ValueError(f"ids: expected token ids in [0, {w.shape[0]}), got "
                         f"{flat.min()}..{flat.max()}")
    out = np.empty((flat.size, w.shape[1]), dtype=w.dtype)
    _gather(flat, w, w.dtype.type(scale), out)
    return out.reshape(*ids.shape, w.shape[1]), (flat, w.shape, scale)


def embedding_backward(dout, cache, padding_idx=None):
    """dw (V, D): each row gets the scaled sum of the gradients that read it; the padding row none."""
    flat, w_shape, scale = cache
    dw = np.zeros(w_shape, dtype=dout.dtype)
    dout2 = np.ascontiguousarray(dout.reshape(-1, w_shape[1]))       # (B*T, D)
    _scatter_add(flat, dout2, dout.dtype.type(scale), -1 if padding_idx is None else padding_idx,
                 runtime.kernel_threads() or numba.get_num_threads(), dw)
    return dw


def embedding_backward_into(dout, cache, grad, padding_idx=None):
    """grad += dw of :func:`embedding_backward` without the (V, D) array: only the rows the ids
    read are summed (each row's tokens in token order, as there), in a (rows read, D) array, and
    added into those rows of ``grad`` (V, D). The other rows of dw are zeros; they are left as
    they are. For GPT-2's vocabulary of 50,257 that is 154 MB a step neither zeroed nor added."""
    flat, w_shape, scale = cache
    if not isinstance(grad, np.ndarray) or grad.shape != tuple(w_shape):
        raise ValueError(f"grad: expected an array of shape {tuple(w_shape)}, got "
                         f"{getattr(grad, 'shape', type(grad).__name__)}")
    rows, slot = np.unique(flat, return_inverse=True)        # the rows read; each token's row
    pad = -1
    if padding_idx is not None:
        at = np.searchsorted(rows, padding_idx)
        pad = int(at) if at < rows.size and rows[at] == padding_idx else -1
    sums = np.zeros((rows.size, w_shape[1]), dtype=dout.dtype)
    dout2 = np.ascontiguousarray(dout.reshape(-1, w_shape[1]))       # (B*T, D)
    _scatter_add(slot.astype(np.int64, copy=False), dout2, dout.dtype.type(scale), pad,
                 runtime.kernel_threads() or numba.get_num_threads(), sums)
    grad[rows] += sums.astype(grad.dtype, copy=False)
    return grad

