"""The exercises: what each file holds, the inputs each is checked on, and the mistakes the
checker recognises by the pattern of the error (docs/backprop.md's "What goes wrong").

An exercise's ``cases(rng)`` are the checks it must pass, each a forward and a backward called
on the learner's module (or on the reference solution, for the hints). The small float64 inputs
are chosen so that the documented slips cannot pass unseen: ids that repeat, a padding row, a
mask with an all-masked row, T_q != T_k, non-square weights beside a square one, ignored targets.
"""
import math
from dataclasses import dataclass, field

import numpy as np

# The exercise folder's own derivations (docs/backprop.md's sections, written there by
# ``npformer exercises start``): each exercise names its section of this file, so a learner
# offline has every derivation and no link leads to a web page.
DERIVATIONS = "derivations.md"


@dataclass
class Case:
    """One check: ``forward(mod, *inputs) -> (out, cache)`` and ``backward(mod, dout, cache)``
    -> the learner's return value, ``returns`` values (named ``labels``), the i-th being the
    gradient of input ``grads[i]`` (None: returned but not an input here)."""

    label: str
    inputs: list
    names: list
    forward: object
    backward: object
    grads: tuple
    labels: tuple
    extra: dict = field(default_factory=dict)

    @property
    def returns(self):
        return len(self.grads)


@dataclass
class Exercise:
    name: str              # the CLI's name: npformer exercises check DIR NAME
    number: int
    title: str
    section: str           # the heading of docs/backprop.md (and of the folder's derivations.md)
    writes: tuple          # the functions the learner writes
    provides: tuple = ()   # the names a finale takes from the learner's file (which finale
                           # trains with which exercise: namespace.FINALES)
    cases: object = None   # rng -> [Case]; None for the update (adam)
    hints: tuple = ()      # (text, detector(ctx) -> bool)

    @property
    def module(self):
        return self.name

    @property
    def file(self):
        return f"{self.number:02d}_{self.name}.py"

    @property
    def anchor(self):
        return self.section.lower().replace(" ", "-")

    @property
    def derivation(self):
        """Where its derivation is, relative to the exercise folder."""
        return f'{DERIVATIONS}, section "{self.section}"'

    @property
    def trained(self):
        return bool(self.provides)


# -- helpers for the detectors -------------------------------------------------------------------

def close(a, b, rtol=1e-6):
    """a equals b to ``rtol`` of b's scale (both arrays, same shape)."""
    if a is None or b is None or np.shape(a) != np.shape(b):
        return False
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        return False
    scale = max(np.abs(b).max(initial=0.0), 1e-300)
    return float(np.abs(a - b).max(initial=0.0)) <= rtol * scale


def factor(a, b):
    """c when a = c b (to 1e-6 of a's scale), else None."""
    if a is None or b is None or np.shape(a) != np.shape(b):
        return None
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    bb = float(np.sum(b * b))
    if bb == 0 or not np.isfinite(a).all():
        return None
    c = float(np.sum(a * b)) / bb
    return c if close(a, c * b) else None


def rows_parallel(diff, direction):
    """Every row (last axis) of ``diff`` is a multiple of the same row of ``direction``, and
    ``diff`` is not zero."""
    if diff is None or not np.isfinite(diff).all() or np.abs(diff).max() == 0:
        return False
    c = (diff * direction).sum(-1, keepdims=True) / np.maximum(
        (direction * direction).sum(-1, keepdims=True), 1e-300)
    return close(diff, c * direction, rtol=1e-5)


@dataclass
class Context:
    """What a detector sees: the case, the learner's gradients ``mine`` and the reference's
    ``ref`` (input name -> array or None), the names of the inputs that failed, and dout."""

    case: Case
    mine: dict
    ref: dict
    wrong: set
    dout: object

    def diff(self, name):
        return None if self.mine.get(name) is None else self.mine[name] - self.ref[name]

    def scaled(self, name, c):
        return name in self.wrong and factor(self.mine.get(name), self.ref[name]) is not None \
            and abs(factor(self.mine[name], self.ref[name]) - c) <= 1e-6 * max(abs(c), 1)


