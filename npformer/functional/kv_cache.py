"""The row movers of the decoding cache (``npformer.nn.kv_cache.KVCache``): beam search keeps,
repeats and reorders the rows of each layer's cached keys and values through these two.

They are data movement, not maths: no forward/backward pair. They live in the functional core
so that both backends name them, and ``KVCache`` calls the active backend's (``ops()``).
"""


def take_rows(x, index, out):
    """out[r] = x[index[r]] for every r (an index may repeat): the rows of a decoding cache
    gathered for beam search. ``out`` must not overlap ``x``. Returns out."""
    out[...] = x[index]
    return out


def move_rows(x, src, dst):
    """x[dst[i]] = x[src[i]] in place for every i: the rows of a decoding cache that beam search
    moves (no row of ``dst`` may also be in ``src``: nothing is read after it is written).
    Returns x."""
    x[dst] = x[src]
    return x
