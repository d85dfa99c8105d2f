"""Matrix products with a measured choice per shape: BLAS through NumPy, or a small Numba kernel.

``matmul(a, b, out=None)`` computes ``a @ b`` for 2-D or equally-batched 3-D/4-D operands. The
first time a *shape signature* appears (shapes, dtype, which operands are transposed views,
whether ``out`` is a strided view), every candidate runs a few times and the fastest is kept in
memory for that signature; later calls go straight to it. Candidates:

- ``"blas"``: ``np.matmul`` as given (NumPy hands each matrix to OpenBLAS);
- ``"blas-contiguous"``: ``np.matmul`` after copying strided operands to contiguous ones (NumPy
  takes a slower path for some transposed batched views);
- ``"numba"``: :func:`_gemm_rows` / :func:`_gemm_rows_nt`, row-parallel Numba kernels with no
  per-call BLAS overhead (and none of BLAS's thread hand-offs);
- ``"numba-blocked"``: :func:`npformer.kernels.blocked_matmul.blocked_matmul`, a serial,
  register-blocked Numba kernel in explicit 16-lane vectors (offered where N >= 32; a ``b``
  whose rows are strided, such as ``w.T`` or ``k^T``, is first copied into cache-line aligned
  rows, and so is a 2-D ``b`` whose rows are merely misaligned). It wins on attention's many
  small products, where BLAS's per-matrix cost dominates, and wherever OpenBLAS runs narrower
  vector kernels than the CPU has (on these machines the environment pins OpenBLAS to its AVX2
  "Haswell" kernels while the CPU has AVX-512: BENCHMARKS.md);
- ``"blas-split"`` / ``"numba-blocked-split"`` (large 2-D products only): the rows split in two
  halves, one computed by a helper Python thread, each half by single-threaded BLAS or the
  blocked kernel. This is how npformer uses two cores for the big GEMMs (see
  ``npformer.backend``): a waiting Python thread blocks, where OpenBLAS's own threads spin and,
  on a busy machine, fall back to 4 ms scheduler ticks.

Products of more than ``MEASURE_LIMIT`` multiply-adds per matrix skip the row-parallel
``"numba"`` kernel (no cache blocking: a trial on the (1920 x 256) @ (256 x 5893) generator
product would cost ~0.1 s) and try BLAS and the blocked kernel, 2-D ones each on one and on two
threads.
Their signature rounds the sizes up to multiples of 256 (one trial per bucket, not per batch
length).
``timings()`` returns every measurement (the benchmark prints them).
"""
import time

import numpy as np
from numba import prange

from npformer.aligned import empty_aligned, rows_aligned

from . import _helper_thread
from ._jit import kernel
from ._product_operands import check_operands
from .blocked_matmul import BLOCK_COLS, run_blocked
from .transpose import copy_rows

MEASURE_LIMIT = 1 << 22          # multiply-adds per matrix (M * K * N); see the module docstring
_BUCKET = 256                    # large products: one decision per size bucket
TRIAL_LIMIT = 1 << 28            # multiply-adds of a whole batched product worth a trial
TRIALS = 3                       # timed calls per candidate (the fastest counts)

_choice = {}                     # signature -> name of the fastest candidate
_timings = {}                    # signature -> {candidate: seconds}


@kernel(parallel=True)
def _gemm_rows(a, b, out):
    """out[g] = a[g] @ b[g]; a (G, M, K), b (G, K, N), out (G, M, N), all C-contiguous.

    One prange task per output row (G*M of them); loops start at 0 and the innermost runs over
    contiguous N, so LLVM vectorises it."""
    n_g, m, kk = a.shape
    n = b.shape[2]
    zero = a[0, 0, 0] - a[0, 0, 0]
    for r in prange(n_g * m):
        g, i = r // m, r % m                 # (indices, not row views: a view per row would
        for j in range(n):                   #  update a shared reference count from all threads)
            out[g, i, j] = zero
        for k in range(kk):
            aik = a[g, i, k]
            for j in range(n):
                out[g, i, j] += aik * b[g, k, j]


@kernel(parallel=True)
def _gemm_rows_nt(a, bt, out):
    """out[g] = a[g] @ bt[g].T; a (G, M, K), bt (G, N, K), out (G, M, N), all C-contiguous.

    For b given as a transposed view (``x @ w.T`` of a linear layer): each output entry is a dot
    product of two contiguous length-K rows (vectorised over K)."""
    n_g, m, kk = a.shape
    n = bt.shape[1]
    for r in prange(n_g * m):
        g, i = r // m, r % m
        for j in range(n):
            acc = a[g, i, 0] - a[g, i, 0]
            for k in range(kk):
                acc += a[g, i, k] * bt[g, j, k]
            out[g, i, j] = acc