def rnd(rng, *shape):
    return rng.standard_normal(shape)


def plain(mod, fname, *args):
    return getattr(mod, fname)(*args)


# -- 1. linear ---------------------------------------------------------------------------------

def linear_cases(rng):
    def case(label, x, w, b):
        return Case(label, [x, w, b], ["x", "w", "b"], lambda m, *xs: m.linear_forward(*xs),
                    lambda m, d, c: m.linear_backward(d, c), (0, 1, 2), ("dx", "dw", "db"))
    return [case("x (2, 3, 4), w (5, 4), b (5,)", rnd(rng, 2, 3, 4), rnd(rng, 5, 4), rnd(rng, 5)),
            case("x (3, 4), square w (4, 4), b (4,)", rnd(rng, 3, 4), rnd(rng, 4, 4), rnd(rng, 4))]


LINEAR_HINTS = (
    ("dw is dY^T X, the transpose of X^T dY (that is the x @ W layout's gradient; PyTorch's "
     "weight is (D_out, D_in))", lambda c: "w" in c.wrong and close(c.mine["w"], c.ref["w"].T)),
)


# -- 2. embedding ------------------------------------------------------------------------------

EMB_IDS = np.array([[1, 2, 1], [0, 1, 3]])               # id 1 three times, 0 the padding id


def embedding_cases(rng):
    scale = math.sqrt(3)
    pad_row = rnd(rng, 1, 3)                       # the padding row: frozen, so not an input

    def padded(m, ids, w_rest):
        return m.embedding_forward(ids, np.concatenate([pad_row, w_rest]), scale)

    def no_padding_gradient(values):
        if np.asarray(values[0])[0].any():
            return "the padding row must get no gradient: dw[padding_idx] = 0"
        return None
    return [Case("ids (2, 3) with a repeated id, w (5, 3), scale sqrt(3)",
                 [EMB_IDS.copy(), rnd(rng, 5, 3)], ["ids", "w"],
                 lambda m, ids, w: m.embedding_forward(ids, w, scale),
                 lambda m, d, c: m.embedding_backward(d, c, None), (1,), ("dw",), {"scale": scale}),
            Case("the same with padding_idx=0 (row 0 of w frozen; w below is rows 1..4)",
                 [EMB_IDS.copy(), rnd(rng, 4, 3)], ["ids", "w"], padded,
                 lambda m, d, c: m.embedding_backward(d, c, 0), (1,), ("dw",),
                 {"scale": scale, "view": lambda values: (np.asarray(values[0])[1:],),
                  "require": no_padding_gradient})]


def _wrong_rows(c, name):
    d = c.diff(name)
    if d is None or not np.isfinite(d).all():
        return set()
    return set(np.nonzero(np.abs(d).max(axis=-1) > 1e-9 * max(np.abs(c.ref[name]).max(), 1e-300))[0])


def _repeated_ids():
    ids, counts = np.unique(EMB_IDS, return_counts=True)
    return set(ids[counts > 1])


EMBEDDING_HINTS = (
    ("rows of repeated ids are wrong: dw[ids] += dout keeps only one occurrence of each id; "
     "use np.add.at(dw, ids, dout), which adds them all",
     lambda c: "view" not in c.case.extra and "w" in c.wrong and bool(_wrong_rows(c, "w"))
     and _wrong_rows(c, "w") <= _repeated_ids()),
    ("dw is 1/scale of the right one: multiply by the forward's scale in the backward too",
     lambda c: c.scaled("w", 1 / c.case.extra["scale"])),
)


# -- 3. dropout --------------------------------------------------------------------------------

