"""The matmul dispatcher and its Numba kernels, the linear layer on top of it, and the
vectorisable float32 exp."""
import importlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npformer import backend, runtime
from npformer import functional as F

K = backend.load("numba")
M = importlib.import_module("npformer.kernels.matmul")     # (the package's `matmul` is the function)
exp32 = importlib.import_module("npformer.kernels._fastexp").exp32

TOL = {np.float32: 2e-5, np.float64: 1e-12}


def operand(rng, shape, dtype, layout):
    """A (…, R, C) array as a contiguous array, a transposed view or a strided slice."""
    if layout == "T":
        return rng.standard_normal(shape[:-2] + shape[-1:] + shape[-2:-1]).astype(dtype).swapaxes(-1, -2)
    if layout == "S":
        return rng.standard_normal(shape[:-1] + (2 * shape[-1],)).astype(dtype)[..., ::2]
    return rng.standard_normal(shape).astype(dtype)


@settings(deadline=None, max_examples=30)
@given(batch=st.sampled_from([(), (3,), (2, 3)]), m=st.integers(1, 9), k=st.integers(1, 9),
       n=st.integers(1, 9), la=st.sampled_from("CTS"), lb=st.sampled_from("CTS"),
       dtype=st.sampled_from(list(TOL)), seed=st.integers(0, 2**16))
def test_every_candidate_equals_numpy(batch, m, k, n, la, lb, dtype, seed):
    rng = np.random.default_rng(seed)
    a, b = operand(rng, batch + (m, k), dtype, la), operand(rng, batch + (k, n), dtype, lb)
    expected = np.matmul(a.astype(np.float64), b.astype(np.float64))
    scale = max(1.0, float(np.abs(expected).max()))
    for name, fn in M.VARIANTS.items():
        out = np.empty(batch + (n, m), dtype).swapaxes(-1, -2)          # a strided out view
        res = fn(a, b, out)
        assert res.dtype == dtype, name
        np.testing.assert_allclose(out, expected, rtol=0, atol=TOL[dtype] * scale * k, err_msg=name)
        np.testing.assert_allclose(fn(a, b, None), expected, rtol=0, atol=TOL[dtype] * scale * k,
                                   err_msg=name)