def _as_batched(x):
    """(..., M, K) -> (G, M, K) (a view when possible)."""
    return x.reshape((-1,) + x.shape[-2:])


def _blas(a, b, out):
    return np.matmul(a, b, out=out)


def _blas_contiguous(a, b, out):
    return np.matmul(np.ascontiguousarray(a), np.ascontiguousarray(b), out=out)


def _split_rows(product, a, b, out):
    """product(a, b, out) with the rows of a 2-D product split between this thread and one
    helper thread (a thread that waits blocks; it does not spin). Other shapes: product as is."""
    if a.ndim != 2 or a.shape[0] < 2:
        return product(a, b, out)
    if out is None:
        out = empty_aligned((a.shape[0], b.shape[1]), a.dtype)
    h = a.shape[0] // 2
    job = _helper_thread.submit(product, a[h:], b, out[h:])
    product(a[:h], b, out[:h])
    job.result()
    return out


def _blas_split(a, b, out):
    """Single-threaded BLAS on both cores, each on half the rows."""
    return _split_rows(_blas, a, b, out)


def _numba(a, b, out):
    a3 = np.ascontiguousarray(_as_batched(a))
    direct = out is not None and out.flags.c_contiguous                 # else a copy at the end
    res = out if direct else np.empty(a.shape[:-1] + (b.shape[-1],), dtype=a.dtype)
    if _layout(b) == "T" and b.swapaxes(-1, -2).flags.c_contiguous:     # b = w.T: no copy
        _gemm_rows_nt(a3, _as_batched(b.swapaxes(-1, -2)), _as_batched(res))
    else:
        _gemm_rows(a3, np.ascontiguousarray(_as_batched(b)), _as_batched(res))
    if out is None or direct:
        return res
    out[...] = res
    return out


def _blocked_offered(a, b):
    """Whether the blocked kernel can take a @ b (copying b or going through a temporary out
    where needed): float operands, at most two batch axes, M, K >= 1, N >= 32."""
    return (a.dtype == b.dtype and a.dtype in (np.float32, np.float64) and a.ndim <= 4
            and b.shape[-1] >= BLOCK_COLS and a.shape[-2] >= 1 and a.shape[-1] >= 1)


def _aligned_rows(b):
    """b itself if its rows have unit stride and start cache lines, or if it is a batch of
    small matrices with unit-stride rows (attention's heads: a copy per call costs more than the
    misalignment); else a copy whose rows do (vector loads that straddle two lines measured 35%
    slower on a linear layer's product; ``w.T`` is copied here)."""
    unit = b.shape[-1] == 1 or b.strides[-1] == b.itemsize
    if unit and (b.ndim > 2 or rows_aligned(b)):
        return b
    copy = empty_aligned(b.shape, b.dtype, aligned_rows=True)
    copy_rows(b, copy)
    return copy


def _numba_blocked(a, b, out):
    """The register-blocked kernel, on operands as :func:`matmul` checked them (an ``out``
    overlapping neither a nor b); a b whose rows are strided (``w.T`` of a linear layer) or do
    not start cache lines is copied first, and an ``out`` with strided rows receives a copy."""
    if not _blocked_offered(a, b):
        return _blas(a, b, out)
    b = _aligned_rows(b)
    if out is None:
        return run_blocked(a, b, empty_aligned(a.shape[:-1] + (b.shape[-1],), a.dtype))
    if out.shape[-1] > 1 and out.strides[-1] != out.itemsize:
        out[...] = run_blocked(a, b, empty_aligned(out.shape, a.dtype))
        return out
    return run_blocked(a, b, out)


def _numba_blocked_split(a, b, out):
    """The blocked kernel on both cores, each on half the rows (b copied once, if at all)."""
    if _blocked_offered(a, b):
        b = _aligned_rows(b)
    return _split_rows(_numba_blocked, a, b, out)


CANDIDATES = {"blas": _blas, "blas-contiguous": _blas_contiguous, "numba": _numba,
              "blas-split": _blas_split, "numba-blocked": _numba_blocked,
              "numba-blocked-split": _numba_blocked_split}