def dropout_cases(rng):
    def case(label, p, training):
        def forward(m, x):
            # a generator of its own seed: the same mask at every call
            return m.dropout_forward(x, p, np.random.default_rng(7), training)
        return Case(label, [rnd(rng, 3, 8)], ["x"], forward,
                    lambda m, d, c: m.dropout_backward(d, c), (0,), ("dx",), {"p": p})
    return [case("x (3, 8), p 0.25, training", 0.25, True),
            case("x (3, 8), p 0.25, not training (the cache is None)", 0.25, False)]


DROPOUT_HINTS = (
    ("dx is (1 - p) times the right one: the survivors were scaled by 1/(1-p) in the forward, "
     "so their gradients are too (dout * keep * scale)",
     lambda c: c.scaled("x", 1 - c.case.extra["p"])),
)


# -- 4. LayerNorm ------------------------------------------------------------------------------

def layernorm_cases(rng):
    return [Case("x (2, 3, 6), gamma (6,), beta (6,)",
                 [rnd(rng, 2, 3, 6) * 2 + 1, 1 + 0.3 * rnd(rng, 6), rnd(rng, 6)],
                 ["x", "gamma", "beta"], lambda m, *xs: m.layernorm_forward(*xs),
                 lambda m, d, c: m.layernorm_backward(d, c), (0, 1, 2), ("dx", "dgamma", "dbeta"))]


def _xhat(c):
    x = c.case.inputs[0]
    xc = x - x.mean(-1, keepdims=True)
    return xc / np.sqrt((xc * xc).mean(-1, keepdims=True) + 1e-5)


def _rows_sum_to_zero(a):
    return np.abs(a.sum(-1)).max() <= 1e-8 * max(np.abs(a).max(), 1e-300)


LAYERNORM_HINTS = (
    ("dx's rows do not sum to zero: mu was treated as a constant (the - mean(g) term is "
     "missing; a common shift of a row changes nothing, so its gradient has no such component)",
     lambda c: "x" in c.wrong and c.mine["x"] is not None and np.isfinite(c.mine["x"]).all()
     and not _rows_sum_to_zero(c.mine["x"])),
    ("dx - (the right dx) is a multiple of xhat in every row: sigma was treated as a constant "
     "(the - xhat * mean(g * xhat) term is missing)",
     lambda c: "x" in c.wrong and _rows_sum_to_zero(c.mine["x"])
     and rows_parallel(c.diff("x"), _xhat(c))),
    ("dgamma and dbeta are swapped: dgamma = sum of dout * xhat, dbeta = sum of dout",
     lambda c: close(c.mine.get("gamma"), c.ref["beta"]) and close(c.mine.get("beta"), c.ref["gamma"])),
)


# -- 5. RMSNorm --------------------------------------------------------------------------------

def rmsnorm_cases(rng):
    return [Case("x (2, 3, 6), gamma (6,)", [rnd(rng, 2, 3, 6) + 0.5, 1 + 0.3 * rnd(rng, 6)],
                 ["x", "gamma"], lambda m, *xs: m.rmsnorm_forward(*xs),
                 lambda m, d, c: m.rmsnorm_backward(d, c), (0, 1), ("dx", "dgamma"))]


def _rms_xhat(c):
    x = c.case.inputs[0]
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)


RMSNORM_HINTS = (
    ("dx - (the right dx) is a multiple of xhat in every row: r was treated as a constant (the "
     "- xhat * mean(g * xhat) term is missing)",
     lambda c: "x" in c.wrong and rows_parallel(c.diff("x"), _rms_xhat(c))),
    ("dx is off by the same number across each row: that is LayerNorm's - mean(g) term, but "
     "RMSNorm subtracts no mean, so its backward has none",
     lambda c: "x" in c.wrong and rows_parallel(c.diff("x"), np.ones_like(c.ref["x"]))),
)


# -- 6. softmax --------------------------------------------------------------------------------

