"""The one place that decides how kernels are compiled, and on how many threads parallel ones run.

``cache=True``: compiled machine code is stored next to the source (or, when that directory is
read-only, in a per-user cache; ``NUMBA_CACHE_DIR`` overrides both), so a second process loads it
instead of recompiling. Kernels compile lazily, once per dtype, on their first call.

Threads: a parallel kernel (``prange``) runs on the thread count of ``npformer.runtime``'s policy,
set around the call and put back afterwards, so the user's own Numba code keeps the user's
setting. Every parallel kernel gives each thread disjoint outputs and reduces in an order fixed
by the shape, so the count changes the speed, never the bits.

Small work runs serially: starting a parallel region (waking the ``workqueue`` layer's
sleeping threads and waiting for the last) costs 100-200 microseconds, about what one core
spends on ``SERIAL_BELOW`` elements of a row-wise kernel (LayerNorm, an activation, a row
copy), so below that size no number of cores can make the region pay. There (a decoding step
of a few hundred rows, a small model's) the same code compiled without ``parallel`` runs on
the calling thread. The choice depends on the shape alone (never on the cores), so a given
call takes the same twin in every run on every machine, and its bits are as reproducible as
before. The twins run the same loop body over the same rows, but LLVM may vectorise a row's
sums differently in each, so they agree to rounding, not always to the bit
(tests/test_kernels_serial.py).

``FASTMATH`` lets LLVM reassociate sums and fuse multiply-adds (so reductions vectorise). It
leaves out the "no NaN / no inf" assumptions: masked attention relies on exact zeros and the
float64 kernels must agree with the reference to ~1e-12, which reassociation keeps.

The kernels use NumPy's error model: a division by zero gives inf or NaN, as in NumPy, instead
of Python's ZeroDivisionError. Python's model puts a test and a branch to raise before every
division, and LLVM vectorises no loop with such a branch in it: a sigmoid's 1 / (1 + e) kept
GELU's and SwiGLU's loops scalar. A loop that vectorises still computes each element by the
same operations, so the bits of the element-wise kernels are unchanged. A second thing keeps a
loop scalar: a libm call (``math.erf``, ``math.tanh``) anywhere in the same function, or a
per-element select on a mask ahead of the arithmetic; kernels/activation_dropout.py shows both
kept apart.
"""
import functools
import types

import numba

from npformer import runtime

FASTMATH = {"nsz", "contract", "reassoc"}
SERIAL_BELOW = 1 << 17           # elements of the work argument below which a kernel runs serially


class ParallelKernel:
    """A parallel Numba kernel called from Python on the runtime's thread count, or, for work
    of fewer than ``SERIAL_BELOW`` elements, its serial twin. ``work``: an argument's index (its
    size is the work) or a function of the arguments giving it in elements' worth."""

    def __init__(self, dispatcher, serial, work):
        self.dispatcher, self.serial = dispatcher, serial
        self.work = (lambda *args: args[work].size) if isinstance(work, int) else work
        functools.update_wrapper(self, dispatcher.py_func)

    def __call__(self, *args):
        if self.work(*args) < SERIAL_BELOW:
            return self.serial(*args)
        n = runtime.kernel_threads()
        before = numba.get_num_threads() if n is not None else n
        if before == n:
            return self.dispatcher(*args)
        numba.set_num_threads(n)
        try:
            return self.dispatcher(*args)
        finally:
            numba.set_num_threads(before)


def _renamed(f, suffix):
    """A copy of function ``f`` under another name, so that its cached machine code (files
    named after the function) never meets the original's."""
    g = types.FunctionType(f.__code__, f.__globals__, f.__name__ + suffix, f.__defaults__,
                           f.__closure__)
    g.__qualname__ = f.__qualname__ + suffix
    g.__module__ = f.__module__
    return g


def kernel(fn=None, *, parallel=False, fastmath=True, work=0):
    """``numba.njit`` with this package's defaults: cache=True, nogil, the FASTMATH subset; a
    parallel kernel comes wrapped in :class:`ParallelKernel` (call it from Python only) with its
    serial twin, chosen by ``work`` (an argument's index, or a function of the arguments)."""
    opts = dict(cache=True, nogil=True, fastmath=FASTMATH if fastmath else False,
                error_model="numpy")

    def build(f):
        if not parallel:
            return numba.njit(**opts)(f)
        return ParallelKernel(numba.njit(parallel=True, **opts)(f),
                              numba.njit(**opts)(_renamed(f, "_serial")), work)
    return build if fn is None else build(fn)