@pytest.mark.parametrize("layout", ["C", "T"])
@pytest.mark.parametrize("dtype", list(TOL))
def test_an_operand_shared_at_stride_0_is_copied_once_and_keeps_the_bits(layout, dtype):
    """Attention's key/value heads, each read by its group of query heads: b (X, G, K, N) with
    stride 0 along G. Each variant attention may take (``THREAD_SAFE``) gives the bits it gives
    on the repeated operand, and those that copy b copy each distinct matrix once (the copy
    keeps the stride 0)."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((4, 3, 5, 8)).astype(dtype)
    heads = operand(rng, (4, 1, 8, 40), dtype, layout)                  # (X, 1, K, N)
    shared = np.lib.stride_tricks.as_strided(heads, (4, 3, 8, 40),
                                             heads.strides[:1] + (0,) + heads.strides[2:])
    repeated = np.repeat(heads, 3, axis=1)                               # same layout, copied
    if layout == "T":
        repeated = np.repeat(heads.swapaxes(-1, -2), 3, axis=1).swapaxes(-1, -2)
    for name in M.THREAD_SAFE:
        fn = M.VARIANTS[name]
        assert fn(a, shared, None).tobytes() == fn(a, repeated, None).tobytes(), name
    for copy in (np.ascontiguousarray, lambda x: x.copy()):
        once = M._copied(shared, copy)
        assert once.strides[1] == 0 and np.array_equal(once, shared)


def test_deterministic_dispatch_reads_no_clock_and_follows_the_rules(monkeypatch):
    """The default mode: the first product of a shape is computed by the rules' variant, and
    nothing is timed (a clock read here would fail the test)."""
    M.reset()
    monkeypatch.setattr(M.time, "perf_counter", lambda: pytest.fail("the dispatcher read a clock"))
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((4, 5, 6)), rng.standard_normal((4, 6, 40))
    assert M.choice(a, b) is None
    np.testing.assert_allclose(M.matmul(a, b), a @ b, rtol=0, atol=1e-12)
    features = runtime.rule_features()
    assert M.choice(a, b) == M.rule(["blas", "numba", "numba-blocked"], features)
    assert M.timings() == {}
    M.reset()


def test_rules_choose_by_cpu_and_blas_kernels_only():
    names = ["blas", "numba", "numba-blocked"]
    avx512_cpu = {"avx512f": True, "avx2": True}
    assert M.rule(names, dict(avx512_cpu, blas_arch="Haswell")) == "numba-blocked"   # pinned AVX2
    assert M.rule(names, dict(avx512_cpu, blas_arch="Zen")) == "numba-blocked"
    assert M.rule(names, dict(avx512_cpu, blas_arch="SkylakeX")) == "blas"                # small
    assert M.rule(names, dict(avx512_cpu, blas_arch="SkylakeX"), large=True) == "numba-blocked"
    assert M.rule(names, dict(avx512_cpu, blas_arch="SkylakeX"), large=True, b_layout="T") == "blas"
    assert M.rule(names, {"avx512f": False, "avx2": True, "blas_arch": "Haswell"}, large=True) == "blas"
    assert M.rule(names, dict(avx512_cpu, blas_arch=None)) == "blas"        # a BLAS we cannot see
    assert M.rule(["blas"], dict(avx512_cpu, blas_arch="Haswell")) == "blas"  # not offered
    qk = ["blas", "blas-contiguous", "numba-blocked"]                # attention's q k^T
    skylake = dict(avx512_cpu, blas_arch="SkylakeX")
    assert M.rule(qk, skylake, b_layout="T", batched=True, n_cols=64) == "blas-contiguous"
    assert M.rule(qk, skylake, b_layout="T", batched=True, n_cols=32) == "blas"
    assert M.rule(qk, skylake, b_layout="T", batched=False, n_cols=64) == "blas"


def test_dispatcher_measures_once_and_keeps_the_fastest(nondeterministic):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((4, 5, 6)), rng.standard_normal((4, 6, 7))
    assert M.choice(a, b) is None
    np.testing.assert_allclose(M.matmul(a, b), a @ b, rtol=0, atol=1e-12)
    (key, times), = M.timings().items()
    assert set(times) == {"blas", "numba"}                   # both contiguous: one BLAS variant
    assert M.choice(a, b) == min(times, key=times.get)
    M.matmul(a, b)
    assert len(M.timings()) == 1                             # same key: no new measurement
    M.matmul(a, b.swapaxes(-1, -2).copy().swapaxes(-1, -2))  # a transposed view: a new key
    assert len(M.timings()) == 2 and "blas-contiguous" in list(M.timings().values())[1]


def test_candidates_limit_the_choice_and_get_their_own_key(nondeterministic):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((2, 3, 16, 32)).astype(np.float32)
    b = rng.standard_normal((2, 3, 16, 32)).astype(np.float32).swapaxes(-1, -2)   # k^T view
    out = np.empty((2, 3, 16, 16), np.float32)
    M.matmul(a, b, out=out, candidates=M.THREAD_SAFE)
    np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-5)
    (key, times), = M.timings().items()
    assert set(times) == {"blas", "blas-contiguous"}         # no Numba-pool variant
    assert key.endswith(" safe") and M.choice(a, b, out, candidates=M.THREAD_SAFE) in times
    assert M.choice(a, b, out) is None                       # unrestricted: a separate decision
    M.matmul(a, b, out=out)
    assert len(M.timings()) == 2 and "numba" in list(M.timings().values())[1]
    with pytest.raises(ValueError, match="candidates"):
        M.matmul(a, b, candidates=("numba",))


def test_large_products_try_blas_and_the_blocked_kernel_once_per_size_bucket(nondeterministic):
    """Sizes from 256 up are rounded up to multiples of 256 in the key (one choice per bucket);
    smaller ones are exact (N < 32 and N >= 32 offer different variants)."""
    k = M.MEASURE_LIMIT // (4 * 64) + 1
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((4, k)), rng.standard_normal((k, 64))   # float64: exact enough
    for name in ("blas", "numba-blocked"):
        np.testing.assert_allclose(M.VARIANTS[name](a, b, None), a @ b, rtol=0, atol=1e-9)
    a, b = a.astype(np.float32), b.astype(np.float32)
    np.testing.assert_allclose(M.matmul(a, b), a.astype(np.float64) @ b, rtol=0, atol=2e-3)
    ((key, times),) = M.timings().items()
    assert set(times) == {"blas", "numba-blocked"} and key.split()[-1].startswith("L")
    assert M.choice(a, b) in times
    M.matmul(np.ones((300, k), np.float32), b)                # 300 rows: bucket 512, trials
    M.matmul(np.ones((400, k), np.float32), b)                # 400 rows: bucket 512, no trial
    assert len(M.timings()) == 2 and M.product_key(np.ones((400, k)), b).endswith("L512x16640x64")
    narrow = np.ones((2 * k, 31), np.float32)                 # N < 32: BLAS only, nothing timed
    np.testing.assert_array_equal(M.matmul(np.ones((8, 2 * k), np.float32), narrow),
                                  np.full((8, 31), 2 * k, np.float32))
    assert len(M.timings()) == 2


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_blocked_row_parts_give_the_same_bits_on_any_number_of_workers(dtype):
    """The blocked kernel computes each row of the result the same way whichever part holds it:
    1, 2, 3 or 16 workers give identical bits."""
    rng = np.random.default_rng(5)
    a = rng.standard_normal((301, 96)).astype(dtype)
    b = rng.standard_normal((72, 96)).astype(dtype).T                 # w.T, as a linear layer
    whole = M._numba_blocked(a, b, None)
    before = runtime.policy()
    try:
        for workers in (2, 3, 16):
            runtime._state["policy"] = runtime.thread_policy(workers, numba_max=1)
            np.testing.assert_array_equal(M._numba_blocked_parts(a, b, None), whole)
    finally:
        runtime._state["policy"] = before


@pytest.mark.parametrize("shape", [((700, 96), (96, 1500)), ((2000, 512), (512, 300)),
                                   ((256, 1920), (1920, 512)), ((64, 2048), (2048, 512))])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_large_products_give_the_same_bits_on_any_number_of_workers(shape, dtype):
    """A large product is divided into cells fixed by its shape, each computed by single-threaded
    BLAS: 1, 2, 3 or 16 workers share the cells and give the same bits, whatever the BLAS thread
    count outside npformer's scope. (On OpenBLAS's AVX-512 kernels, float64 products of the
    first two shapes round differently on 1, 2 or 3 BLAS threads: a thread count must never
    reach the numerics.)"""
    rng = np.random.default_rng(9)
    a, b = (rng.standard_normal(s).astype(dtype) for s in shape)
    rows, cols = M.product_grid(a.shape[0], a.shape[1], b.shape[1])
    assert rows[0] == cols[0] == 0 and rows[-1] == a.shape[0] and cols[-1] == b.shape[1]
    assert sorted(set(rows)) == rows and sorted(set(cols)) == cols      # increasing, no empty cell
    assert (len(rows) - 1) * (len(cols) - 1) <= M.MAX_PARTS
    before = runtime.policy()
    results = []
    try:
        for workers in (1, 2, 3, 16):
            runtime._state["policy"] = runtime.thread_policy(workers, numba_max=1)
            with runtime.blas_threads(workers):          # the scope inside sets BLAS to one thread
                results.append(M._run_main("blas", a, b, np.empty((a.shape[0], b.shape[1]), dtype)))
    finally:
        runtime._state["policy"] = before
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])
    np.testing.assert_allclose(results[0], a.astype(np.float64) @ b, rtol=0,
                               atol=TOL[dtype] * a.shape[1] * 4)


@pytest.mark.parametrize("variant,m", [(v, m) for v in ("blas", "numba-blocked", "numba")
                                       for m in (3, 700)] + [("numba-thin", 3)])
def test_a_bias_added_cell_by_cell_gives_the_bits_of_adding_it_afterwards(variant, m):
    """``matmul(..., bias=b)``: each cell of a large product gets its columns of the bias as
    soon as it is computed; the bits are those of the product plus the bias added afterwards,
    on any number of workers and by every variant."""
    rng = np.random.default_rng(11)
    a = rng.standard_normal((m, 96)).astype(np.float32)
    w = rng.standard_normal((1500, 96)).astype(np.float32)
    bias = rng.standard_normal(1500).astype(np.float32)
    expected = M._run_main(variant, a, w.T, np.empty((m, 1500), np.float32))
    expected += bias
    before = runtime.policy()
    try:
        for workers in (1, 2, 3):
            runtime._state["policy"] = runtime.thread_policy(workers, numba_max=1)
            got = M._run_main(variant, a, w.T, np.empty((m, 1500), np.float32), bias)
            np.testing.assert_array_equal(got, expected)
    finally:
        runtime._state["policy"] = before
    if m == 700 and variant == "blas":
        assert len(M.product_grid(700, 96, 1500)[1]) > 2               # several column cells
    np.testing.assert_array_equal(M.matmul(a, w.T, bias=bias),
                                  M.matmul(a, w.T) + bias)
    out = np.zeros((m, 1500), np.float32)
    out[0] = bias                                      # the bias is a row that out overwrites
    np.testing.assert_array_equal(M.matmul(a, w.T, out=out, bias=out[0]), M.matmul(a, w.T) + bias)
    with pytest.raises(ValueError, match=r"matmul: bias: expected an array of shape \(1500,\)"):
        M.matmul(a, w.T, bias=bias[:-1])


@pytest.mark.parametrize("a_shape,b_shape", [((2, 3), (4, 5)), ((2, 3, 4), (3, 4, 5)),
                                             ((2, 3, 4), (4, 5))])
def test_mismatched_operands_are_rejected(a_shape, b_shape):
    with pytest.raises(ValueError, match="matmul"):
        M.matmul(np.zeros(a_shape), np.zeros(b_shape))


def test_wrong_dtype_and_out_are_rejected():
    with pytest.raises(ValueError, match="float32 or both float64"):
        M.matmul(np.zeros((2, 3), np.float32), np.zeros((3, 4)))
    with pytest.raises(ValueError, match="out"):
        M.matmul(np.zeros((2, 3)), np.zeros((3, 4)), out=np.zeros((2, 5)))


@settings(deadline=None, max_examples=20)
@given(lead=st.sampled_from([(5,), (2, 3)]), d_in=st.integers(1, 12), d_out=st.integers(1, 12),
       bias=st.booleans(), dtype=st.sampled_from(list(TOL)), seed=st.integers(0, 2**16))
def test_linear_matches_reference_and_accumulates(lead, d_in, d_out, bias, dtype, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(lead + (d_in,)).astype(dtype)
    w = rng.standard_normal((d_out, d_in)).astype(dtype)
    b = rng.standard_normal(d_out).astype(dtype) if bias else None
    dy = rng.standard_normal(lead + (d_out,)).astype(dtype)
    y_ref, c_ref = F.linear_forward(x, w, b)
    y, c = K.linear_forward(x, w, b)
    np.testing.assert_allclose(y, y_ref, rtol=0, atol=TOL[dtype] * 10)
    dx_ref, dw_ref, db_ref = F.linear_backward(dy, c_ref)
    for got, ref in zip(K.linear_backward(dy, c), (dx_ref, dw_ref, db_ref)):
        np.testing.assert_allclose(got, ref, rtol=0, atol=TOL[dtype] * 10)
    dw_acc, db_acc = np.ones_like(w), np.ones(d_out, dtype)            # accumulate onto 1
    dx = K.linear_backward_accumulate(dy, c, dw_acc, db_acc if bias else None)
    np.testing.assert_allclose(dx, dx_ref, rtol=0, atol=TOL[dtype] * 10)
    np.testing.assert_allclose(dw_acc, 1 + dw_ref, rtol=0, atol=TOL[dtype] * 10)
    np.testing.assert_allclose(db_acc, 1 + db_ref if bias else 1, rtol=0, atol=TOL[dtype] * 10)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_products_in_one_region_give_the_bits_of_separate_products(dtype):
    """``matmuls``: the cells of several products (and other parts) shared by the workers in one
    region. Each result has the bits of its own ``matmul`` call, ``into`` gets exactly the sum
    of adding the product afterwards, whatever the number of workers; a product too small to be
    cut into cells and an empty one are computed as matmul computes them; every extra part runs
    once."""
    rng = np.random.default_rng(5)
    dy = rng.standard_normal((1900, 384)).astype(dtype)             # (N, D_out)
    w = rng.standard_normal((384, 128)).astype(dtype)               # (D_out, D_in)
    x = rng.standard_normal((1900, 128)).astype(dtype)              # (N, D_in)
    small_a, small_b = (rng.standard_normal(s).astype(dtype) for s in ((5, 7), (7, 3)))
    acc0 = rng.standard_normal((384, 128)).astype(dtype)
    assert len(M.product_grid(1900, 384, 128)[0]) > 2               # dX: several cells
    assert len(M.product_grid(384, 1900, 128)[0]) > 2                # dW: several cells
    dx_ref, dw_ref, small_ref = M.matmul(dy, w), M.matmul(dy.T, x), M.matmul(small_a, small_b)
    acc_ref = acc0.copy()
    acc_ref += dw_ref
    before = runtime.policy()
    try:
        for workers in (1, 2, 3):
            runtime._state["policy"] = runtime.thread_policy(workers, numba_max=1)
            acc, small_acc = acc0.copy(), np.ones((5, 3), dtype)
            ran = []
            dw_out = np.empty((384, 128), dtype)
            dx, dw, small, empty = M.matmuls(
                [(dy, w, None, None), (dy.T, x, dw_out, acc), (small_a, small_b, None, small_acc),
                 (np.zeros((4, 0), dtype), np.zeros((0, 2), dtype), None, None)],
                extra=[lambda: ran.append(1), lambda: ran.append(2)])
            np.testing.assert_array_equal(dx, dx_ref)
            assert dw is dw_out
            np.testing.assert_array_equal(dw, dw_ref)
            np.testing.assert_array_equal(acc, acc_ref)
            np.testing.assert_array_equal(small, small_ref)
            np.testing.assert_array_equal(small_acc, 1 + small_ref)
            np.testing.assert_array_equal(empty, np.zeros((4, 2), dtype))
            assert sorted(ran) == [1, 2]
    finally:
        runtime._state["policy"] = before


def test_linear_backward_in_one_region_keeps_the_bits_of_separate_products():
    """The linear backward computes dX, dW (added into the gradient) and db in one region: the
    same bits as the products one after the other and the sums added afterwards."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((16, 120, 128)).astype(np.float32)      # (B, T, D_in)
    w = rng.standard_normal((384, 128)).astype(np.float32)
    dy = rng.standard_normal((16, 120, 384)).astype(np.float32)
    _, cache = K.linear_forward(x, w)
    dw_acc, db_acc = np.ones_like(w), np.ones(384, np.float32)
    dx = K.linear_backward_accumulate(dy, cache, dw_acc, db_acc)
    dy2, x2 = dy.reshape(-1, 384), x.reshape(-1, 128)
    np.testing.assert_array_equal(dx, M.matmul(dy2, w).reshape(x.shape))
    expected_dw, expected_db = np.ones_like(w), np.ones(384, np.float32)
    expected_dw += M.matmul(dy2.T, x2, out=np.empty_like(w))
    expected_db += dy2.sum(axis=0)
    np.testing.assert_array_equal(dw_acc, expected_dw)
    np.testing.assert_array_equal(db_acc, expected_db)


