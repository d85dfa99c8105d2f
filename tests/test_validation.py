"""The shared scalar checks (npformer.validation.check_int / check_real): what they accept, what
they return, and the one wording every message uses."""
import re
import math
from fractions import Fraction

import numpy as np
import pytest

from npformer.validation import check_int, check_real, describe_int, describe_real


@pytest.mark.parametrize("value,minimum,expected", [
    (1, 1, 1), (np.int64(7), 1, 7), (np.uint8(0), 0, 0), (0, 0, 0), (-5, None, -5), (3, 3, 3),
])
def test_check_int_accepts_integers_and_returns_int(value, minimum, expected):
    got = check_int("n", value, minimum)
    assert got == expected and type(got) is int


@pytest.mark.parametrize("value,minimum,match", [
    (0, 1, r"n: expected a positive integer, got 0"),
    (-1, 0, r"n: expected a non-negative integer, got -1"),
    (2, 3, r"n: expected an integer >= 3, got 2"),
    (True, 1, r"n: expected a positive integer, got True"),
    (np.True_, 0, r"n: expected a non-negative integer, got "),
    (2.0, 1, r"n: expected a positive integer, got 2.0"),
    ("2", 1, r"n: expected a positive integer, got '2'"),
    (None, 1, r"n: expected a positive integer, got None"),
    (1.5, None, r"n: expected an integer, got 1.5"),
])
def test_check_int_refuses(value, minimum, match):
    with pytest.raises(ValueError, match=match):
        check_int("n", value, minimum)


def test_check_int_none():
    assert check_int("patience", None, allow_none=True) is None
    with pytest.raises(ValueError, match=r"patience: expected a positive integer or None, got 0"):
        check_int("patience", 0, allow_none=True)


@pytest.mark.parametrize("value,kwargs,expected", [
    (0, dict(minimum=0), 0.0), (3, {}, 3.0), (np.float32(0.5), dict(minimum=0, maximum=1), 0.5),
    (1e-300, dict(minimum=0, min_open=True), 1e-300),
    (1, dict(maximum=1), 1.0), (np.int64(4), dict(minimum=4), 4.0),
])
def test_check_real_accepts_numbers_and_returns_float(value, kwargs, expected):
    got = check_real("x", value, **kwargs)
    assert got == expected and type(got) is float


@pytest.mark.parametrize("value,kwargs,match", [
    (math.nan, {}, r"x: expected a finite number, got nan"),
    (math.inf, dict(minimum=0), r"x: expected a finite number >= 0, got inf"),
    (-1e-12, dict(minimum=0), r"x: expected a finite number >= 0, got -1e-12"),
    (0, dict(minimum=0, min_open=True), r"x: expected a finite positive number, got 0"),
    (0.5, dict(minimum=0.5, min_open=True), r"x: expected a finite number > 0.5, got 0.5"),
    (1.0, dict(minimum=0, maximum=1, max_open=True), r"x: expected a finite number in \[0, 1\), got 1.0"),
    (0.0, dict(minimum=0, maximum=1, min_open=True), r"x: expected a finite number in \(0, 1\], got 0.0"),
    (2, dict(maximum=1), r"x: expected a finite number <= 1, got 2"),
    (1, dict(maximum=1, max_open=True), r"x: expected a finite number < 1, got 1"),
    (True, {}, r"x: expected a finite number, got True"),
    ("0.1", {}, r"x: expected a finite number, got '0.1'"),
    (Fraction(1, 4), {}, r"x: expected a finite number, got Fraction"),
    (None, {}, r"x: expected a finite number, got None"),
    (np.array([0.5]), {}, r"x: expected a finite number, got array"),
    (10**400, {}, r"x: expected a finite number, got 1000.*\.\.\.$"),      # too big for a float
])
def test_check_real_refuses(value, kwargs, match):
    with pytest.raises(ValueError, match=match):
        check_real("x", value, **kwargs)


def test_check_real_none():
    assert check_real("target", None, allow_none=True) is None
    with pytest.raises(ValueError, match=r"clip_norm: expected a finite positive number or None, got -1"):
        check_real("clip_norm", -1, minimum=0, min_open=True, allow_none=True)


def test_descriptions_read_as_the_messages_do():
    assert describe_int(0) == "a non-negative integer"
    assert describe_int(1, allow_none=True) == "a positive integer or None"
    assert describe_real(minimum=0.0) == "a finite number >= 0"
    assert describe_real(minimum=1e-3, maximum=0.5) == "a finite number in [0.001, 0.5]"


# --- the callers word their errors through these checks ---------------------------------------

@pytest.mark.parametrize("patience", [0, -1, True, 2.0, "3"])
def test_early_stopping_patience(patience):
    from npformer.training.early_stopping import EarlyStopping
    with pytest.raises(ValueError, match=r"patience: expected a positive integer or None, got "):
        EarlyStopping(patience=patience)


def test_early_stopping_patience_accepts_numpy_ints_and_none():
    from npformer.training.early_stopping import EarlyStopping
    assert EarlyStopping(patience=np.int64(2)).patience == 2
    assert EarlyStopping(patience=None).patience is None


def test_check_flag_takes_bools_only():
    from npformer.validation import check_flag
    assert check_flag("f", True) is True and check_flag("f", np.bool_(False)) is False
    for bad in (1, 0, "yes", None, 1.0):
        with pytest.raises(ValueError, match=f"f: expected True or False, got {re.escape(repr(bad))}"):
            check_flag("f", bad)
