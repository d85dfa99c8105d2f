"""The gradient checker itself must fail loudly: a wrong, missing or NaN gradient is a failure,
``bool(result)`` is ``result.ok``, and only integer/boolean inputs or those listed in ``nondiff``
may go without a gradient."""
import numpy as np
import pytest

import npformer as nf
from npformer.gradcheck_suite import CheckRow, format_table


@pytest.fixture
def x():
    return np.random.default_rng(0).standard_normal((3, 4))


def square(backward_factor):
    def f(x):
        return x ** 2, lambda d: backward_factor * x * d
    return f


def test_correct_gradient_passes_and_is_truthy(x):
    result = nf.gradcheck(square(2.0), [x])
    assert result.ok and bool(result)
    assert "PASS" in str(result)


def test_wrong_gradient_fails_an_assertion(x):
    """The issue's case: x**2 with backward 3*x*d. `assert nf.gradcheck(...)` must fail."""
    result = nf.gradcheck(square(3.0), [x])
    assert not result.ok and not bool(result)
    with pytest.raises(AssertionError):
        assert nf.gradcheck(square(3.0), [x])
    assert "FAIL" in str(result)


def test_raise_on_failure_raises_with_the_report(x):
    with pytest.raises(AssertionError, match="gradcheck FAIL"):
        nf.gradcheck(square(3.0), [x], raise_on_failure=True)
    nf.gradcheck(square(2.0), [x], raise_on_failure=True)        # a pass does not raise


def test_none_for_a_differentiable_float_input_fails(x):
    """The output depends on both inputs; a backward that 'forgets' w's gradient must fail."""
    def f(x, w):
        return x * w, lambda d: (w * d, None)
    result = nf.gradcheck(f, [x, x.copy() + 1.0], names=["x", "w"])
    assert not result.ok and result.missing == [1]
    assert result.inputs[1].status == "MISSING" and "MISSING" in str(result)


def test_nondiff_float_input_may_go_without_gradient(x):
    mask = (x > 0).astype(np.float64)                  # a float mask: not differentiated
    def f(x, m):
        return x * m, lambda d: (m * d, None)
    assert nf.gradcheck(f, [x, mask], nondiff=(1,)).ok
    assert not nf.gradcheck(f, [x, mask]).ok


def test_integer_and_boolean_inputs_are_non_differentiable_automatically(x):
    ids, keep = np.array([0, 2]), np.array([True, False, True, True])
    def f(x, ids, keep):
        out = x[ids] * keep
        def backward(d):
            dx = np.zeros_like(x)
            np.add.at(dx, ids, d * keep)
            return dx, None, None
        return out, backward
    result = nf.gradcheck(f, [x, ids, keep])
    assert result.ok and result.errors[1] is None and result.errors[2] is None


def test_nan_gradient_fails(x):
    def f(x):
        return x ** 2, lambda d: np.full_like(x, np.nan)
    result = nf.gradcheck(f, [x])
    assert not result.ok and np.isnan(result.max_error)


@pytest.mark.parametrize("nondiff", [(1,), (-1,), ("0",), (0.0,), (True,), 3])
def test_bad_nondiff_is_named(x, nondiff):
    with pytest.raises(ValueError, match=r"nondiff expected indices of inputs in \[0, 1\)"):
        nf.gradcheck(square(2.0), [x], nondiff=nondiff)


def test_names_must_match_inputs(x):
    with pytest.raises(ValueError, match=r"names: expected one string per input \(1\)"):
        nf.gradcheck(square(2.0), [x], names=["a", "b"])


def test_table_names_a_missing_gradient(x):
    def f(x, w):
        return x * w, lambda d: (w * d, None)
    rows = [CheckRow("forgetful", nf.gradcheck(f, [x, x + 1.0], names=["x", "w"]), 0.0)]
    table = format_table(rows)
    assert "no gradient: w" in table and "FAIL" in table and "0/1 passed" in table



@pytest.mark.parametrize("status", ["ill-conditioned", "not judged", "not differentiable"])
def test_table_shows_every_status_in_full(x, status):
    """The table cut its status column at 9 characters ("ill-condi", "not judge")."""
    result = nf.gradcheck(square(2.0), [x])
    result.inputs[0].status = status
    table = format_table([CheckRow("long status", result, 0.0)])
    assert f" {status} " in table, table