def test_linear_accumulate_rejects_wrong_accumulators():
    _, cache = K.linear_forward(np.zeros((2, 3)), np.zeros((4, 3)))
    with pytest.raises(ValueError, match="dw_acc"):
        K.linear_backward_accumulate(np.zeros((2, 4)), cache, np.zeros((3, 4)))


def test_exp32_relative_error_is_about_two_ulp():
    from numba import njit

    @njit
    def run(x, out):
        for i in range(x.shape[0]):
            out[i] = exp32(x[i])
    x = np.concatenate([np.linspace(-87, 88, 200_001), [0.0, -1e-8, 1e-8]]).astype(np.float32)
    out = np.empty_like(x)
    run(x, out)
    exact = np.exp(x.astype(np.float64))
    assert np.max(np.abs(out - exact) / exact) < 2.5e-7                 # float32 eps: 1.19e-7
    assert out.dtype == np.float32 and out[-3] == 1.0


def test_empty_operands_give_numpys_answer():
    """K = 0 is a sum of nothing (zeros); M = 0 or a batch of 0 is an empty result. These used
    to reach the variants' timing and divide by zero."""
    M.reset()
    for a, b in [((3, 0), (0, 40)), ((0, 5), (5, 40)), ((0, 2, 3, 4), (0, 2, 4, 40)), ((2, 0), (0, 3))]:
        a, b = np.ones(a, np.float32), np.ones(b, np.float32)
        res = M.matmul(a, b)
        assert res.shape == (a @ b).shape and res.dtype == np.float32
        np.testing.assert_array_equal(res, a @ b)


