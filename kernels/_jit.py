"""The one place that decides how kernels are compiled, and on how many threads parallel ones run.

``cache=True``: compiled machine code is stored next to the source (or, when that directory is
read-only, in a per-user cache; ``NUMBA_CACHE_DIR`` overrides both), so a second process loads it
instead of recompiling. Kernels compile lazily, once per dtype, on their first call.

Threads: a parallel kernel (``prange``) runs on the thread count of ``npformer.runtime``'s policy,
set around the call and put back afterwards, so the user's own Numba code keeps the user's
setting. Every parallel kernel gives each thread disjoint outputs and reduces in an order fixed
by the shape, so the count changes the speed, never the bits.

``FASTMATH`` lets LLVM reassociate sums and fuse multiply-adds (so reductions vectorise). It
leaves out the "no NaN / no inf" assumptions: masked attention relies on exact zeros and the
float64 kernels must agree with the reference to ~1e-12, which reassociation keeps.
"""
import functools

import numba

from npformer import runtime

FASTMATH = {"nsz", "contract", "reassoc"}


class ParallelKernel:
    """A parallel Numba kernel called from Python on the runtime's thread count."""

    def __init__(self, dispatcher):
        self.dispatcher = dispatcher
        functools.update_wrapper(self, dispatcher.py_func)

    def __call__(self, *args):
        n = runtime.kernel_threads()
        before = numba.get_num_threads() if n is not None else n
        if before == n:
            return self.dispatcher(*args)
        numba.set_num_threads(n)
        try:
            return self.dispatcher(*args)
        finally:
            numba.set_num_threads(before)


def kernel(fn=None, *, parallel=False, fastmath=True):
    """``numba.njit`` with this package's defaults: cache=True, nogil, the FASTMATH subset; a
    parallel kernel comes wrapped in :class:`ParallelKernel` (call it from Python only)."""
    opts = dict(cache=True, nogil=True, parallel=parallel,
                fastmath=FASTMATH if fastmath else False)

    def build(f):
        dispatcher = numba.njit(**opts)(f)
        return ParallelKernel(dispatcher) if parallel else dispatcher
    return build if fn is None else build(fn)
