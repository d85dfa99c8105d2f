"""The one helper Python thread that gives npformer's BLAS work a second core.

Both the row-split products (``matmul``'s ``"blas-split"``) and the attention parts hand work to
it while the calling thread does its own share. One thread, started on first use: a waiting
Python thread blocks (it does not spin), and two such pools would only compete for the same
second core. The two users never nest: attention limits its products to ``THREAD_SAFE``
candidates, which do not submit work here.
"""
from concurrent.futures import ThreadPoolExecutor

_executor = []


def submit(fn, *args, **kwargs):
    """Run fn(*args, **kwargs) on the helper thread; returns its Future."""
    if not _executor:
        _executor.append(ThreadPoolExecutor(1, thread_name_prefix="npformer-helper"))
    return _executor[0].submit(fn, *args, **kwargs)
