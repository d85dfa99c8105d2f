"""The register-blocked per-head matmul kernel (``npformer.kernels.blocked_matmul``), its 16-lane
vector intrinsics, and how the matmul dispatcher offers it."""
import contextlib
import hashlib
import importlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npformer import runtime
from npformer.aligned import empty_aligned

B = importlib.import_module("npformer.kernels.blocked_matmul")
M = importlib.import_module("npformer.kernels.matmul")

TOL = {np.float32: 2e-6, np.float64: 1e-14}


def rows_view(rng, shape, dtype, layout):
    """A (..., R, C) array: contiguous (C), a transposed view (T), heads split out of a wider
    (..., R, 2C) buffer with unit stride along C (R, as q/k/v of attention), or every other
    column (S, no unit stride)."""
    if layout == "T":
        return rng.standard_normal(shape[:-2] + shape[-1:] + shape[-2:-1]).astype(dtype).swapaxes(-1, -2)
    if layout == "R":
        return rng.standard_normal(shape[:-1] + (2 * shape[-1],)).astype(dtype)[..., 3:3 + shape[-1]] \
            if shape[-1] > 3 else rng.standard_normal(shape).astype(dtype)
    if layout == "S":
        return rng.standard_normal(shape[:-1] + (2 * shape[-1],)).astype(dtype)[..., ::2]
    return rng.standard_normal(shape).astype(dtype)


@settings(deadline=None, max_examples=60)
@given(batch=st.sampled_from([(), (3,), (2, 3), (1, 5)]), m=st.integers(1, 21),
       k=st.integers(1, 21), n=st.integers(32, 80), la=st.sampled_from("CTS"),
       lb=st.sampled_from("CR"), lout=st.sampled_from("CR"),
       dtype=st.sampled_from(list(TOL)), seed=st.integers(0, 2**16))
def test_blocked_matmul_equals_numpy(batch, m, k, n, la, lb, lout, dtype, seed):
    """Every row and column block, including the clamped last ones (M not a multiple of 4,
    N not a multiple of 32, M < 4), in both dtypes and with strided operands."""
    rng = np.random.default_rng(seed)
    a, b = rows_view(rng, batch + (m, k), dtype, la), rows_view(rng, batch + (k, n), dtype, lb)
    out = rows_view(rng, batch + (m, n), dtype, lout)
    expected = np.matmul(a.astype(np.float64), b.astype(np.float64))
    scale = max(1.0, float(np.abs(expected).max())) * k
    assert B.blocked_matmul(a, b, out) is out
    np.testing.assert_allclose(out, expected, rtol=0, atol=TOL[dtype] * scale)
    res = B.blocked_matmul(a, b)
    assert res.dtype == dtype and res.shape == expected.shape
    np.testing.assert_allclose(res, expected, rtol=0, atol=TOL[dtype] * scale)


@settings(deadline=None, max_examples=60)
@given(m=st.integers(1, 40), k=st.integers(1, 40), n=st.sampled_from([32, 33, 64, 70, 96]),
       tile_rows=st.sampled_from([None, 4, 8, 12, 28]), k_chunk=st.sampled_from([1, 3, 16, 256]),
       accumulate_into=st.booleans(), dtype=st.sampled_from(list(TOL)), seed=st.integers(0, 2**16))
def test_blocked_matmul_tiles_and_chunks(m, k, n, tile_rows, k_chunk, accumulate_into, dtype, seed):
    """Large products walk a in tiles of rows (the last tile shorter, or under 4 rows) and sum K
    in chunks (where N is a multiple of 32): every entry of out is stored exactly once per chunk,
    whatever out held before."""
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal((m, k)).astype(dtype), rng.standard_normal((k, n)).astype(dtype)
    out = rng.standard_normal((m, n)).astype(dtype) if accumulate_into else None
    expected = a.astype(np.float64) @ b.astype(np.float64)
    res = B.blocked_matmul(a, b, out, tile_rows=tile_rows, k_chunk=k_chunk)
    np.testing.assert_allclose(res, expected, rtol=0,
                               atol=TOL[dtype] * max(1.0, float(np.abs(expected).max())) * k)


