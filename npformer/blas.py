"""The BLAS libraries loaded in this process, seen through threadpoolctl: what they are
(:func:`blas_info`) and their thread count for the length of a block (:func:`blas_threads`).

BLAS's thread count is one setting for the whole process, shared by every thread that calls a
product; :mod:`npformer.runtime` decides the count inside npformer's own products
(``blas_scope``) and uses these to set it and put the user's back. Where threadpoolctl is
missing, or knows no BLAS here, there is nothing to set and the blocks change nothing.
"""
import contextlib
import os
import threading

_blas = {"controllers": None}


def _blas_controllers():
    if _blas["controllers"] is None:
        try:
            from threadpoolctl import ThreadpoolController
            _blas["controllers"] = ThreadpoolController().select(user_api="blas").lib_controllers
        except Exception:                      # no threadpoolctl or no BLAS it knows: leave BLAS be
            _blas["controllers"] = []
    return _blas["controllers"]


def blas_info():
    """[(internal_api, version, architecture)] of the BLAS libraries loaded in this process,
    NumPy's first (others, such as SciPy's, follow in a fixed order)."""
    import numpy
    home = os.path.dirname(os.path.dirname(os.path.abspath(numpy.__file__)))
    numpy_libs = os.path.join(home, "numpy.libs")

    def order(c):
        path = os.path.abspath(getattr(c, "filepath", "") or "")
        return (not path.startswith(numpy_libs), path)
    return [(c.internal_api, c.version, getattr(c, "architecture", None))
            for c in sorted(_blas_controllers(), key=order)]


_blas_lock = threading.Lock()
_blas_hold = {"saved": [], "counts": []}     # counts in force, outermost first (see blas_threads)


@contextlib.contextmanager
def blas_threads(n):
    """BLAS on ``n`` threads inside the block. BLAS's thread count is one setting for the whole
    process, so the blocks of every thread count together: the first to enter saves the user's
    setting, the last to leave puts it back, and a nested block with another count restores the
    enclosing block's on exit."""
    with _blas_lock:
        counts = _blas_hold["counts"]
        if not counts:
            _blas_hold["saved"] = [(c, c.get_num_threads()) for c in _blas_controllers()]
            current = None
        else:
            current = counts[-1]
        if n != current:
            for c, before in _blas_hold["saved"]:
                if current is not None or before != n:
                    c.set_num_threads(n)
        counts.append(n)
    try:
        yield
    finally:
        with _blas_lock:
            counts.pop()
            if not counts:
                for c, before in _blas_hold["saved"]:
                    if before != n:
                        c.set_num_threads(before)
            elif counts[-1] != n:
                for c, _ in _blas_hold["saved"]:
                    c.set_num_threads(counts[-1])