def test_the_header_says_the_step_was_widened_only_when_it_shows():
    """A step widened by less than 2x printed as "eps 1e-06, widened to 1e-06" (:.0e)."""
    def big(x):                                # sum |out * dout| = 731: the step grows ~1.3x
        return x, lambda d: d
    widened = nf.gradcheck(big, [np.full((1, 1), 731.0)], dout=np.ones((1, 1)))
    assert 1.2e-6 < widened.step < 1.4e-6
    assert "eps 1e-06, widened to 1.3e-06 above" in str(widened), widened
    assert "widened" not in str(nf.gradcheck(big, [np.ones((1, 1))], dout=np.ones((1, 1))))

# -- the verdict: right on correct code ------------------------------------------------------

def layernorm_pair(x, gamma, beta):
    out, cache = nf.functional.layernorm_forward(x, gamma, beta)
    return out, lambda dout: nf.functional.layernorm_backward(dout, cache)


@pytest.mark.parametrize("seed", range(5))
def test_the_readme_example_passes_for_every_seed(seed):
    """The README's example drew its inputs from default_rng(s) and the checker's probe from the
    same state, so dout == x, the true dx was ~0 and a ratio to that scale FAILED a correct
    LayerNorm. The probe now comes from a stream spawned from the seed."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((4, 8))
    result = nf.gradcheck(layernorm_pair, [x, np.ones(8), np.zeros(8)], seed=seed)
    assert result.ok, result
    assert "PASS" in str(result) and result.inputs[0].status == "exact"
    assert not np.allclose(np.random.default_rng(np.random.SeedSequence(seed).spawn(3)[0])
                           .standard_normal((4, 8)), x)


def test_a_probe_equal_to_the_input_still_passes():
    """dout = x exactly (the old failure, forced): LayerNorm's dx is then ~1e-5 everywhere, and an
    entry-wise tolerance with an absolute floor passes it."""
    x = np.random.default_rng(0).standard_normal((4, 8))
    result = nf.gradcheck(layernorm_pair, [x, np.ones(8), np.zeros(8)], dout=x.copy())
    assert result.ok, result
    assert result.probe == "given"
    assert np.abs(result.inputs[0].analytic) < 1e-3               # the near-zero gradient


def test_exactly_zero_gradients_pass():
    """The key bias's gradient is exactly 0 in theory and round-off in practice."""
    def f(x):
        return np.full((2, 3), x.sum() * 0.0) + 1.0, lambda d: np.zeros_like(x)
    assert nf.gradcheck(f, [np.ones((2, 2))]).ok


def test_a_given_probe_is_checked():
    x = np.random.default_rng(0).standard_normal((3, 4))
    with pytest.raises(ValueError, match=r"dout: expected a float array of the output's shape \(3, 4\)"):
        nf.gradcheck(square(2.0), [x], dout=np.ones((4, 3)))
    with pytest.raises(ValueError, match="dout: expected finite values"):
        nf.gradcheck(square(2.0), [x], dout=np.full((3, 4), np.nan))


# -- the report ------------------------------------------------------------------------------

def test_the_report_points_at_the_wrong_entry(x):
    """One entry's gradient off by 1e-3: the report names the input, that entry's index, both
    values and both errors, and says WRONG; the other inputs stay exact."""
    def f(x, w):
        def backward(d):
            dx = w * d
            dx[1, 2] += 1e-3
            return dx, x * d
        return x * w, backward
    w = np.random.default_rng(1).standard_normal((3, 4))
    result = nf.gradcheck(f, [x, w], names=["x", "w"])
    assert not result.ok
    bad, good = result.inputs
    assert (bad.name, bad.status, bad.index) == ("x", "WRONG", (1, 2))
    assert bad.analytic - bad.numeric == pytest.approx(1e-3, rel=1e-4)
    assert bad.abs_error == pytest.approx(1e-3, rel=1e-4)
    assert bad.rel_error == pytest.approx(1e-3 / abs(bad.numeric), rel=1e-4)
    assert good.status == "exact"
    assert result.worst is bad
    report = str(result)
    assert "WRONG" in report and "(1, 2)" in report and "exact" in report


def test_status_close_between_exact_and_wrong(x):
    """An error of 10% of the tolerance: close, which passes."""
    def f(x):
        return x ** 2, lambda d: 2 * x * d + 0.1 * nf.gradcheck.__globals__["ATOL"]
    result = nf.gradcheck(f, [x])
    assert result.ok and result.inputs[0].status == "close"


