"""Matrix products, each by a variant fixed per product shape: BLAS through NumPy, or a Numba kernel.

``matmul(a, b, out=None, bias=None)`` computes ``a @ b`` (+ bias) for 2-D or equally-batched
3-D/4-D operands. Each product has a *key* (:func:`product_key`: dtype, which operands are
transposed views, whether ``out`` is a strided view, the shapes) and the dispatch table of
``npformer.runtime`` fixes one variant per key:

- ``"blas"``: ``np.matmul`` as given (NumPy hands each matrix to the BLAS);
- ``"blas-contiguous"``: ``np.matmul`` after copying strided operands to contiguous ones (NumPy
  takes a slower path for some transposed batched views);
- ``"numba"``: :func:`_gemm_rows` / :func:`_gemm_rows_nt`, row-parallel Numba kernels with no
  per-call BLAS overhead;
- ``"numba-blocked"``: :func:`npformer.kernels.blocked_matmul.blocked_matmul`, a serial,
  register-blocked Numba kernel in explicit 16-lane vectors (offered where N >= 32; a ``b``
  whose rows are strided, such as ``w.T`` or ``k^T``, is first copied into cache-line aligned
  rows). It pays on attention's many small products, where BLAS's per-matrix cost dominates,
  and wherever the BLAS runs narrower vector kernels than the CPU has (an OpenBLAS pinned to its
  AVX2 "Haswell" kernels on an AVX-512 CPU). A 2-D product runs in cells (rows x panels of
  32 columns, :func:`blocked_grid`) on the runtime's worker threads, each cell packing its own
  panels of b (``w.T`` included: no copy beforehand).

Variants round differently, so which one computes a product is part of a run's numerics. In
deterministic mode (the default) no clock decides: the variant is the one recorded by a resumed
checkpoint, else the one a calibrated table (``npformer calibrate``) holds, else :func:`rule`'s,
which reads the shape and the machine's features only. ``npformer.runtime.set_deterministic(False)``
times the offered variants once per key and keeps the fastest (``timings()`` returns the
measurements; ``npformer calibrate`` writes them into a table).

Threads never change the bits. A large 2-D product is cut into cells fixed by its shape
(:func:`product_grid`), which the runtime's worker threads share, each cell by single-threaded
BLAS: a BLAS given several threads divides a product by their number, and OpenBLAS's AVX-512
float64 kernels round the edges of each share differently. The blocked kernel computes every
element of the result the same way whichever cell holds it, so its cells are sized to the shape
and to the number of workers (:func:`blocked_grid`): one per worker.

Products of more than ``MEASURE_LIMIT`` multiply-adds per matrix skip the row-parallel
``"numba"`` kernel (no cache blocking), and their key rounds the sizes up to multiples of 256
(one choice per bucket, not per batch length).
"""
import functools
import time

import numpy as np
from numba import prange

from npformer import runtime
from npformer.aligned import empty_aligned, rows_aligned

from ._jit import kernel
from .activation_dropout import bias_relu
from ._product_operands import FLOAT_DTYPES, check_operands
from ._simd import LANES
from .blocked_matmul import BLOCK_COLS, BLOCK_ROWS, panels, run_blocked, run_cell
from .transpose import copy_rows

MEASURE_LIMIT = 1 << 22          # multiply-adds per matrix (M * K * N); see the module docstring
_BUCKET = 256                    # large products: one decision per size bucket
TRIAL_LIMIT = 1 << 28            # multiply-adds of a whole batched product worth a trial
TRIALS = 3                       # timed calls per candidate (the fastest counts)

def _product_work(a, b, out):
    """A batched product's work for the serial-twin choice (kernels/_jit.py), in elements'
    worth: its multiply-adds over 32 (vectorised 16 wide, two a cycle, 32 of them take about
    as long as one element of an element-wise kernel)."""
    return out.size * a.shape[-1] // 32


_timings = {}                    # key -> {variant: seconds}, of products timed in this process
_ruled = {}                      # key -> the rules' variant (what deterministic mode computes with)
_checked = set()                 # (key, variant) pairs known to fit their product


@kernel(parallel=True, work=_product_work)
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


@kernel(parallel=True, work=_product_work)
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


