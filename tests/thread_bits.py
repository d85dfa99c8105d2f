"""One check for the kernels' promise that threads never change the bits."""
import numba
import numpy as np

from npformer import runtime


def assert_same_bits_on_threads(run, counts=(1, 2, 1, 2)):
    """Call ``run()`` with the runtime on each thread count in ``counts`` (capped by Numba's
    pool), the runtime's default put back afterwards, and assert that every call returned the
    first's arrays bit for bit. ``run`` returns an array or a sequence of arrays; returns the
    first call's."""
    results = []
    try:
        for threads in counts:
            runtime.configure_runtime(threads=min(threads, numba.config.NUMBA_NUM_THREADS))
            result = run()
            results.append([result] if isinstance(result, np.ndarray) else list(result))
    finally:
        runtime.configure_runtime()
    for result in results[1:]:
        assert len(result) == len(results[0])
        for got, first in zip(result, results[0]):
            np.testing.assert_array_equal(got, first)
    return results[0]