SOFTMAX_MASK = np.array([[True, True, False, True, False],
                         [True, False, True, True, True],
                         [False, False, False, False, False],        # every entry masked
                         [True, True, True, True, True]])


def softmax_cases(rng):
    return [Case("scores (2, 4, 5), mask (4, 5) with an all-masked row",
                 [rnd(rng, 2, 4, 5) * 2], ["scores"],
                 lambda m, s: m.softmax_forward(s, SOFTMAX_MASK),
                 lambda m, d, c: m.softmax_backward(d, c), (0,), ("dscores",)),
            Case("scores (3, 4), no mask", [rnd(rng, 3, 4)], ["scores"],
                 lambda m, s: m.softmax_forward(s, None),
                 lambda m, d, c: m.softmax_backward(d, c), (0,), ("dscores",))]


def _probs(c):
    from npformer.functional import softmax_forward
    mask = SOFTMAX_MASK if c.case.inputs[0].shape[-2:] == SOFTMAX_MASK.shape else None
    return softmax_forward(c.case.inputs[0], mask)[0]


SOFTMAX_HINTS = (
    ("masked entries (and all-masked rows) must get zero gradient: p is 0 there and "
     "ds = p * (...) keeps it 0; no NaN either",
     lambda c: c.mine.get("scores") is not None and c.case.inputs[0].shape[-2:] == SOFTMAX_MASK.shape
     and not (np.nan_to_num(c.mine["scores"], nan=1.0)[..., ~SOFTMAX_MASK] == 0).all()),
    ("ds - (the right ds) is a multiple of p in every row: the - p p^T part of the Jacobian is "
     "missing; ds = p * (dp - sum(dp * p))",
     lambda c: "scores" in c.wrong and rows_parallel(c.diff("scores"), _probs(c))),
)


# -- 7. SwiGLU ---------------------------------------------------------------------------------

def swiglu_cases(rng):
    return [Case("silu: x (3, 5)", [rnd(rng, 3, 5) * 2], ["x"],
                 lambda m, x: m.silu_forward(x), lambda m, d, c: m.silu_backward(d, c),
                 (0,), ("dx",), {"fn": "silu"}),
            Case("swiglu: h (2, 3, 8) = [gate | up]", [rnd(rng, 2, 3, 8) * 2], ["h"],
                 lambda m, h: m.swiglu_forward(h), lambda m, d, c: m.swiglu_backward(d, c),
                 (0,), ("dh",), {"fn": "swiglu"})]


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


SWIGLU_HINTS = (
    ("silu's derivative is not sigmoid(x) alone: the product rule gives "
     "s + x s (1 - s), s = sigmoid(x)",
     lambda c: c.case.extra["fn"] == "silu"
     and close(c.mine.get("x"), c.dout * _sigmoid(c.case.inputs[0]))),
    ("the two halves are exchanged: d gate = silu'(gate) * dout * up goes first, d up = dout * "
     "silu(gate) second (each is the *other* factor times dout)",
     lambda c: c.case.extra["fn"] == "swiglu" and c.mine.get("h") is not None
     and c.mine["h"].shape == c.ref["h"].shape
     and close(np.concatenate(np.split(c.mine["h"], 2, axis=-1)[::-1], axis=-1), c.ref["h"])),
)


# -- 8. attention ------------------------------------------------------------------------------

def attention_cases(rng):
    mask = np.ones((2, 1, 3, 4), dtype=bool)
    mask[0, ..., 3] = False                                 # the first sequence's last key: padding
    mask[1, ..., 2:] = False

    def case(label, p, training):
        def forward(m, q, k, v):
            return m.attention_forward(q, k, v, mask, p, np.random.default_rng(3), training)
        return Case(label, [rnd(rng, 2, 2, 3, 4), rnd(rng, 2, 2, 4, 4), rnd(rng, 2, 2, 4, 2)],
                    ["q", "k", "v"], forward, lambda m, d, c: m.attention_backward(d, c),
                    (0, 1, 2), ("dq", "dk", "dv"), {"p": p, "mask": mask, "training": training})
    return [case("q (2, 2, 3, 4), k (2, 2, 4, 4), v (2, 2, 4, 2), padding mask (Tq 3 != Tk 4)",
                 0.0, False),
            case("the same with attention dropout 0.3", 0.3, True)]


