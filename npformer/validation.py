"""Input checks shared by the model and the tools. Each raises ValueError naming the argument,
what was expected and what came: never a silent broadcast or a wrapped-around index."""
import numpy as np


def check_token_ids(name, ids, vocab_size, max_len=None):
    """A (B, T) integer array with values in [0, vocab_size) and T <= max_len. Returns it as int64."""
    ids = np.asarray(ids)
    if ids.ndim != 2:
        raise ValueError(f"{name}: expected a 2-D integer array (batch, length), got shape {ids.shape}")
    if not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"{name}: expected an integer dtype, got {ids.dtype}")
    if ids.shape[0] == 0 or ids.shape[1] == 0:
        raise ValueError(f"{name}: expected a non-empty batch and length, got shape {ids.shape}")
    if max_len is not None and ids.shape[1] > max_len:
        raise ValueError(f"{name}: sequence length {ids.shape[1]} exceeds max_len={max_len}")
    lo, hi = ids.min(), ids.max()
    if lo < 0 or hi >= vocab_size:
        bad = lo if lo < 0 else hi
        raise ValueError(f"{name}: token ids must lie in [0, {vocab_size}), found {bad}")
    return ids.astype(np.int64, copy=False)


def check_same_batch(name_a, a, name_b, b):
    if a.shape[0] != b.shape[0]:
        raise ValueError(f"{name_a} and {name_b}: expected the same batch size, "
                         f"got {a.shape[0]} and {b.shape[0]}")


def check_array(name, x, shape, dtype=None):
    """``shape`` may contain None for "any size". Checks ndim, sizes and (optionally) dtype."""
    x = np.asarray(x)
    if x.ndim != len(shape) or any(s is not None and s != xs for s, xs in zip(shape, x.shape)):
        want = "(" + ", ".join("*" if s is None else str(s) for s in shape) + ")"
        raise ValueError(f"{name}: expected shape {want}, got {x.shape}")
    if dtype is not None and x.dtype != dtype:
        raise ValueError(f"{name}: expected dtype {np.dtype(dtype)}, got {x.dtype}")
    return x
