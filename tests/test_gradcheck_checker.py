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