def _attention_parts(c):
    """P, P', the keep scale and the mask of the case, from the reference forward."""
    from npformer.functional import attention_forward
    q, k, v = c.case.inputs
    e = c.case.extra
    _, cache = attention_forward(q, k, v, e["mask"], e["p"], np.random.default_rng(3), e["training"])
    return cache


def _dv_from_p(c):
    q, k, v, probs, probs_d, drop, scale = _attention_parts(c)
    return probs.swapaxes(-1, -2) @ c.dout


def _softmax_of_dropped(c):
    from npformer.functional import dropout_backward, softmax_backward
    q, k, v, probs, probs_d, drop, scale = _attention_parts(c)
    ds = softmax_backward(dropout_backward(c.dout @ v.swapaxes(-1, -2), drop), probs_d) * scale
    return ds @ k


ATTENTION_HINTS = (
    ("dq and dk are sqrt(d_k) times too large: the scores were scaled by 1/sqrt(d_k) in the "
     "forward, so dS is scaled by it in the backward (the scale was forgotten)",
     lambda c: any(c.scaled(n, math.sqrt(c.case.inputs[0].shape[-1])) for n in ("q", "k"))),
    ("dq and dk are scaled by 1/sqrt(d_k) once too often: apply the scale to dS or to dq and "
     "dk, not to both",
     lambda c: any(c.scaled(n, 1 / math.sqrt(c.case.inputs[0].shape[-1])) for n in ("q", "k"))),
    ("dv uses P, the weights before dropout: the values were multiplied by P' = dropout(P), "
     "so dv = P'^T dout",
     lambda c: c.case.extra["p"] > 0 and "v" in c.wrong and close(c.mine.get("v"), _dv_from_p(c))),
    ("the softmax backward got P' (after dropout): the softmax produced P, so pass P to it and "
     "dP = dropout_backward(dout v^T) as its dout",
     lambda c: c.case.extra["p"] > 0 and "q" in c.wrong
     and close(c.mine.get("q"), _softmax_of_dropped(c))),
)


# -- 9. multi-head attention -------------------------------------------------------------------

def mha_cases(rng):
    d, h = 6, 2
    mask = np.tril(np.ones((3, 3), dtype=bool))[None, None]          # causal
    return [Case(f"x (2, 3, {d}), {h} heads, w_in ({3 * d}, {d}), causal mask",
                 [rnd(rng, 2, 3, d), rnd(rng, 3 * d, d) * 0.5, rnd(rng, 3 * d) * 0.1,
                  rnd(rng, d, d) * 0.5, rnd(rng, d) * 0.1],
                 ["x", "w_in", "b_in", "w_out", "b_out"],
                 lambda m, x, wi, bi, wo, bo: m.mha_forward(x, wi, bi, wo, bo, h, mask),
                 lambda m, dd, c: m.mha_backward(dd, c), (0, 1, 2, 3, 4),
                 ("dx", "dw_in", "db_in", "dw_out", "db_out"))]


MHA_HINTS = (
    ("the output projection is right but the input projection is not: d[Q | K | V] is dq, dk "
     "and dv each merged back to (B, T, D) (transpose, then reshape) and concatenated in that "
     "order along the last axis",
     lambda c: not ({"w_out", "b_out"} & c.wrong) and bool({"x", "w_in", "b_in"} & c.wrong)),
)


# -- 10. residual block ------------------------------------------------------------------------