@kernel
def _gemm_cols_nt(a, bt, out):
    """out = a @ bt.T; a (M, K), bt (N, K), out (M, N), all C-contiguous, for few rows M.

    Serial: column by column, bt's row j is read once and serves four rows of a at a time (four
    dot products over k in order, one load of each weight). A decoding step's product is bound
    by reading the weights; a parallel region would cost more to start than it saves."""
    m, kk = a.shape
    n = bt.shape[0]
    m4 = m - m % 4
    for j in range(n):
        for i in range(0, m4, 4):
            z = a[i, 0] - a[i, 0]
            acc0, acc1, acc2, acc3 = z, z, z, z
            for k in range(kk):
                w = bt[j, k]
                acc0 += a[i, k] * w
                acc1 += a[i + 1, k] * w
                acc2 += a[i + 2, k] * w
                acc3 += a[i + 3, k] * w
            out[i, j], out[i + 1, j], out[i + 2, j], out[i + 3, j] = acc0, acc1, acc2, acc3
        for i in range(m4, m):
            acc = a[i, 0] - a[i, 0]
            for k in range(kk):
                acc += a[i, k] * bt[j, k]
            out[i, j] = acc


def _as_batched(x):
    """(..., M, K) -> (G, M, K) (a view when possible)."""
    return x.reshape((-1,) + x.shape[-2:])


def _blas(a, b, out):
    return np.matmul(a, b, out=out)


def _blas_contiguous(a, b, out):
    return np.matmul(np.ascontiguousarray(a), _copied(b, np.ascontiguousarray), out=out)


def _copied(b, copy):
    """copy(b); where b's second batch axis has stride 0 (attention's key/value heads, each read
    in place by its group of query heads), only b's distinct matrices are copied, and the copy
    is read with the same stride 0: a shared head is never copied once per query head."""
    if b.ndim == 4 and b.shape[1] > 1 and b.strides[1] == 0:
        once = copy(b[:, :1])
        return np.lib.stride_tricks.as_strided(once, b.shape,
                                               (once.strides[0], 0) + once.strides[2:])
    return copy(b)


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


THIN_ROWS = 16                   # "numba-thin": products of fewer rows (a decoding step's) ...
THIN_MAX_MACS = 1 << 25          # ... and at most this many multiply-adds: the kernel is serial,
                                 # and BLAS's cells share larger ones between the workers


def _thin_offered(a, b):
    """Whether a @ b is a thin product of a linear layer: few rows of a (from 2: one row is
    BLAS's matrix-vector product, faster still), b a weight's transposed view (``w.T``, w
    C-contiguous), float operands."""
    return (a.ndim == 2 and 2 <= a.shape[0] < THIN_ROWS and a.shape[1] >= 1
            and a.shape[0] * a.shape[1] * b.shape[1] <= THIN_MAX_MACS
            and a.dtype == b.dtype and a.dtype in FLOAT_DTYPES
            and _layout(b) == "T" and b.T.flags.c_contiguous)


def _numba_thin(a, b, out):
    """:func:`_gemm_cols_nt` on a thin product (see :func:`_thin_offered`)."""
    if not _thin_offered(a, b):
        return _blas(a, b, out)
    a = np.ascontiguousarray(a)
    target = out if out is not None and out.flags.c_contiguous else \
        empty_aligned((a.shape[0], b.shape[1]), a.dtype)
    _gemm_cols_nt(a, b.T, target)
    if out is not None and target is not out:
        out[...] = target
        return out
    return target


def _blocked_offered(a, b):
    """Whether the blocked kernel can take a @ b (copying b or going through a temporary out
    where needed): float operands, at most two batch axes, M, K >= 1, N >= 32."""
    return (a.dtype == b.dtype and a.dtype in FLOAT_DTYPES and a.ndim <= 4
            and b.shape[-1] >= BLOCK_COLS and a.shape[-2] >= 1 and a.shape[-1] >= 1)


def _aligned_rows(b):
    """b itself if its rows have unit stride and start cache lines, or if it is a batch of
    small matrices with unit-stride rows (attention's heads: a copy per call costs more than the
    misalignment); else a copy whose rows do (vector loads that straddle two cache lines are
    slower; ``w.T`` is copied here)."""
    unit = b.shape[-1] == 1 or b.strides[-1] == b.itemsize
    if unit and (b.ndim > 2 or rows_aligned(b)):
        return b
    return _copied(b, lambda x: copy_rows(x, empty_aligned(x.shape, x.dtype, aligned_rows=True)))