def test_blocked_matmul_writes_only_its_output():
    """The clamped edge blocks rewrite entries inside out; nothing around out changes."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, 7, 5)), rng.standard_normal((2, 5, 45))
    buf = np.full((2, 9, 60), 7.0)
    out = buf[:, 1:8, 4:49]                                  # (2, 7, 45), unit-stride rows
    B.blocked_matmul(a, b, out)
    np.testing.assert_allclose(out, a @ b, rtol=0, atol=1e-13)
    untouched = np.ones(buf.shape, bool)
    untouched[:, 1:8, 4:49] = False
    assert np.all(buf[untouched] == 7.0)


@pytest.mark.parametrize("case, names", [
    (lambda z: (z((3, 4)), z((4, 31)), None), "b: expected N >= 32"),
    (lambda z: (z((3, 4)), z((4, 64))[:, ::2], None), "b: expected rows with unit stride"),
    (lambda z: (z((3, 4)), z((4, 32)).astype(np.float32), None), "expected a and b both float32 or both float64"),
    (lambda z: (z((2, 2, 2, 3, 4)), z((2, 2, 2, 4, 32)), None), "at most two batch axes"),
    (lambda z: (z((3, 5)), z((4, 32)), None), "with the same batch shape"),                       # K mismatch
    (lambda z: (z((1, 3, 4)), z((2, 4, 32)), None), "with the same batch shape"),
    (lambda z: (z((3, 4)), z((4, 32)), z((2, 32))), "out: expected a writeable float64 array of shape (3, 32)"),
    (lambda z: (z((3, 4)), z((4, 32)), z((3, 32)).astype(np.float32)), "out: expected a writeable float64"),
    (lambda z: (z((3, 4)), z((4, 32)), z((3, 64))[:, ::2]), "out: expected rows with unit stride"),
    (lambda z: (z((3, 4)), z((4, 32)), np.broadcast_to(z((32,)), (3, 32))), "writeable=False"),
])
def test_blocked_matmul_refuses_what_it_cannot_do(case, names):
    """Nothing reaches the kernel (which has no bounds checks) unless every shape fits; the
    error names the argument and what was expected."""
    a, b, out = case(np.ones)
    assert not B.applies(a, b, out)
    with pytest.raises(ValueError, match="blocked_matmul: ") as err:
        B.blocked_matmul(a, b, out)
    assert names in str(err.value)


def test_blocked_matmul_refuses_an_out_that_overlaps_its_inputs():
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((64, 64)), rng.standard_normal((64, 64))
    assert not B.applies(a, b, out=a) and not B.applies(a, b, out=b)
    with pytest.raises(ValueError, match="overlapping"):
        B.blocked_matmul(a, b, out=b)


def test_blocked_matmul_of_empty_operands():
    for a, b in [(np.ones((3, 0)), np.ones((0, 40))), (np.ones((0, 5)), np.ones((5, 40))),
                 (np.ones((0, 2, 3, 4)), np.ones((0, 2, 4, 40)))]:
        np.testing.assert_array_equal(B.blocked_matmul(a, b), a @ b)


@pytest.mark.parametrize("name", sorted(M.VARIANTS))
@pytest.mark.parametrize("alias", ["none", "a", "b"])
def test_every_candidate_on_shapes_the_blocked_kernel_takes(dispatcher_prefers, name, alias):
    """Random data where the blocked kernel and its row parts apply (odd M, N not a multiple of
    32, b a transposed view, out strided), through the dispatcher forced onto each variant;
    out may be a or b itself, which the dispatcher must not write while it still reads them."""
    dispatcher_prefers(name)
    rng = np.random.default_rng(6)
    a = rng.standard_normal((45 if alias == "b" else 67, 45))
    b = rng.standard_normal((50, 45)).T if alias == "none" else rng.standard_normal((45, 45))
    expected = a @ b
    out = {"none": np.empty((b.shape[1], 67)).T, "a": a, "b": b}[alias]
    assert M.matmul(a, b, out=out) is out
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-12)
    if alias == "none":          # a variant the shape does not take ("numba-thin": 67 rows) -> BLAS
        taken = name if name in M._offered(a, b, None) else "blas"
        assert list(runtime.choices().values()) == [taken]


def test_dispatcher_offers_the_blocked_kernel_where_it_applies(nondeterministic):
    rng = np.random.default_rng(1)
    probs, v = rng.random((4, 2, 16, 16)), rng.standard_normal((4, 2, 16, 32))
    np.testing.assert_allclose(M.matmul(probs, v, candidates=M.THREAD_SAFE), probs @ v,
                               rtol=0, atol=1e-13)
    (times,) = M.timings().values()
    assert set(times) == {"blas", "numba-blocked"}
    narrow = rng.standard_normal((4, 2, 16, 8))                # N < 32: not offered
    M.matmul(probs, narrow)
    assert "numba-blocked" not in list(M.timings().values())[1]
    M.reset()


def test_dispatcher_results_are_aligned_for_the_products_that_read_them():
    rng = np.random.default_rng(2)
    for a, b in [(rng.random((3, 5)), rng.random((5, 40))), (rng.random((2, 4, 6)), rng.random((2, 6, 3)))]:
        out = M.matmul(a, b)
        assert out.ctypes.data % 64 == 0
        np.testing.assert_allclose(out, a @ b, rtol=0, atol=1e-13)


@pytest.mark.parametrize("src", [
    lambda r: r.standard_normal((37, 53)).T,                          # a transposed weight: tiles
    lambda r: r.standard_normal((16, 16)).T,                          # exactly one tile
    lambda r: r.standard_normal((5, 40)),                             # rows already contiguous
    lambda r: r.standard_normal((2, 3, 9, 7)).swapaxes(-1, -2),       # batched: NumPy's copy
    lambda r: r.standard_normal((1, 33)).T,                           # a single column
])
def test_copy_rows_copies_every_element(src):
    T = importlib.import_module("npformer.kernels.transpose")
    x = src(np.random.default_rng(4)).astype(np.float32)
    dst = empty_aligned(x.shape, x.dtype, aligned_rows=True)
    assert T.copy_rows(x, dst) is dst
    np.testing.assert_array_equal(dst, x)
    with pytest.raises(ValueError, match="copy_rows"):
        T.copy_rows(x, np.empty(x.shape[::-1] + (2,), x.dtype))


@pytest.mark.parametrize("shape", [(40, 40), (700, 700)])          # small; large (cells, trials)
@pytest.mark.parametrize("alias", ["a", "b"])
def test_an_out_that_is_an_input_gets_the_product_on_a_first_call(nondeterministic, shape, alias):
    """In non-deterministic mode the first call for a shape times every variant, each writing
    into out: with out = a or b, the inputs would change under the trials (and the row parts
    would write part of b while another thread still reads it). The dispatcher computes into a
    temporary."""
    rng = np.random.default_rng(8)
    a, b = rng.standard_normal(shape), rng.standard_normal(shape)
    expected = a @ b
    out = a if alias == "a" else b
    assert M.matmul(a, b, out=out) is out
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-10)


@contextlib.contextmanager
def _workers(n):
    """npformer's runtime on ``n`` worker threads (one Numba thread) inside the block."""
    before = runtime.policy()
    runtime._state["policy"] = runtime.thread_policy(n, numba_max=1)
    try:
        yield
    finally:
        runtime._state["policy"] = before


