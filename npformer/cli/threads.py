"""Limit the threads of NumPy's BLAS (OpenBLAS) at run time.

The matrices of a small Transformer are tiny (e.g. 128 x 64 @ 64 x 192). Splitting each product
over several BLAS threads costs more in hand-offs than it saves, and when other programs use
the cores too the threads wait for each other: we measured a training step 6x and greedy
decoding 10x slower with OpenBLAS's default of one thread per core than with one thread, on a
busy 2-core machine. So the CLI runs BLAS single-threaded unless told otherwise
(``npformer --blas-threads N``, or ``OPENBLAS_NUM_THREADS`` set by the user).

The environment variable only works before NumPy is loaded; this sets the count afterwards,
through OpenBLAS's own ``openblas_set_num_threads`` (NumPy's wheels ship it as
``scipy_openblas_set_num_threads64_``).
"""
from .. import backend


def set_blas_threads(n):
    """Use ``n`` BLAS threads from now on. Returns True if an OpenBLAS was found and set.

    The policy and the setter live in :mod:`npformer.backend` (``configure_runtime``)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"--blas-threads: expected a positive integer, got {n!r}")
    return backend.set_blas_threads(n)