def test_a_read_only_out_is_refused():
    out = np.broadcast_to(np.zeros(40), (3, 40))
    with pytest.raises(ValueError, match="out: expected a writeable"):
        M.matmul(np.ones((3, 5)), np.ones((5, 40)), out=out)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("m", [2, 5, 15])
def test_thin_products_of_a_linear_layer_run_the_thin_kernel(m, dtype):
    """A decoding step's x @ w.T (few rows): "numba-thin" by rule, equal to NumPy's product,
    into a fresh or a strided out."""
    rng = np.random.default_rng(m)
    x, w = rng.standard_normal((m, 40)).astype(dtype), rng.standard_normal((70, 40)).astype(dtype)
    names = M._offered(x, w.T, None)
    assert "numba-thin" in names and M.rule(names, {"avx512f": True, "blas_arch": "Zen"}) == "numba-thin"
    ref = x.astype(np.float64) @ w.T.astype(np.float64)
    np.testing.assert_allclose(M.VARIANTS["numba-thin"](x, w.T, None), ref, rtol=0,
                               atol=TOL[dtype] * 40 * 4)
    out = np.zeros((m, 140), dtype)[:, ::2]
    M.VARIANTS["numba-thin"](x, w.T, out)
    np.testing.assert_allclose(out, ref, rtol=0, atol=TOL[dtype] * 40 * 4)
    assert "numba-thin" not in M._offered(np.zeros((M.THIN_ROWS, 40), dtype), w.T, None)
    assert "numba-thin" not in M._offered(np.zeros((1, 40), dtype), w.T, None)     # BLAS's gemv
    big = np.zeros((4096, 1024), dtype)                # 15 x 1024 x 4096: BLAS's cells share it
    assert "numba-thin" not in M._offered(np.zeros((15, 1024), dtype), big.T, None)
    assert "numba-thin" not in M._offered(x, np.ascontiguousarray(w.T), None)      # not w.T
