"""Input checks shared by the model and the tools. Each raises ValueError naming the argument,
what was expected and what came: never a silent broadcast or a wrapped-around index."""
import math

import numpy as np


def check_token_ids(name, ids, vocab_size, max_len=None):
    """A (B, T) integer array with values in [0, vocab_size) and T <= max_len. Returns it as int64."""
    ids = np.asarray(ids)
    if ids.ndim != 2:
        raise ValueError(f"{name}: expected a 2-D integer array (batch, length), got shape {ids.shape}")
    if not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"{name}: expected an integer dtype, got {ids.dtype}")
    if ids.shape[0] == 0 or ids.shape[1] == 0:
        raise ValueError(f"{name}: expected a non-empty batch and length, got shape {ids.shape}")
    if max_len is not None and ids.shape[1] > max_len:
        raise ValueError(f"{name}: sequence length {ids.shape[1]} exceeds max_len={max_len}")
    lo, hi = ids.min(), ids.max()
    if lo < 0 or hi >= vocab_size:
        bad = lo if lo < 0 else hi
        raise ValueError(f"{name}: token ids must lie in [0, {vocab_size}), found {bad}")
    return ids.astype(np.int64, copy=False)


def check_same_batch(name_a, a, name_b, b):
    if a.shape[0] != b.shape[0]:
        raise ValueError(f"{name_a} and {name_b}: expected the same batch size, "
                         f"got {a.shape[0]} and {b.shape[0]}")


def check_array(name, x, shape, dtype=None):
    """``shape`` may contain None for "any size". Checks ndim, sizes and (optionally) dtype."""
    x = np.asarray(x)
    if x.ndim != len(shape) or any(s is not None and s != xs for s, xs in zip(shape, x.shape)):
        want = "(" + ", ".join("*" if s is None else str(s) for s in shape) + ")"
        raise ValueError(f"{name}: expected shape {want}, got {x.shape}")
    if dtype is not None and x.dtype != dtype:
        raise ValueError(f"{name}: expected dtype {np.dtype(dtype)}, got {x.dtype}")
    return x


# ----------------------------------------------------------------------------------------------
# scalar settings: one rule per kind of number, one wording for every message
#
#     check_int("n_heads", n_heads)                          a positive integer
#     check_int("seed", seed, minimum=0)                     a non-negative integer
#     check_real("lr", lr, minimum=0)                        a finite number >= 0
#     check_real("peak_lr", lr, minimum=0, min_open=True)    a finite positive number
#     check_real("dropout", p, minimum=0, maximum=1, max_open=True)   a finite number in [0, 1)
#
# ``describe_int`` / ``describe_real`` give the same words without a name, for callers that
# word their own errors (the CLI's argparse ``type=`` functions).

def _is_int(value):
    """A Python or NumPy integer; bools (and NumPy bools) are not integers here."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _is_real(value):
    """A Python or NumPy int or float; not a bool, str, array (or Fraction/Decimal, which the
    numeric code downstream does not expect)."""
    return (isinstance(value, (int, float, np.integer, np.floating))
            and not isinstance(value, (bool, np.bool_)))


def _shown(value):
    """``repr(value)``, cut to 80 characters (a 5000-digit number makes no better message)."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _bound(x):
    """A bound as a reader writes it: 0 not 0.0, 1 not 1.0, 0.001 as 0.001."""
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e16:
        return str(int(x))
    return str(x)


def describe_int(minimum=1, allow_none=False):
    """What ``check_int`` expects, in words: "a positive integer", "a non-negative integer"..."""
    if minimum is None:
        what = "an integer"
    elif minimum == 1:
        what = "a positive integer"
    elif minimum == 0:
        what = "a non-negative integer"
    else:
        what = f"an integer >= {minimum}"
    return what + (" or None" if allow_none else "")


def describe_real(*, minimum=None, maximum=None, min_open=False, max_open=False, allow_none=False):
    """What ``check_real`` expects, in words: "a finite number >= 0", "a finite positive
    number", "a finite number in [0, 1)"..."""
    if minimum is not None and maximum is not None:
        what = (f"a finite number in {'(' if min_open else '['}{_bound(minimum)}, "
                f"{_bound(maximum)}{')' if max_open else ']'}")
    elif minimum is not None:
        if minimum == 0 and min_open:
            what = "a finite positive number"
        else:
            what = f"a finite number {'>' if min_open else '>='} {_bound(minimum)}"
    elif maximum is not None:
        what = f"a finite number {'<' if max_open else '<='} {_bound(maximum)}"
    else:
        what = "a finite number"
    return what + (" or None" if allow_none else "")


def check_int(name, value, minimum=1, allow_none=False):
    """``value`` as an int: a Python or NumPy integer (never a bool or a float such as 2.0),
    ``>= minimum`` (no lower bound for ``minimum=None``); None passes only with ``allow_none``.
    ValueError ``"{name}: expected a positive integer, got 0"`` otherwise."""
    if value is None and allow_none:
        return None
    if not _is_int(value) or (minimum is not None and value < minimum):
        raise ValueError(f"{name}: expected {describe_int(minimum, allow_none)}, got {_shown(value)}")
    return int(value)


def check_real(name, value, *, minimum=None, maximum=None, min_open=False, max_open=False,
               allow_none=False):
    """``value`` as a float: a real number (int, float, NumPy scalar; never a bool or a str),
    finite, and within ``[minimum, maximum]`` (an open end with ``min_open`` / ``max_open``;
    None for no bound); None passes only with ``allow_none``. ValueError
    ``"{name}: expected a finite number in [0, 1), got nan"`` otherwise."""
    if value is None and allow_none:
        return None
    ok = _is_real(value)
    if ok:
        try:
            number = float(value)
        except OverflowError:                    # an int too large for a float: not finite
            ok = False
        else:
            ok = (math.isfinite(number)
                  and (minimum is None or (number > minimum if min_open else number >= minimum))
                  and (maximum is None or (number < maximum if max_open else number <= maximum)))
    if not ok:
        what = describe_real(minimum=minimum, maximum=maximum, min_open=min_open,
                             max_open=max_open, allow_none=allow_none)
        raise ValueError(f"{name}: expected {what}, got {_shown(value)}")
    return number


def check_flag(name, value):
    """``value`` as a bool: True or False (NumPy's bool too, never 1 or "yes"). ValueError
    ``"{name}: expected True or False, got 'no'"`` otherwise."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name}: expected True or False, got {_shown(value)}")
    return bool(value)