def _numba_blocked(a, b, out):
    """The register-blocked kernel, on operands as :func:`matmul` checked them (an ``out``
    overlapping neither a nor b), on the calling thread: a 2-D product as one cell
    (:func:`_blocked_cells`); a batch of matrices by :func:`run_blocked`, its b first copied
    where its rows are strided (``w.T`` of a linear layer) or do not start cache lines, and an
    ``out`` with strided rows receiving a copy."""
    if not _blocked_offered(a, b):
        return _blas(a, b, out)
    if a.ndim == 2:
        return _blocked_cells(a, b, out, None, 1)
    b = _aligned_rows(b)
    if out is None:
        return run_blocked(a, b, empty_aligned(a.shape[:-1] + (b.shape[-1],), a.dtype))
    if out.shape[-1] > 1 and out.strides[-1] != out.itemsize:
        out[...] = run_blocked(a, b, empty_aligned(out.shape, a.dtype))
        return out
    return run_blocked(a, b, out)


def _numba_blocked_parts(a, b, out, bias=None, relu=False):
    """The blocked kernel with a 2-D product's cells (:func:`blocked_grid`) shared by the
    runtime's worker threads. Each element of the result is computed the same way whichever
    cell holds it, so the bits do not depend on the number of workers. ``bias`` and ``relu``
    as :func:`matmul`'s."""
    if a.ndim != 2 or not _blocked_offered(a, b):
        return _add_bias(_numba_blocked(a, b, out), bias, relu)
    return _blocked_cells(a, b, out, bias, runtime.workers(), relu)


