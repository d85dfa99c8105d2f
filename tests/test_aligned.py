"""npformer.aligned: arrays whose rows start on cache lines (for the vector loads of the Numba
kernels), and the model's flat parameter buffer allocated that way."""
import numpy as np
import pytest

import npformer as nf
from npformer.aligned import ALIGNMENT, empty_aligned, rows_aligned, zeros_aligned


@pytest.mark.parametrize("shape", [(1,), (3,), (5, 7), (2, 3, 33)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_empty_aligned_starts_a_cache_line(shape, dtype):
    x = empty_aligned(shape, dtype)
    assert x.shape == shape and x.dtype == dtype and x.flags.c_contiguous and x.flags.writeable
    assert x.ctypes.data % ALIGNMENT == 0
    x[...] = 1                                                # the whole array is usable


@pytest.mark.parametrize("shape", [(3, 5), (2, 16), (4, 3, 17), (7, 1)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_empty_aligned_rows_each_start_a_cache_line(shape, dtype):
    x = empty_aligned(shape, dtype, aligned_rows=True)
    assert x.shape == shape and x.dtype == dtype and rows_aligned(x)
    x[...] = np.arange(x.size).reshape(shape)                 # every element addressable
    assert x.ravel().tolist() == list(range(x.size))
    assert not rows_aligned(np.ones((3, 64), dtype)[:, 1:])   # rows a step past a line


def test_zeros_aligned_and_the_flat_parameter_buffer():
    z = zeros_aligned((3, 5), np.float64)
    assert z.ctypes.data % ALIGNMENT == 0 and not z.any()
    model = nf.Transformer(src_vocab_size=32, tgt_vocab_size=48, d_model=32, n_heads=2, d_ff=64,
                           n_encoder_layers=1, n_decoder_layers=1, max_len=8, seed=0)
    model.flatten_parameters()
    assert model.flat_params.ctypes.data % ALIGNMENT == 0
    assert model.flat_grads.ctypes.data % ALIGNMENT == 0 and not model.flat_grads.any()
    weights = [p.data for name, p in model.named_parameters() if p.data.ndim == 2]
    assert weights and all(rows_aligned(w) for w in weights)      # all sizes here: whole lines


def test_large_buffers_are_reused_only_once_nothing_references_them():
    """The pool hands a large buffer out again once its array (and every view of it) is gone,
    never while any view lives; arrays from it never share memory with each other."""
    from npformer import aligned as A
    A.release_pool()
    shape = (A.POOL_MIN_BYTES // 4 + 100,)
    a = A.empty_aligned(shape, np.float32)
    b = A.empty_aligned(shape, np.float32)
    assert not np.shares_memory(a, b)
    first = a.ctypes.data
    view = a[10:20]
    del a
    c = A.empty_aligned(shape, np.float32)                  # a's buffer is still seen by `view`
    assert not np.shares_memory(c, view) and not np.shares_memory(c, b)
    del view, c
    d = A.empty_aligned((shape[0] - 50,), np.float32)        # a's buffer is idle now: reused
    assert d.ctypes.data == first
    assert not np.shares_memory(d, b) and d.ctypes.data % A.ALIGNMENT == 0
    d[:] = 1.0
    assert (d == 1.0).all() and b.shape == shape
    del d, b
    A.release_pool()
    assert A._pool == []


def test_a_shape_may_be_an_int_a_numpy_integer_a_0d_array_or_a_sequence():
    for shape, expected in [(5, (5,)), (np.int64(3), (3,)), (np.array(4), (4,)),
                            ([2, 3], (2, 3)), (np.array([2, 2]), (2, 2)), ((), ())]:
        assert empty_aligned(shape, np.float32).shape == expected