def test_status_words_for_integer_nondiff_and_missing(x):
    def f(x, ids, m, w):
        return x * m * w * (ids.sum() > 0), lambda d: (m * w * d, None, None, None)
    result = nf.gradcheck(f, [x, np.arange(12).reshape(3, 4), np.ones((3, 4)), x + 2.0],
                          nondiff=(2,), names=["x", "ids", "mask", "w"])
    assert [r.status for r in result.inputs] == ["exact", "not differentiable",
                                                 "not differentiable", "MISSING"]
    assert not result.ok and result.missing == [3]


def test_a_kink_is_not_judged():
    """ReLU at an input of exactly 0 has no derivative: the central difference straddles the kink
    at every step, so no value could pass; the entry is reported at a kink, not WRONG. An input
    within the step of the kink (3e-7 < eps) is judged again with a finer step, and passes."""
    x = np.array([[0.5, -1.0, 3e-7, 0.0, 2.0]])

    def relu(x):
        out, cache = nf.functional.relu_forward(x)
        return out, lambda d: nf.functional.relu_backward(d, cache)
    result = nf.gradcheck(relu, [x])
    assert result.ok, result
    assert result.inputs[0].kinks == 1 and "at a kink" in str(result)
    fast = nf.gradcheck(relu, [np.array([[0.0, 0.0, 1.0, 0.0, -2.0]])], fast=True)
    assert fast.ok, fast                           # directions across several kinks at once

    def wrong_relu(x):                            # a real bug next to the kink is still seen
        out, cache = nf.functional.relu_forward(x)
        return out, lambda d: nf.functional.relu_backward(d, cache) * 1.5
    assert not nf.gradcheck(wrong_relu, [x]).ok


def test_a_smooth_wrong_gradient_is_never_excused_as_a_kink():
    """A large curvature is not a kink: the one-sided differences agree with the central one."""
    def f(x):
        return np.exp(3 * x), lambda d: 3 * np.exp(3 * x) * d * 1.001
    result = nf.gradcheck(f, [np.linspace(-1, 2, 12).reshape(3, 4)])
    assert not result.ok and result.inputs[0].kinks == 0


# -- the fast mode ---------------------------------------------------------------------------

def test_fast_mode_passes_right_and_fails_wrong(x):
    assert nf.gradcheck(square(2.0), [x], fast=True).ok
    result = nf.gradcheck(square(2.0001), [x], fast=True)
    assert not result.ok and result.inputs[0].status == "WRONG"
    assert result.inputs[0].checked == 3 and "fast mode" in str(result)


def test_fast_mode_costs_two_forwards_a_direction_whatever_the_size():
    calls = []

    def f(x):
        calls.append(1)
        return x ** 2, lambda d: 2 * x * d
    big = np.random.default_rng(0).standard_normal((50, 40))
    nf.gradcheck(f, [big], fast=True, n_directions=3)
    # the first call, two determinism checks (after the backward ran, after the last
    # difference) and two calls per direction
    assert len(calls) == 1 + 2 + 2 * 3


def test_fast_mode_catches_a_single_wrong_entry_of_a_large_input():
    """One entry of 2000 off by 0.05: each random direction misses it with probability about
    0.8 (sqrt(N) atol + rtol |g|) / 0.05, a few percent, so three miss with ~1e-5; the seeds
    here are fixed, so the test is deterministic."""
    big = np.random.default_rng(0).standard_normal((50, 40))

    def f(x):
        def backward(d):
            g = 2 * x * d
            g[17, 3] += 0.05
            return g
        return x ** 2, backward
    for seed in range(5):
        assert not nf.gradcheck(f, [big.copy()], fast=True, seed=seed).ok


# -- a check that checked nothing must never pass -------------------------------------------

def identity(x):
    return x * 1.0, lambda d: d


@pytest.mark.parametrize("inputs,message", [
    ([[1.0, 2.0]], r"inputs\[0\]: expected a NumPy array, got list"),
    ([None], r"inputs\[0\]: expected a NumPy array, got NoneType"),
    ([np.zeros((0, 3))], r"inputs\[0\]: expected a non-empty array, got shape \(0, 3\)"),
    (np.ones(3), r"inputs: expected a list of NumPy arrays.*wrap a single array as \[x\]"),
    ([], "inputs: expected at least one array"),
    ([np.array([1.0, np.nan])], r"inputs\[0\]: expected finite values"),
    ([np.array([1 + 2j])], r"inputs\[0\]: expected float64, integer or boolean, got complex128"),
    ([np.ones(3, dtype=np.float32)], r"inputs\[0\]: expected float64"),
])
def test_bad_inputs_are_refused_by_name(inputs, message):
    with pytest.raises(ValueError, match=message):
        nf.gradcheck(identity, inputs)


