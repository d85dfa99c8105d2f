"""The one place that decides how kernels are compiled.

``cache=True``: compiled machine code is stored next to the source (or, when that directory is
read-only, in a per-user cache; ``NUMBA_CACHE_DIR`` overrides both), so a second process loads it
instead of recompiling. Kernels compile lazily, once per dtype, on their first call.

Threads: decided in one place, ``npformer.backend.configure_runtime`` (Numba on every core, BLAS
on one thread per call; see its docstring and BENCHMARKS.md).

``FASTMATH`` lets LLVM reassociate sums and fuse multiply-adds (so reductions vectorise). It
leaves out the "no NaN / no inf" assumptions: masked attention relies on exact zeros and the
float64 kernels must agree with the reference to ~1e-12, which reassociation keeps.
"""
import numba

from npformer.backend import use_workqueue_threads

# Numba's own "workqueue" thread pool sleeps between parallel regions; the OpenMP layer spins,
# and on a 2-core machine its spinning threads take the cores from the BLAS calls that run
# between kernels. The choice lives in npformer.backend, which owns the thread policy; it is
# made here too, since a program may run a kernel before configuring anything.
use_workqueue_threads()

FASTMATH = {"nsz", "contract", "reassoc"}


def kernel(fn=None, *, parallel=False, fastmath=True):
    """``numba.njit`` with this package's defaults: cache=True, nogil, the FASTMATH subset."""
    opts = dict(cache=True, nogil=True, parallel=parallel,
                fastmath=FASTMATH if fastmath else False)
    if fn is None:
        return lambda f: numba.njit(**opts)(f)
    return numba.njit(**opts)(fn)
