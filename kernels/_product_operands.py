"""The one check of a matrix product's operands, shared by the dispatcher (``matmul``) and the
blocked kernel's public wrapper (``blocked_matmul``), which adds only its own conditions."""
import numpy as np

FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))   # (faster to compare than the types)


def check_operands(a, b, out, who):
    """Raise ValueError, naming ``who`` and the argument, unless a (..., M, K) @ b (..., K, N)
    is defined (same batch shape, both float32 or both float64) and ``out`` (if given) is a
    writeable array of the result's shape and dtype."""
    if a.ndim < 2 or a.ndim != b.ndim or a.shape[:-2] != b.shape[:-2] or a.shape[-1] != b.shape[-2]:
        raise ValueError(f"{who}: expected a (..., M, K) and b (..., K, N) with the same batch "
                         f"shape, got {a.shape} and {b.shape}")
    if a.dtype != b.dtype or a.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{who}: expected a and b both float32 or both float64, got {a.dtype} "
                         f"and {b.dtype}")
    expected = a.shape[:-1] + (b.shape[-1],)
    if out is not None and (out.shape != expected or out.dtype != a.dtype or not out.flags.writeable):
        raise ValueError(f"{who}: out: expected a writeable {a.dtype} array of shape {expected}, "
                         f"got {out.dtype} {out.shape}, writeable={out.flags.writeable}")