def _cuts(draw, total):
    """Sorted distinct bounds 0 < ... < total cutting range(total) (hypothesis)."""
    inner = draw(st.lists(st.integers(1, max(1, total - 1)), max_size=4, unique=True))
    return [0] + sorted(c for c in inner if 0 < c < total) + [total]


@settings(deadline=None, max_examples=40)
@given(m=st.integers(1, 150), k=st.sampled_from([1, 7, 64, 255, 256, 257, 600]),
       n=st.integers(32, 200), la=st.sampled_from("CTS"), lb=st.sampled_from("CTR"),
       dtype=st.sampled_from(list(TOL)), pack=st.booleans(), data=st.data())
def test_any_cells_give_the_bits_of_the_blocked_kernel(m, k, n, la, lb, dtype, pack, data):
    """``run_cell`` over any cutting of the rows and the 32-column panels (bounds anywhere, not
    only those ``blocked_grid`` picks) gives every element the bits of ``run_blocked`` on b's
    aligned copy, the scheme before cells: the same chunks of K, the same operations. K around
    ``K_CHUNK``, N a multiple of 32 or not, a transposed or strided, b = w.T; a transposed a
    read in place or packed tile by tile (``pack``: as if every stride were ``ALIAS_BYTES``')."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    a, b = rows_view(rng, (m, k), dtype, la), rows_view(rng, (k, n), dtype, lb)
    expected = B.run_blocked(a, M._aligned_rows(b), empty_aligned((m, n), dtype))
    out = rows_view(rng, (m, n), dtype, "R")                       # rows of a wider array
    rows, panels = _cuts(data.draw, m), _cuts(data.draw, B.panels(n))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(B, "ALIAS_BYTES", np.dtype(dtype).itemsize if pack else B.ALIAS_BYTES)
        for r0, r1 in zip(rows, rows[1:]):
            for p0, p1 in zip(panels, panels[1:]):
                B.run_cell(a, b, out, (r0, r1), (p0, p1))
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("b_rows", ["C", "R", "reversed"])
@pytest.mark.parametrize("cuts", [([0, 150], [0, 3]), ([0, 52, 150], [0, 1, 3])],
                         ids=["one cell", "cells of 1 and 2 panels"])
def test_cells_pack_their_operands_without_changing_a_bit(b_rows, cuts):
    """How a cell packs its operands changes no bit. b's panels are copied a vector at a time
    where b's rows have unit stride: rows of a C array, rows starting off a cache line (R), rows
    in reverse order (a negative row stride). A transposed a whose steps lie 1 KiB apart (dY.T,
    dY 256 wide) is packed during each tile's first panel and read back by the others: 150 rows
    are three tiles, K = 600 three chunks, a cell of one panel packs and reads nothing back."""
    rng = np.random.default_rng(5)
    m, k, n = 150, 600, 96
    a = rng.standard_normal((k, 256)).astype(np.float32)[:, :m].T
    b = rows_view(rng, (k, n), np.float32, "C" if b_rows == "reversed" else b_rows)
    if b_rows == "reversed":
        b = b[::-1]
    assert a.strides[1] % B.ALIAS_BYTES == 0 and b.strides[1] == b.itemsize
    expected = B.run_blocked(a, M._aligned_rows(b), empty_aligned((m, n), np.float32))
    out = empty_aligned((m, n), np.float32)
    rows, panel_bounds = cuts
    for r0, r1 in zip(rows, rows[1:]):
        for p0, p1 in zip(panel_bounds, panel_bounds[1:]):
            B.run_cell(a, b, out, (r0, r1), (p0, p1))
    np.testing.assert_array_equal(out, expected)


def test_a_cell_packs_a_only_where_a_panel_reads_the_packed_tile_back(monkeypatch):
    """An aliased dY.T is packed for the cell's second and later panels: a cell of one panel
    (as many workers cut a 192-wide weight gradient) allocates and fills no packed tile; a
    cell of two does. Both give the bits of the scheme before cells."""
    rng = np.random.default_rng(6)
    a = rng.standard_normal((300, 256)).astype(np.float32)[:, :40].T      # steps 1 KiB apart
    b = rng.standard_normal((300, 64)).astype(np.float32)
    expected = B.run_blocked(a, b, empty_aligned((40, 64), np.float32))
    shapes = []
    allocate = B.empty_aligned
    monkeypatch.setattr(B, "empty_aligned", lambda shape, *args, **kw: (
        shapes.append(shape), allocate(shape, *args, **kw))[1])
    out = empty_aligned((40, 64), np.float32)
    B.run_cell(a, b, out, (0, 40), (0, 1))
    B.run_cell(a, b, out, (0, 40), (1, 2))
    assert all(shape[-1] == B.BLOCK_COLS for shape in shapes)            # b's panels only
    np.testing.assert_array_equal(out, expected)
    B.run_cell(a, b, out, (0, 40), (0, 2))
    assert any(shape[-1] == B.BLOCK_ROWS for shape in shapes)
    np.testing.assert_array_equal(out, expected)


@settings(deadline=None, max_examples=200)
@given(m=st.integers(1, 5000), k=st.integers(1, 5000), n=st.integers(32, 5000),
       workers=st.integers(1, 64))
def test_blocked_grid_cuts_the_product_into_cells_for_the_workers(m, k, n, workers):
    """At most one cell per worker and per ``PART_MACS``; row bounds on whole blocks of 4 rows,
    each cell 4 rows or more (unless M < 4); where N is not a multiple of 32 the moved-back
    last panel shares its cell with the panel it overlaps."""
    rows, panels = M.blocked_grid(m, k, n, workers)
    assert rows[0] == 0 and rows[-1] == m and panels[0] == 0 and panels[-1] == B.panels(n)
    assert all(r % B.BLOCK_ROWS == 0 for r in rows[:-1])
    assert all(r1 - r0 >= min(m, B.BLOCK_ROWS) for r0, r1 in zip(rows, rows[1:]))
    assert all(p1 > p0 for p0, p1 in zip(panels, panels[1:]))
    cells = (len(rows) - 1) * (len(panels) - 1)
    assert cells <= max(1, min(workers, m * k * n // M.PART_MACS))
    if n % B.BLOCK_COLS and B.panels(n) > 1:
        assert panels[-1] - panels[-2] >= 2


def test_few_rows_and_many_columns_share_the_workers(monkeypatch):
    """A weight gradient of few rows (dW = dY^T X of a 192-wide layer, K = 8192 tokens) is
    cut along its columns: both workers compute, and the bits are one worker's. (The row parts
    before cells gave a product of fewer than 64 rows to one worker.)"""
    rng = np.random.default_rng(3)
    a = rng.standard_normal((4096, 40)).astype(np.float32).T            # dY^T: 40 rows
    b = rng.standard_normal((4096, 512)).astype(np.float32)
    with _workers(1):
        alone = M._run_main("numba-blocked", a, b, None)
    handed = []
    run_parts = runtime.run_parts
    monkeypatch.setattr(runtime, "run_parts",
                        lambda fn, parts, *args: (handed.append(len(parts)), run_parts(fn, parts, *args))[1])
    with _workers(2):
        np.testing.assert_array_equal(M._run_main("numba-blocked", a, b, None), alone)
    assert handed == [2]


def test_a_transposed_weight_is_packed_by_the_cells_not_copied_first(monkeypatch):
    """x @ w.T of a linear layer: the cells read w.T's panels straight into their packed
    buffers; no copy of the whole weight is made beforehand (one pass over w fewer per call)."""
    rng = np.random.default_rng(4)
    x, w = rng.standard_normal((300, 96)).astype(np.float32), rng.standard_normal((200, 96)).astype(np.float32)
    expected = B.run_blocked(x, M._aligned_rows(w.T), empty_aligned((300, 200), np.float32))
    monkeypatch.setattr(M, "copy_rows", lambda *args: pytest.fail("w.T copied before the product"))
    with _workers(2):
        np.testing.assert_array_equal(M._run_main("numba-blocked", x, w.T, None), expected)


# The llama-char step's products (64 x 128 tokens, d_model 192, 6 heads over 2 key/value heads,
# SwiGLU of 512, vocabulary 65): forward x @ w.T, backward dX = dY @ w and dW = dY^T @ x, and
# attention's per-head products; two float64 ones. The digests are those of the code before the
# cells (commit 3e031ce), on 1 and 2 workers alike: runs recorded by it resume bit for bit.
LLAMA_CHAR_PRODUCTS = [
    ("qkv", (8192, 192), "C", (192, 320), "T", "float32", "e57fd5f2bf4b7ffa"),
    ("attention output", (8192, 192), "C", (192, 192), "T", "float32", "10294ff7f03ab6c2"),
    ("gate and up", (8192, 192), "C", (192, 1024), "T", "float32", "92315f6d0750917c"),
    ("down", (8192, 512), "C", (512, 192), "T", "float32", "d362222c1338d9a6"),
    ("head", (8192, 192), "C", (192, 65), "T", "float32", "939da426e60e8074"),
    ("dX of gate and up", (8192, 1024), "C", (1024, 192), "C", "float32", "ab9ca1653a9f74dd"),
    ("dX of down", (8192, 192), "C", (192, 512), "C", "float32", "365f2cbd424e8165"),
    ("dX of head", (8192, 65), "C", (65, 192), "C", "float32", "923a60ae3f2d93c5"),
    ("dW of gate and up", (1024, 8192), "T", (8192, 192), "C", "float32", "3aee791297f693bc"),
    ("dW of down", (192, 8192), "T", (8192, 512), "C", "float32", "1d93b78cb4ab0a25"),
    ("dW of qkv", (320, 8192), "T", (8192, 192), "C", "float32", "ab10ec2f1686f3d0"),
    ("dW of head", (65, 8192), "T", (8192, 192), "C", "float32", "f4eb2e2933b92673"),
    ("q k^T per head", (8, 6, 128, 32), "C", (8, 6, 32, 128), "T", "float32", "3a88f97fdc315500"),
    ("P v per head", (8, 6, 128, 128), "C", (8, 6, 128, 32), "C", "float32", "634163f254c19acd"),
    ("float64 dW", (200, 700), "T", (700, 96), "C", "float64", "22da0506c70a68d3"),
    ("float64 odd", (301, 300), "C", (300, 70), "T", "float64", "818890e22687775b"),
]


def llama_char_operands(label, a_shape, a_layout, b_shape, b_layout, dtype):
    """The operands of one of ``LLAMA_CHAR_PRODUCTS``: normal numbers seeded by the label, "T" a
    transposed view of a C-contiguous array."""
    rng = np.random.default_rng(sum(map(ord, label)))

    def make(shape, layout):
        if layout == "T":
            return rng.standard_normal(shape[:-2] + shape[::-1][:2]).astype(dtype).swapaxes(-1, -2)
        return rng.standard_normal(shape).astype(dtype)
    return make(a_shape, a_layout), make(b_shape, b_layout)


@pytest.mark.parametrize("spec", LLAMA_CHAR_PRODUCTS, ids=[s[0] for s in LLAMA_CHAR_PRODUCTS])
def test_llama_char_products_keep_the_bits_of_the_scheme_before_cells(spec):
    """The blocked kernel's products of the llama-char step give, on 1 and 2 workers, the very
    bits the code before the cells gave (digests of the results)."""
    *operands, digest = spec
    a, b = llama_char_operands(*operands)
    for workers in (1, 2):
        with _workers(workers):
            out = M._run_main("numba-blocked", a, b, None)
        assert hashlib.sha256(np.ascontiguousarray(out).tobytes()).hexdigest()[:16] == digest