def blocked_grid(m, k, n, workers):
    """(row bounds, panel bounds) of the cells a 2-D product (M, K) @ (K, N) is cut into for the
    blocked kernel on ``workers`` threads, a panel being 32 columns (the last one moved back to
    end at N). Any cutting gives the same bits (:func:`npformer.kernels.blocked_matmul.run_cell`),
    so the cells are sized to the shape and the workers: one cell per worker, no more than one
    per ``PART_MACS`` multiply-adds, as pr row ranges x pc panel ranges. Of those, the one whose
    largest cell costs least: its multiply-adds, plus the elements it packs (its rows of a and
    its panels of b, all of K) at ``LANES`` multiply-adds each (a scalar copy against a vector
    fused multiply-add). Row bounds are multiples of 4 (whole blocks), a cell holds 4 rows or
    more; where N is not a multiple of 32 the last cell holds the last two panels, so that the
    moved-back panel overlaps only its own cell's columns."""
    n_panels = panels(n)
    units = n_panels - 1 if n % BLOCK_COLS and n_panels > 1 else n_panels   # the last: 2 panels
    count = max(1, min(workers, m * k * n // PART_MACS))
    best = (None, 1, 1)
    for pr in range(1, count + 1):
        pc = count // pr
        if pr > 1 and m // pr < BLOCK_ROWS or pc > units:
            continue
        rows, cols = -(-m // pr), -(-units // pc) * BLOCK_COLS      # the largest cell
        cost = rows * cols * k + LANES * (rows * k + k * cols)
        if best[0] is None or cost < best[0]:
            best = (cost, pr, pc)
    _, pr, pc = best
    rows = [0] + [m * i // pr // BLOCK_ROWS * BLOCK_ROWS for i in range(1, pr)] + [m]
    cols = [0] + [units * i // pc for i in range(1, pc)] + [n_panels]
    return rows, cols


def _blocked_cells(a, b, out, bias, workers, relu=False):
    """a @ b (+ bias) of 2-D operands, cell by cell (:func:`blocked_grid` for ``workers``) over
    the runtime's workers, each cell's columns of the bias added, and with ``relu`` the ReLU
    applied, by the worker that computed it; an ``out`` with strided rows (or None) receives the
    result through an aligned array."""
    m, n = a.shape[0], b.shape[1]
    target = out
    if out is None or (n > 1 and out.strides[-1] != out.itemsize):
        target = empty_aligned((m, n), a.dtype)
    rows, cols = blocked_grid(m, a.shape[1], n, workers)

    def cell(r0, r1, p0, p1):
        run_cell(a, b, target, (r0, r1), (p0, p1))
        c0, c1 = p0 * BLOCK_COLS, min(p1 * BLOCK_COLS, n)
        _add_bias(target[r0:r1, c0:c1], None if bias is None else bias[c0:c1], relu)
    cells = [functools.partial(cell, r0, r1, p0, p1)
             for r0, r1 in zip(rows, rows[1:]) for p0, p1 in zip(cols, cols[1:])]
    if len(cells) == 1:
        cells[0]()
    else:
        runtime.run_parts(_run_part, cells)
    if out is not None and target is not out:
        out[...] = target
        return out
    return target


VARIANTS = {"blas": _blas, "blas-contiguous": _blas_contiguous, "numba": _numba,
            "numba-blocked": _numba_blocked, "numba-thin": _numba_thin}
THREAD_SAFE = ("blas", "blas-contiguous", "numba-blocked")   # may run on several threads at once
runtime.register_variants(VARIANTS)


def _layout(x):
    """C (C-contiguous), T (a transposed view), R (rows contiguous, other strides), S (other)."""
    if x.flags.c_contiguous:
        return "C"
    if x.strides[-2] == x.itemsize:
        return "T"
    return "R" if x.strides[-1] == x.itemsize else "S"


def _bucket(n):
    """n rounded up to a multiple of 256; below 256 n itself (the variants offered depend on
    whether N >= 32, and a small size is worth its own choice)."""
    return n if n < _BUCKET else -(-n // _BUCKET) * _BUCKET


def product_key(a, b, out=None, candidates=None):
    """The dispatch table's key of a product: dtype, layouts of a, b and out (C, T, R, S or -),
    and the shapes; large 2-D products by their sizes, those from 256 up rounded up to multiples
    of 256 (training sees a new row count B*T with almost every batch). "safe" marks a product limited to the
    ``THREAD_SAFE`` variants. E.g. ``"<f4 CT- L2048x256x768"``,
    ``"<f4 RTR 64x8x15x32@64x8x32x15 safe"``."""
    layouts = _layout(a) + _layout(b) + ("-" if out is None else _layout(out))
    return _key_text(a.dtype.str, layouts, a.shape, b.shape, candidates is not None)


@functools.lru_cache(maxsize=4096)
def _key_text(dtype, layouts, a_shape, b_shape, safe):
    """:func:`product_key`'s text, remembered: attention asks for the same few keys thousands
    of times a step, and formatting one costs more than looking it up."""
    if len(a_shape) == 2 and a_shape[0] * a_shape[1] * b_shape[1] > MEASURE_LIMIT:
        shapes = f"L{_bucket(a_shape[0])}x{_bucket(a_shape[1])}x{_bucket(b_shape[1])}"
    else:
        shapes = "x".join(map(str, a_shape)) + "@" + "x".join(map(str, b_shape))
    return f"{dtype} {layouts} {shapes}" + (" safe" if safe else "")


def _is_large(a, b):
    return a.shape[-2] * a.shape[-1] * b.shape[-1] > MEASURE_LIMIT


def _offered(a, b, candidates):
    """The variants worth considering for a @ b, BLAS first."""
    per_matrix = a.shape[-2] * a.shape[-1] * b.shape[-1]
    if _is_large(a, b):                          # no cache blocking in "numba": too slow to try
        names = ["blas"] + (["numba-blocked"] if _blocked_offered(a, b) else [])
    elif per_matrix * (a.size // a.shape[-2] // a.shape[-1]) > TRIAL_LIMIT:
        names = ["blas"]
    else:
        names = ["blas", "numba"]
        if _layout(a) != "C" or _layout(b) != "C":
            names.insert(1, "blas-contiguous")
        if _blocked_offered(a, b):
            names.append("numba-blocked")
    if _thin_offered(a, b):
        names.append("numba-thin")
    if candidates is not None:
        names = [n for n in names if n in candidates] or ["blas"]
    return names


# OpenBLAS kernel families with AVX-512 code (threadpoolctl's "architecture").
AVX512_BLAS = ("SkylakeX", "Cooperlake", "SapphireRapids")


def rule(names, features, large=False, b_layout="C", batched=False, n_cols=0):
    """The deterministic choice among the offered ``names`` for a product, from the machine's
    ``features`` (``npformer.runtime.rule_features``), whether the product is ``large`` (more
    than ``MEASURE_LIMIT`` multiply-adds per matrix), the layout of b, whether it is a batch of
    matrices and its number of columns N. No clock is read.

    A thin product of a linear layer (fewer than ``THIN_ROWS`` rows, b = w.T, as in a decoding
    step): "numba-thin", on any machine; such a product is bound by reading w, which BLAS packs
    first and the kernel reads once.

    Then, for a batch of small products whose b is a transposed view with N >= 64 (attention's
    ``q k^T`` at 64 keys and more): BLAS on a contiguous copy of b, wherever BLAS is chosen
    below (NumPy hands such views to BLAS matrix by matrix, transposed, the slow way round).

    - A CPU with AVX-512 whose BLAS runs narrower (AVX2) kernels, as an OpenBLAS pinned to
      "Haswell" or "Zen" does: the blocked kernel wherever it is offered (16-lane vectors
      against 8).
    - A CPU with AVX-512 and a BLAS that uses it: the blocked kernel for large products whose b
      has contiguous rows (its cells share the workers, where BLAS's cells each pack b again);
      BLAS for the rest (a small product is too small to split; a transposed b was copied
      first when this rule was set, and the rule stays: the variant is part of a run's bits).
    - Anything else (AVX2 CPUs, where the kernel's 16-lane vectors take two registers each, or a
      BLAS that threadpoolctl cannot name): BLAS."""
    if "numba-thin" in names:
        return "numba-thin"
    blas = ("blas-contiguous" if batched and b_layout == "T" and n_cols >= 64
            and "blas-contiguous" in names else "blas")
    if "numba-blocked" not in names or not features.get("avx512f"):
        return blas
    blas_arch = features.get("blas_arch")
    if blas_arch is None:
        return blas
    if blas_arch not in AVX512_BLAS:
        return "numba-blocked"
    return "numba-blocked" if large and b_layout == "C" else blas


def _measure(key, a, b, out, names, run):
    results = {}
    for name in names:
        run(name, a, b, out)                                # warm-up (compiles the kernel once)
        best = np.inf
        for _ in range(TRIALS):
            t0 = time.perf_counter()
            run(name, a, b, out)
            best = min(best, time.perf_counter() - t0)
        results[name] = best
    _timings[key] = results
    return min(results, key=results.get)


# A large product's cells: at least PART_MACS multiply-adds each (so a product is cut once it has
# twice that). 2^23 is a fraction of a millisecond of one core's BLAS: long enough that packing a
# cell's operands and handing it out stay small against it, short enough that the projections of a
# small model's batch, such as Transformer-Tiny's (~1,900 x 128) @ (128 x 128), are cut and share
# the cores instead of running on one while the others wait.
PART_MACS = 1 << 23
MAX_PARTS = 16                   # ... and at most this many cells
_ROW_ALIGN, _COL_ALIGN = 16, 64  # cell edges: multiples of BLAS's register blocks


def product_grid(m, k, n):
    """(row bounds, column bounds) of the cells a large 2-D product (M, K) @ (K, N) is divided
    into: at most ``MAX_PARTS`` cells of at least ``PART_MACS`` multiply-adds, shaped so that
    the operands are read (packed) the fewest times (``pc * M*K + pr * K*N`` for pr x pc cells).

    A function of the shape alone: the cells, and so every bit of the result, are the same on
    1 core or 64. (A BLAS divides a product between its own threads by the thread count, and
    some, such as OpenBLAS's AVX-512 float64 kernels, round the edges of each share
    differently: the bits would depend on the cores.)"""
    parts = max(1, min(MAX_PARTS, m * k * n // PART_MACS))
    best = (None, 1, 1)
    for pr in range(1, parts + 1):
        pc = parts // pr
        if pr > 1 and m // pr < 2 * _ROW_ALIGN:
            break
        if pc > 1 and n // pc < 2 * _COL_ALIGN:
            continue
        cost = pc * m * k + pr * k * n
        if best[0] is None or cost < best[0]:
            best = (cost, pr, pc)
    _, pr, pc = best

    def bounds(total, count, align):
        return [0] + [total * i // count // align * align for i in range(1, count)] + [total]
    return bounds(m, pr, _ROW_ALIGN), bounds(n, pc, _COL_ALIGN)


def _cell_parts(product, a, b, out, bias=None, into=None, relu=False):
    """The cells of a large 2-D product(a, b, out) (:func:`product_grid`) as parts for
    ``runtime.run_parts``, or None where the product is one cell. A part computes its cell by
    single-threaded BLAS, adds the cell's columns of ``bias`` (and with ``relu`` applies the
    ReLU) while the cell is in cache, and then, with ``into``, adds the cell into the same block
    of ``into``."""
    rows, cols = product_grid(a.shape[0], a.shape[1], b.shape[1])
    if len(rows) == 2 and len(cols) == 2:
        return None

    def cell(r0, r1, c0, c1):
        o = out[r0:r1, c0:c1]
        product(a[r0:r1], b[:, c0:c1], o)
        _add_bias(o, None if bias is None else bias[c0:c1], relu)
        if into is not None:
            into[r0:r1, c0:c1] += o
    return [functools.partial(cell, r0, r1, c0, c1)
            for r0, r1 in zip(rows, rows[1:]) for c0, c1 in zip(cols, cols[1:])]


def _run_part(part):
    """run_parts' function for parts that are callables."""
    part()


def _main_cells(name, a, b, out, bias=None, into=None, relu=False):
    """The cells (:func:`_cell_parts`) of a product that variant ``name`` computes cell by cell
    on the calling thread's behalf (a large 2-D product by BLAS), or None: one cell, or a
    variant that does not cut products into cells."""
    if a.ndim == 2 and name in ("blas", "blas-contiguous"):
        return _cell_parts(VARIANTS[name], a, b, out, bias, into, relu)
    return None


def _add_bias(out, bias, relu=False):
    """out += bias (None: nothing), then with ``relu`` (out 2-D) out = relu(out) in the same
    pass (:func:`npformer.kernels.activation_dropout.bias_relu`: the same bits as the sum
    NumPy computes and the activation kernels' ReLU after it); returns out."""
    if relu:
        bias_relu(out, out[0] if bias is None else bias, bias is not None)
    elif bias is not None:
        out += bias
    return out


def _run_main(name, a, b, out, bias=None, relu=False):
    """A product on the calling thread's behalf: a large 2-D one in cells fixed by its shape
    (BLAS) or in cells sized to the workers (the blocked kernel) over the runtime's workers; BLAS on npformer's
    thread count (one) in every case. ``bias`` and ``relu`` as :func:`matmul`'s."""
    cells = _main_cells(name, a, b, out, bias, relu=relu)
    if cells is not None:
        runtime.run_parts(_run_part, cells)
        return out
    with runtime.blas_scope():
        if name == "numba-blocked":
            return _numba_blocked_parts(a, b, out, bias, relu)
        return _add_bias(VARIANTS[name](a, b, out), bias, relu)


def _run_safe(name, a, b, out, bias=None, relu=False):
    """A product inside a part of parallel work (the caller set BLAS to one thread)."""
    return _add_bias(VARIANTS[name](a, b, out), bias, relu)


def matmul(a, b, out=None, candidates=None, bias=None, relu=False):
    """a @ b (+ bias) by the variant the dispatch table holds for this product's key.

    Shape: a (..., M, K), b (..., K, N) with equal leading (batch) shapes -> (..., M, N); ``out``
    (optional) receives the result and may be a strided view. ``bias`` (N,) (optional) is added
    to every row, the same bits as adding it afterwards, but cell by cell where the product is
    cut into cells (each cell's columns while the cell is still in cache, on the worker that
    computed it: a linear layer's bias costs no pass of its own). ``relu`` (2-D products only):
    the ReLU of the kernels' activations (:func:`npformer.kernels.activation_dropout.relu`)
    applied after the bias in the same way, cell by cell, a feed-forward block's activation in
    eval mode with no pass of its own. ``candidates`` limits the variants
    to ``THREAD_SAFE`` ones, for code that already runs on several threads (attention's parts):
    such a call computes on the calling thread alone.

    The variant: one fixed earlier for this key (in this process, by a resumed checkpoint or by a
    calibrated table), else :func:`rule`'s; with ``npformer.runtime.set_deterministic(False)``,
    the fastest of the offered ones, timed once per key.

    An ``out`` that overlaps a, b or the bias receives a copy of the product (no variant writes into memory
    it is still reading). Empty operands go to NumPy, which defines them (K = 0 gives zeros)."""
    name, out, run = _prepare(a, b, out, candidates, bias, relu)
    return out if run is None else run(name, a, b, out, bias, relu)


def _prepare(a, b, out, candidates, bias, relu=False):
    """matmul's checks and choice: (variant, out, run) for ``run(variant, a, b, out, bias,
    relu)``, ``out`` allocated where None was given; or (None, result, None) where the result
    is already computed (empty operands, an ``out`` that overlaps an operand)."""
    check_operands(a, b, out, "matmul")
    if relu and a.ndim != 2:
        raise ValueError(f"matmul: relu: expected 2-D operands (a linear layer's product), got "
                         f"a of shape {a.shape}")
    if candidates is not None and not set(candidates) <= set(THREAD_SAFE):
        raise ValueError(f"matmul: candidates: expected names from {THREAD_SAFE}, got "
                         f"{candidates!r}")
    if bias is not None and (not isinstance(bias, np.ndarray) or bias.shape != b.shape[-1:]):
        raise ValueError(f"matmul: bias: expected an array of shape {b.shape[-1:]} (one entry "
                         f"per column of the product), got "
                         f"{getattr(bias, 'shape', type(bias).__name__)}")
    if a.size == 0 or b.size == 0:
        result = np.matmul(a, b, out=out)
        return None, _add_bias(result, bias, relu and result.size > 0), None
    if out is not None and (np.may_share_memory(out, a) or np.may_share_memory(out, b)
                            or (bias is not None and np.may_share_memory(out, bias))):
        out[...] = matmul(a, b, candidates=candidates, bias=bias, relu=relu)
        return None, out, None
    key = product_key(a, b, out, candidates)
    name = runtime.dispatch_choice(key)
    if name is not None and (key, name) not in _checked:      # from a table or a checkpoint
        offered = _offered(a, b, candidates)
        if name in offered:
            _checked.add((key, name))
        else:
            runtime.refuse_choice(key, name, f"cannot compute (it offers {offered})")
            name = None
    if out is None:                  # aligned, so that products reading this result load whole
        out = empty_aligned(a.shape[:-1] + (b.shape[-1],), a.dtype)      # lines (and the trials')
    run = _run_main if candidates is None else _run_safe
    if name is None:
        names = _offered(a, b, candidates)
        _ruled[key] = rule(names, runtime.rule_features(), large=_is_large(a, b),
                           b_layout=_layout(b), batched=a.ndim > 2, n_cols=b.shape[-1])
        if runtime.is_deterministic() or len(names) == 1:
            name = _ruled[key]
        else:
            name = _measure(key, a, b, out, names, run)
        runtime.remember(key, name)
        _checked.add((key, name))
    return name, out, run


def matmuls(products, extra=()):
    """Independent products as one parallel region: ``products`` holds (a, b, out, into)
    tuples, each ``a @ b`` as :func:`matmul` computes it (its variant, its cells, its bits; ``out``
    None: allocated), then added into ``into`` where that is an array. Returns the products.

    The cells of every product cut into cells, and the callables of ``extra`` (other work that
    reads and writes nothing the products touch), are shared by the runtime's workers at once:
    one handoff to the helper threads instead of one per product, and each cell added into
    ``into`` by the worker that computed it, while it is in cache. A linear layer's backward,
    dX = dY W and dW = dY^T X with dW added into the weight's gradient and the bias gradient as
    an ``extra``, is one region. A product that is not cut into cells (one cell, a batched or
    Numba variant) is computed first, on the calling thread's behalf, as matmul computes it.
    Which thread computes which part changes no bit: the parts write disjoint outputs."""
    parts, results = [], []
    for a, b, out, into in products:
        name, out, run = _prepare(a, b, out, None, None)
        results.append(out)
        cells = None if run is None else _main_cells(name, a, b, out, None, into)
        if cells is None:
            if run is not None:
                run(name, a, b, out, None)
            if into is not None:
                into += out
        else:
            parts += cells
    parts += list(extra)
    if parts:
        runtime.run_parts(_run_part, parts)
    return results


def choice(a, b, out=None, candidates=None):
    """The variant ``matmul`` uses for these operands, or None if it has not chosen yet."""
    return runtime.dispatch_choice(product_key(a, b, out, candidates))


def rule_choices():
    """{key: variant} the rules chose (or would have chosen, where timed) in this process."""
    return dict(_ruled)


def timings():
    """{key: {variant: best seconds}} of every product timed in this process (non-deterministic
    mode and ``npformer calibrate``)."""
    return {key: dict(t) for key, t in _timings.items()}


def reset():
    """Forget every choice and timing of this process (tests, and ``npformer calibrate``)."""
    _timings.clear()
    _ruled.clear()
    _checked.clear()
    runtime.forget_choices()