def residual_cases(rng):
    def case(norm_first):
        order = "pre-norm (norm_first=True)" if norm_first else "post-norm (norm_first=False)"
        return Case(f"{order}: x (2, 3, 5), w (5, 5)",
                    [rnd(rng, 2, 3, 5), rnd(rng, 5, 5) * 0.5, rnd(rng, 5) * 0.1,
                     1 + 0.2 * rnd(rng, 5), 0.1 * rnd(rng, 5)],
                    ["x", "w", "b", "gamma", "beta"],
                    lambda m, *xs: m.residual_forward(*xs, norm_first),
                    lambda m, d, c: m.residual_backward(d, c), (0, 1, 2, 3, 4),
                    ("dx", "dw", "db", "dgamma", "dbeta"), {"norm_first": norm_first})
    return [case(False), case(True)]


def _dz(c):
    """post-norm: the gradient below the LayerNorm, LN'(dout)."""
    from npformer.functional import layernorm_backward, layernorm_forward, linear_forward
    x, w, b, gamma, beta = c.case.inputs
    fx, _ = linear_forward(x, w, b)
    _, cache = layernorm_forward(x + fx, gamma, beta)
    return layernorm_backward(c.dout, cache)[0]


RESIDUAL_HINTS = (
    ("dx lacks the identity path: x + f(...) hands its gradient to x directly too, so add it "
     "(pre-norm: + dout; post-norm: + dz, the gradient below the LayerNorm)",
     lambda c: "x" in c.wrong and close(c.mine.get("x"), c.ref["x"] - (
         c.dout if c.case.extra["norm_first"] else _dz(c)))),
    ("post-norm: the identity path must carry dz = LN'(dout), the gradient below the LayerNorm, "
     "not dout itself",
     lambda c: not c.case.extra["norm_first"] and "x" in c.wrong
     and close(c.mine.get("x"), c.ref["x"] - _dz(c) + c.dout)),
)


# -- 11. cross-entropy -------------------------------------------------------------------------

CE_TARGETS = np.array([2, 0, -100, 4, 1, -100])           # two ignored rows


def cross_entropy_cases(rng):
    def case(label, targets, smoothing):
        def forward(m, logits, t):
            loss, cache = m.cross_entropy_forward(logits, t, -100, smoothing)
            return np.array(loss, dtype=np.float64), cache
        return Case(label, [rnd(rng, len(targets), 5) * 2, targets.copy()], ["logits", "targets"],
                    forward, lambda m, d, c: m.cross_entropy_backward(d, c), (0,), ("dlogits",),
                    {"smoothing": smoothing, "targets": targets})
    return [case("logits (6, 5), 2 of 6 targets ignored", CE_TARGETS, 0.0),
            case("the same with label smoothing 0.1", CE_TARGETS, 0.1),
            case("every target ignored (loss and gradient 0)", np.full(3, -100), 0.0)]


def _valid(c):
    return c.case.extra["targets"] != -100


CE_HINTS = (
    ("dlogits is count times too large: the loss is a mean over the real (not ignored) targets, "
     "so divide by their count",
     lambda c: _valid(c).any() and c.scaled("logits", float(_valid(c).sum()))),
    ("divided by every row (N, ignored ones included) instead of the number of real targets",
     lambda c: _valid(c).any() and c.scaled("logits", _valid(c).sum() / len(_valid(c)))),
    ("ignored rows must get zero gradient (their target is not a class: multiply by the valid "
     "mask)",
     lambda c: c.mine.get("logits") is not None
     and not (np.nan_to_num(c.mine["logits"], nan=1.0)[~_valid(c)] == 0).all()),
    ("smoothing puts eps / V on every class: subtract eps / V from the softmax as well as "
     "1 - eps at the target",
     lambda c: c.case.extra["smoothing"] > 0 and "logits" in c.wrong and rows_parallel(
         c.diff("logits"), np.ones_like(c.ref["logits"]))),
)