def _layout(x):
    """C (C-contiguous), T (a transposed view), R (rows contiguous, other strides), S (other)."""
    if x.flags.c_contiguous:
        return "C"
    if x.strides[-2] == x.itemsize:
        return "T"
    return "R" if x.strides[-1] == x.itemsize else "S"


def _bucket(n):
    return -(-n // _BUCKET) * _BUCKET


def _signature(a, b, out, candidates=None):
    """Exact shapes for small products; large 2-D ones by sizes rounded up to multiples of 256
    (training sees a new row count N = B*T with almost every batch, and one decision per
    bucket is enough there: both candidates are BLAS)."""
    layouts = (a.dtype.str, _layout(a), _layout(b), None if out is None else _layout(out),
               None if candidates is None else tuple(sorted(candidates)))
    if a.ndim == 2 and a.shape[0] * a.shape[1] * b.shape[1] > MEASURE_LIMIT:
        return ("large", _bucket(a.shape[0]), _bucket(a.shape[1]), _bucket(b.shape[1])) + layouts
    return (a.shape, b.shape) + layouts


def _measure(sig, a, b, out, names):
    results = {}
    for name in names:
        fn = CANDIDATES[name]
        fn(a, b, out)                                         # warm-up (compiles the kernel once)
        best = np.inf
        for _ in range(TRIALS):
            t0 = time.perf_counter()
            fn(a, b, out)
            best = min(best, time.perf_counter() - t0)
        results[name] = best
    _timings[sig] = results
    _choice[sig] = min(results, key=results.get)
    return _choice[sig]


THREAD_SAFE = ("blas", "blas-contiguous", "numba-blocked")   # may run on several threads at once


def matmul(a, b, out=None, candidates=None):
    """a @ b by the implementation measured fastest for this shape signature.

    Shape: a (..., M, K), b (..., K, N) with equal leading (batch) shapes -> (..., M, N); ``out``
    (optional) receives the result and may be a strided view. ``candidates`` (names from
    ``CANDIDATES``) limits the choice, e.g. to ``THREAD_SAFE`` for code that already runs on
    two threads: the Numba kernels use Numba's thread pool, which two threads must not enter
    at once, and ``blas-split`` would start a third thread.

    An ``out`` that overlaps a or b receives a copy of the product: no candidate writes into
    memory it is still reading (the split ones read all of b while writing half of out), and
    the first call's trials write into ``out``. Empty operands go to NumPy, which defines them
    (K = 0 gives zeros)."""
    check_operands(a, b, out, "matmul")
    if a.size == 0 or b.size == 0:
        return np.matmul(a, b, out=out)
    if out is not None and (np.may_share_memory(out, a) or np.may_share_memory(out, b)):
        out[...] = matmul(a, b, candidates=candidates)
        return out
    sig = _signature(a, b, out, candidates)
    name = _choice.get(sig)
    if name is None:
        per_matrix = a.shape[-2] * a.shape[-1] * b.shape[-1]
        if per_matrix > MEASURE_LIMIT:
            names = ["blas", "blas-split"] if a.ndim == 2 else ["blas"]
            if _blocked_offered(a, b):
                names += ["numba-blocked", "numba-blocked-split"] if a.ndim == 2 else ["numba-blocked"]
        elif per_matrix * (a.size // a.shape[-2] // a.shape[-1]) > TRIAL_LIMIT:
            names = ["blas"]
        else:
            names = ["blas", "numba"]
            if _layout(a) != "C" or _layout(b) != "C":
                names.insert(1, "blas-contiguous")
            if _blocked_offered(a, b):
                names.append("numba-blocked")
        if candidates is not None:
            names = [n for n in names if n in candidates] or ["blas"]
    if out is None:                  # aligned, so that products reading this result load whole
        out = empty_aligned(a.shape[:-1] + (b.shape[-1],), a.dtype)      # lines (and the trials')
    if name is None:
        name = _measure(sig, a, b, out, names) if len(names) > 1 else names[0]
        _choice[sig] = name
    return CANDIDATES[name](a, b, out)


def choice(a, b, out=None, candidates=None):
    """The candidate ``matmul`` uses (or would measure and use) for these operands."""
    sig = _signature(a, b, out, candidates)
    return _choice.get(sig)


def timings():
    """{signature: {candidate: best seconds}} of every shape measured so far in this process."""
    return {sig: dict(t) for sig, t in _timings.items()}


def reset():
    """Forget every measurement (e.g. after changing the thread counts)."""
    _choice.clear()
    _timings.clear()