def test_a_read_only_input_is_refused():
    x = np.ones(3)
    x.flags.writeable = False
    with pytest.raises(ValueError, match=r"inputs\[0\]: expected a writeable array"):
        nf.gradcheck(identity, [x])


def test_overlapping_inputs_are_refused(x):
    def f(a, b):
        return a * b, lambda d: (b * d, a * d)
    with pytest.raises(ValueError, match=r"inputs\[0\] and inputs\[1\]: share memory"):
        nf.gradcheck(f, [x, x])
    with pytest.raises(ValueError, match="share memory"):
        nf.gradcheck(f, [x[:2], x[1:]])
    assert nf.gradcheck(f, [x, x.copy()]).ok


@pytest.mark.parametrize("kwargs,message", [
    (dict(eps=0), "eps: expected a positive finite number, got 0"),
    (dict(eps=float("nan")), "eps: expected a positive finite number"),
    (dict(eps=-1e-6), "eps: expected a positive finite number"),
    (dict(atol=0.0), "atol: expected a positive finite number"),
    (dict(rtol=float("inf")), "rtol: expected a positive finite number"),
    (dict(atol="1e-6"), "atol: expected a positive finite number"),
    (dict(max_entries=0), "max_entries: expected a positive integer, got 0"),
    (dict(max_entries=2.5), "max_entries: expected a positive integer"),
    (dict(max_entries=True), "max_entries: expected a positive integer"),
    (dict(n_directions=0), "n_directions: expected a positive integer"),
    (dict(seed=-1), "seed: expected a non-negative integer"),
    (dict(fast="yes"), "fast: expected True or False"),
    (dict(tol=1e-6), "tol: gradcheck's single relative tolerance is gone"),
])
def test_bad_settings_are_refused_by_name(x, kwargs, message):
    """max_entries=0 used to check nothing and pass a wrong gradient; eps=0 divided by zero."""
    with pytest.raises(ValueError, match=message):
        nf.gradcheck(square(3.0), [x], **kwargs)


def test_a_backward_with_the_wrong_count_shape_or_dtype_is_refused(x):
    with pytest.raises(ValueError, match="backward: returned 2 gradients for 1 inputs"):
        nf.gradcheck(lambda x: (x * 1.0, lambda d: (d, d)), [x])
    with pytest.raises(ValueError, match=r"the gradient of input0 has shape \(4, 3\); expected "
                                         r"its input's shape \(3, 4\)"):
        nf.gradcheck(lambda x: (x * 1.0, lambda d: d.T), [x])
    with pytest.raises(ValueError, match="the gradient of input0 is int64; expected a floating"):
        nf.gradcheck(lambda x: (x * 1.0, lambda d: np.ones(x.shape, dtype=np.int64)), [x])


def test_nan_or_integer_output_is_refused(x):
    with pytest.raises(ValueError, match="fn: its output holds NaN or inf"):
        nf.gradcheck(lambda x: (x * np.nan, lambda d: d), [x])
    with pytest.raises(ValueError, match="fn: expected a floating output, got int64"):
        nf.gradcheck(lambda x: (np.ones(3, dtype=np.int64), lambda d: x), [x])


def test_a_function_that_changes_its_inputs_is_refused(x):
    """Perturbing in place and restoring relies on fn leaving the inputs alone; a function that
    normalises its input in place would otherwise get a verdict on other numbers."""
    def in_place(x):
        x -= x.mean()
        return x * 2.0, lambda d: 2.0 * d
    with pytest.raises(ValueError, match="fn: changed the input input0 in place"):
        nf.gradcheck(in_place, [x])

    def backward_in_place(x):
        def backward(d):
            x[0, 0] = 0.0
            return 2.0 * d
        return x * 2.0, backward
    with pytest.raises(ValueError, match="backward: changed the input input0 in place"):
        nf.gradcheck(backward_in_place, [x])


def test_a_non_deterministic_function_is_refused(x):
    """Dropout with an rng made outside fn: every call a new mask, so the differences compare
    different functions."""
    rng = np.random.default_rng(0)

    def f(x):
        out, cache = nf.functional.dropout_forward(x, 0.5, rng, training=True)
        return out, lambda d: nf.functional.dropout_backward(d, cache)
    with pytest.raises(ValueError, match="fn: two calls with the same inputs gave different outputs"):
        nf.gradcheck(f, [x])


def test_the_inputs_are_restored_bit_for_bit(x):
    before = x.copy()
    nf.gradcheck(square(2.0), [x])
    nf.gradcheck(square(2.0), [x], fast=True)
    assert np.array_equal(x, before)