# -- 12. Adam (an update, not a backward: checked by checker.check_adam) ------------------------

ADAM_HINTS = {
    "no_bias_correction": "the first steps are the wrong size: divide m by 1 - beta1^t and "
                          "sqrt(v) by sqrt(1 - beta2^t) (bias correction; m and v start at 0)",
    "corrected_state": "m (or v) was stored bias-corrected: keep the running averages "
                       "uncorrected and correct a copy",
    "eps_inside": "eps belongs outside the square root: sqrt(v) / sqrt(1 - beta2^t) + eps",
    "efficient_form": "this is the Adam paper's 'efficient' form, with eps at another scale: "
                      "compute denom = sqrt(v) / sqrt(1 - beta2^t) + eps as PyTorch does",
    "nan": "NaN or inf: t starts at 1 (1 - beta^0 = 0 divides by zero)",
    "zero_division": "t starts at 1 (1 - beta^0 = 0 divides by zero)",
    "decay": "weight decay: Adam adds wd * p to the gradient; AdamW (decoupled) shrinks "
             "p by (1 - lr * wd) first",
}


EXERCISES = (
    Exercise("linear", 1, "Linear layer", "Linear", ("linear_backward",),
             ("linear_forward", "linear_backward"), linear_cases, LINEAR_HINTS),
    Exercise("embedding", 2, "Token embedding", "Embedding", ("embedding_backward",),
             ("embedding_forward", "embedding_backward"), embedding_cases, EMBEDDING_HINTS),
    Exercise("dropout", 3, "Dropout", "Dropout", ("dropout_backward",),
             ("dropout_forward", "dropout_backward"), dropout_cases, DROPOUT_HINTS),
    Exercise("layernorm", 4, "LayerNorm", "LayerNorm", ("layernorm_backward",),
             ("layernorm_forward", "layernorm_backward"), layernorm_cases, LAYERNORM_HINTS),
    Exercise("rmsnorm", 5, "RMSNorm", "RMSNorm", ("rmsnorm_backward",),
             ("rmsnorm_forward", "rmsnorm_backward"), rmsnorm_cases, RMSNORM_HINTS),
    Exercise("softmax", 6, "Masked softmax", "Softmax", ("softmax_backward",),
             ("softmax_forward", "softmax_backward"), softmax_cases, SOFTMAX_HINTS),
    Exercise("swiglu", 7, "SiLU and SwiGLU", "SwiGLU", ("silu_backward", "swiglu_backward"),
             ("silu_forward", "silu_backward", "swiglu_forward", "swiglu_backward"),
             swiglu_cases, SWIGLU_HINTS),
    Exercise("attention", 8, "Scaled dot-product attention", "Attention", ("attention_backward",),
             ("attention_forward", "attention_backward"), attention_cases, ATTENTION_HINTS),
    Exercise("multi_head_attention", 9, "Multi-head attention, fused projection",
             "Multi-head attention", ("mha_backward",), ("mha_forward", "mha_backward"),
             mha_cases, MHA_HINTS),
    Exercise("residual", 10, "Residual block, both orders", "Residual and layer order",
             ("residual_backward",), ("residual_forward", "residual_backward"), residual_cases,
             RESIDUAL_HINTS),
    Exercise("cross_entropy", 11, "Cross-entropy, ignore_index, label smoothing", "Cross-entropy",
             ("cross_entropy_backward",), ("cross_entropy_forward", "cross_entropy_backward"),
             cross_entropy_cases, CE_HINTS),
    Exercise("adam", 12, "The Adam step", "Adam", ("adam_step",), ("adam_step",)),
)

BY_NAME = {e.name: e for e in EXERCISES}


def find(name):
    """The exercise called ``name`` (ValueError listing the names otherwise)."""
    if name not in BY_NAME:
        raise ValueError(f"NAME: expected one of {', '.join(BY_NAME)}, got {name!r}")
    return BY_NAME[name]