# -- the command and the testing module ------------------------------------------------------

def test_npformer_gradcheck_fast_checks_every_layer_and_both_models(capsys):
    from npformer.cli.main import main
    assert main(["gradcheck", "--fast"]) == 0
    out = capsys.readouterr().out
    assert "random directions" in out and "FAIL" not in out
    for name in ("layernorm", "Transformer (whole model)", "GPT (whole model)"):
        assert name in out
    import re
    from npformer.gradcheck_suite import check_names
    n = len(check_names())
    assert n >= 23 and re.search(rf"\b{n}/{n} passed", out)


def test_assert_gradients_raises_with_the_report(x):
    from npformer.testing import assert_gradients
    assert assert_gradients(square(2.0), [x]).ok
    with pytest.raises(AssertionError, match=r"(?s)gradients disagree.*input0\s+WRONG"):
        assert_gradients(square(3.0), [x])


def test_the_strategies_say_how_to_install_hypothesis(monkeypatch):
    import sys
    from npformer import testing
    monkeypatch.setitem(sys.modules, "hypothesis", None)
    monkeypatch.setitem(sys.modules, "hypothesis.strategies", None)
    with pytest.raises(ImportError, match=r'pip install "npformer\[test\]"'):
        testing.float_arrays((2, 3))


# -- issue 77's smaller refusals and issue 79's report polish ---------------------------------

def test_an_all_zero_probe_is_refused(x):
    """sum(out * 0) is 0 whatever the inputs: both sides would be 0 and any backward would pass."""
    with pytest.raises(ValueError, match="dout: expected a probe with a non-zero entry, got all "
                                         "zeros"):
        nf.gradcheck(square(3.0), [x], dout=np.zeros((3, 4)))


def test_a_full_check_of_too_many_entries_is_refused_up_front():
    calls = []

    def f(x):
        calls.append(1)
        if len(calls) > 3:
            raise RuntimeError("the full check started on 100,001 entries")
        return x * 2.0, lambda d: 2.0 * d
    with pytest.raises(ValueError, match=r"inputs: the full check would compare all 100,001 "
                                         r"entries.*fast=True.*max_entries=K"):
        nf.gradcheck(f, [np.ones(100_001)])
    assert not calls
    assert nf.gradcheck(identity, [np.ones(100_001)], max_entries=2).ok   # said how many
    assert nf.gradcheck(identity, [np.ones(100_001)], fast=True).ok


def test_a_masked_array_is_refused_by_name(x):
    masked = np.ma.masked_array(x, mask=x > 0)
    with pytest.raises(ValueError, match=r"x \(inputs\[0\]\): expected a plain NumPy array, got a "
                                         r"masked array \(numpy.ma\)"):
        nf.gradcheck(square(2.0), [masked], names=["x"])
    with pytest.raises(ValueError, match="dout: expected a plain NumPy array, got a masked array"):
        nf.gradcheck(square(2.0), [x], dout=np.ma.masked_array(np.ones((3, 4))))


def test_a_backward_that_scales_the_probe_in_place_is_told_so(x):
    def f(x):
        def backward(d):
            d *= 2.0
            return d * x
        return x ** 2, backward
    with pytest.raises(ValueError, match=r"backward: changed dout \(the probe\) in place.*work on "
                                         r"a copy"):
        nf.gradcheck(f, [x])


def test_the_table_shows_no_relative_error_within_the_absolute_tolerance(x):
    """A gradient of exactly 0, answered with 1e-12: exact, and |a - n| / |n| is 1e-12 / 0."""
    def flat(x):
        return np.ones(3), lambda d: np.full(x.shape, 1e-12)
    result = nf.gradcheck(flat, [x], names=["x"])
    assert result.ok and result.inputs[0].status == "exact"
    table = format_table([CheckRow("flat", result, 0.0)]).splitlines()[2]
    assert table.split()[3:5] == ["1.0e-12", "-"], table
    row = str(result).splitlines()[2]
    assert row.split()[6:8] == ["1.0e-12", "-"], row


def test_assert_gradients_hides_its_own_frame_and_uses_the_given_names(x):
    from npformer.testing import assert_gradients
    with pytest.raises(AssertionError) as info:
        assert_gradients(square(3.0), [x])
    shown = [entry.name for entry in info.traceback.filter(info)]
    assert "assert_gradients" not in shown and shown, shown
    with pytest.raises(ValueError, match=r"weights \(inputs\[0\]\): expected float64"):
        assert_gradients(square(2.0), [x.astype(np.float32)], names=["weights"])
