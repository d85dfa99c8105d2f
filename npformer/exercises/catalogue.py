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

from . import staged

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
    hints: tuple = ()      # Mistake(symptom, idea, formula, detector(ctx) -> bool)
    chain: object = None   # a staged exercise's chain of named intermediates (staged.py)
    part: str = ""         # "a": the staged steps before exercise ``number`` (its file 04a_...)

    @property
    def module(self):
        return self.name

    @property
    def key(self):
        """Its number as the list shows it: 4a (the staged steps), then 4 (the fused one)."""
        return f"{self.number}{self.part}"

    @property
    def file(self):
        return f"{self.number:02d}{self.part}_{self.name}.py"

    @property
    def staged(self):
        return self.chain is not None

    @property
    def notebook(self):
        """The name of its notebook (``start --notebook``), paired with :attr:`file`."""
        return self.file[:-len(".py")] + ".ipynb"

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


@dataclass(frozen=True)
class Mistake:
    """A mistake the checker recognises, as three hints, each a step further: the ``symptom``
    and where to look (what ``check`` prints), the ``idea`` (``check --hint``) and the
    ``formula`` (``check --hint 2``). ``detector(ctx)`` says whether a wrong gradient shows it."""

    symptom: str
    idea: str
    formula: str
    detector: object = None

    @property
    def levels(self):
        return (self.symptom, self.idea, self.formula)


def as_mistake(hint):
    """A :class:`Mistake`; a ``(text, detector)`` pair is one whose three levels are ``text``."""
    return hint if isinstance(hint, Mistake) else Mistake(hint[0], "", "", hint[1])


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
    Mistake("dw is the right one transposed (look at the order of the two factors of dw)",
            "X^T dY is the gradient of the x @ W layout; here, as in PyTorch, the weight is "
            "(D_out, D_in), so the factors go the other way round",
            "dw = dY^T X: dout.reshape(-1, D_out).T @ x.reshape(-1, D_in)",
            lambda c: "w" in c.wrong and close(c.mine["w"], c.ref["w"].T)),
)


# -- 2. embedding ------------------------------------------------------------------------------

EMB_IDS = np.array([[1, 2, 1], [0, 1, 3]])               # id 1 three times, 0 the padding id
PADDING_ROW = Mistake("the padding row gets a gradient (look at row padding_idx of dw)",
                      "the padding row must get no gradient: it is frozen, so that the <pad> "
                      "vector never moves", "dw[padding_idx] = 0, after the scatter-add")


def embedding_cases(rng):
    scale = math.sqrt(3)
    pad_row = rnd(rng, 1, 3)                       # the padding row: frozen, so not an input

    def padded(m, ids, w_rest):
        return m.embedding_forward(ids, np.concatenate([pad_row, w_rest]), scale)

    def no_padding_gradient(values):
        if np.asarray(values[0])[0].any():
            return PADDING_ROW
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
    Mistake("only the rows of ids that occur more than once are wrong (look at how dw "
            "collects the rows of dout)",
            "dw[ids] += dout is dw[ids] = dw[ids] + dout: for an id that occurs twice the "
            "second write replaces the first, so one occurrence is kept; every occurrence "
            "must add (fan-out sums)",
            "np.add.at(dw, ids.reshape(-1), dout.reshape(-1, D)), which adds them all",
     lambda c: "view" not in c.case.extra and "w" in c.wrong and bool(_wrong_rows(c, "w"))
     and _wrong_rows(c, "w") <= _repeated_ids()),
    Mistake("dw is 1/scale of the right one (look at the forward's scale)",
            "the forward multiplies each row it reads by scale, so multiply by the forward's "
            "scale in the backward too",
            "dw *= scale, after the scatter-add",
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
    Mistake("dx is (1 - p) times the right one (look at what the forward does to the "
            "survivors)",
            "the survivors were scaled by 1/(1-p) in the forward, so their gradients are too",
            "dx = dout * keep * scale, scale = 1 / (1 - p)",
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


def _through_xhat_only(c):
    """dx = rstd * dout * gamma: the gradient of xhat = (x - mu) * rstd with mu and rstd held
    fixed."""
    x, gamma = c.case.inputs[0], c.case.inputs[1]
    xc = x - x.mean(-1, keepdims=True)
    rstd = 1.0 / np.sqrt((xc * xc).mean(-1, keepdims=True) + 1e-5)
    return "x" in c.wrong and close(c.mine.get("x"), rstd * c.dout * gamma)


LAYERNORM_DX = ("dx = rstd * (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, "
                "keepdims=True)), g = dout * gamma")

LAYERNORM_HINTS = (
    Mistake("dx is rstd * dout * gamma, the gradient through xhat alone (look at how each x_i "
            "reaches every xhat_j: through mu and through sigma)",
            "mu and sigma were both treated as constants: they depend on every x_i of the row, "
            "so each adds a term (the two mean terms), and a common shift or scaling of a row, "
            "which the norm removes, must leave no trace in dx",
            LAYERNORM_DX, _through_xhat_only),
    Mistake("dx's rows do not sum to zero (look at the path from x to xhat through mu)",
            "mu was treated as a constant: the - mean(g) term is missing; a common shift of a "
            "row changes nothing, so its gradient has no such component",
            LAYERNORM_DX,
            lambda c: "x" in c.wrong and c.mine["x"] is not None and np.isfinite(c.mine["x"]).all()
            and not _rows_sum_to_zero(c.mine["x"]) and not _through_xhat_only(c)),
    Mistake("dx - (the right dx) is a multiple of xhat in every row (look at the path from x "
            "through sigma)",
            "sigma was treated as a constant: the - xhat * mean(g * xhat) term is missing",
            LAYERNORM_DX,
            lambda c: "x" in c.wrong and _rows_sum_to_zero(c.mine["x"])
            and rows_parallel(c.diff("x"), _xhat(c))),
    Mistake("dgamma and dbeta are swapped (look at which one is multiplied by xhat)",
            "gamma multiplies xhat and beta is added: dgamma is the sum of dout * xhat, dbeta "
            "the sum of dout",
            "dgamma = (dout * xhat).reshape(-1, D).sum(0), dbeta = dout.reshape(-1, D).sum(0)",
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


RMSNORM_DX = ("dx = rstd * (g - xhat * (g * xhat).mean(-1, keepdims=True)), "
              "g = dout * gamma")

RMSNORM_HINTS = (
    Mistake("dx - (the right dx) is a multiple of xhat in every row (look at the path from x "
            "through r)",
            "r was treated as a constant: r depends on every x_i of the row, which adds the "
            "- xhat * mean(g * xhat) term",
            RMSNORM_DX, lambda c: "x" in c.wrong and rows_parallel(c.diff("x"), _rms_xhat(c))),
    Mistake("dx is off by the same number across each row (look at the terms you subtract)",
            "that is LayerNorm's - mean(g) term, but RMSNorm subtracts no mean, so its "
            "backward has none",
            RMSNORM_DX,
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


SOFTMAX_DS = "ds = p * (dp - (dp * p).sum(-1, keepdims=True))"


def _diagonal_only(c):
    """ds = p (1 - p) dp: the Jacobian's diagonal alone (p*dout - p*p*dout)."""
    p = _probs(c)
    return "scores" in c.wrong and close(c.mine.get("scores"), p * (1 - p) * c.dout)


SOFTMAX_HINTS = (
    Mistake("masked entries (or all-masked rows) get a gradient or NaN (look at what "
            "multiplies your result)",
            "masked entries must get zero gradient: p is 0 there and does not depend on the "
            "scores, and ds = p * (...) keeps it 0; no NaN either",
            SOFTMAX_DS,
     lambda c: c.mine.get("scores") is not None and c.case.inputs[0].shape[-2:] == SOFTMAX_MASK.shape
     and not (np.nan_to_num(c.mine["scores"], nan=1.0)[..., ~SOFTMAX_MASK] == 0).all()),
    Mistake("ds - (the right ds) is a multiple of p in every row (look at the sum over the "
            "row)",
            "the - p p^T part of the Jacobian is missing: every p_i depends on every score of "
            "its row through the normalising sum",
            SOFTMAX_DS,
            lambda c: "scores" in c.wrong and rows_parallel(c.diff("scores"), _probs(c))),
    Mistake("ds is p * (1 - p) * dout, the Jacobian's diagonal alone (look at what a change "
            "of one score does to the other entries of its row)",
            "dp_i/ds_j = p_i (delta_ij - p_j) is a full K x K matrix: its off-diagonal part "
            "- p_i p_j sends every dp_i to every score of the row, so ds_j needs the sum "
            "over i, not the i = j term only",
            SOFTMAX_DS, _diagonal_only),
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
    Mistake("silu's gradient is dout * sigmoid(x) (look at silu's derivative)",
            "silu(x) = x * sigmoid(x) is a product: the product rule gives two terms, not "
            "sigmoid(x) alone",
            "silu'(x) = s + x * s * (1 - s), s = sigmoid(x)",
     lambda c: c.case.extra["fn"] == "silu"
     and close(c.mine.get("x"), c.dout * _sigmoid(c.case.inputs[0]))),
    Mistake("the two halves of dh are exchanged (look at which factor multiplies dout in "
            "each half)",
            "each half's gradient is the *other* factor times dout, and the gate's comes first",
            "dh = [silu'(gate) * dout * up | dout * silu(gate)]",
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


ATTENTION_DQ = "ds = softmax_backward(dP, P) * scale; dq = ds @ k; dk = ds^T @ q"

ATTENTION_HINTS = (
    Mistake("dq and dk are sqrt(d_k) times too large (look at the forward's scale)",
            "the scores were scaled by 1/sqrt(d_k) in the forward, so dS is scaled by it in "
            "the backward (the scale was forgotten)",
            ATTENTION_DQ,
     lambda c: any(c.scaled(n, math.sqrt(c.case.inputs[0].shape[-1])) for n in ("q", "k"))),
    Mistake("dq and dk are 1/sqrt(d_k) times the right ones (look at where you apply the "
            "scale)",
            "the scale was applied once too often: apply it to dS or to dq and dk, not to both",
            ATTENTION_DQ,
     lambda c: any(c.scaled(n, 1 / math.sqrt(c.case.inputs[0].shape[-1])) for n in ("q", "k"))),
    Mistake("dv is wrong only with dropout (look at which weights multiplied v)",
            "dv uses P, the weights before dropout: the values were multiplied by "
            "P' = dropout(P)",
            "dv = P'^T dout: probs_d.swapaxes(-1, -2) @ dout",
     lambda c: c.case.extra["p"] > 0 and "v" in c.wrong and close(c.mine.get("v"), _dv_from_p(c))),
    Mistake("dq and dk are wrong only with dropout (look at what you pass to the softmax "
            "backward)",
            "the softmax backward got P' (after dropout): the softmax produced P, so it needs "
            "P, and the gradient of P (through the dropout) as its dout",
            "ds = softmax_backward(dropout_backward(dout @ v^T, drop), P) * scale",
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
    Mistake("the output projection is right but the input projection is not (look at how dq, "
            "dk and dv go back into d[Q | K | V])",
            "the backward of a split is a merge: each of dq, dk and dv is merged back to "
            "(B, T, D) (transpose, then reshape) and they are concatenated in that order",
            "d[Q | K | V] = concatenate([merge(dq), merge(dk), merge(dv)], axis=-1), "
            "merge(a) = a.transpose(0, 2, 1, 3).reshape(B, T, D)",
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
    Mistake("dx lacks a term (look at the sum x + f(...))",
            "the identity path: x + f(...) hands its gradient to x directly too (fan-out "
            "sums: x is used twice)",
            "pre-norm: dx = dout + (the branch's dx); post-norm: dx = dz + (the branch's dx), "
            "dz the gradient below the LayerNorm",
     lambda c: "x" in c.wrong and close(c.mine.get("x"), c.ref["x"] - (
         c.dout if c.case.extra["norm_first"] else _dz(c)))),
    Mistake("post-norm's dx is wrong, pre-norm's right (look at what the identity path "
            "carries)",
            "post-norm: the identity path must carry the gradient below the LayerNorm, not "
            "dout itself",
            "dz = layernorm_backward(dout, ...)[0]; dx = dz + (the linear's dx of dz)",
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


CE_DZ = ("grad = exp(logp) - eps / V; grad[n, t] -= 1 - eps; "
         "dlogits = grad * (valid * dout / count)[:, None]")

CE_HINTS = (
    Mistake("dlogits is count times too large (look at the loss's mean)",
            "the loss is a mean over the real (not ignored) targets, so divide by their count",
            CE_DZ,
     lambda c: _valid(c).any() and c.scaled("logits", float(_valid(c).sum()))),
    Mistake("dlogits is count / N of the right one (look at what you divide by)",
            "divided by every row (N, ignored ones included) instead of the number of real "
            "targets", CE_DZ,
     lambda c: _valid(c).any() and c.scaled("logits", _valid(c).sum() / len(_valid(c)))),
    Mistake("ignored rows get a gradient (look at the rows whose target is ignore_index)",
            "ignored rows must get zero gradient: they are not in the loss, and their target "
            "is not a class", CE_DZ,
     lambda c: c.mine.get("logits") is not None
     and not (np.nan_to_num(c.mine["logits"], nan=1.0)[~_valid(c)] == 0).all()),
    Mistake("with label smoothing, dlogits is off by the same number across each row (look "
            "at the smoothed target q)",
            "smoothing puts eps / V on every class, the target included, and 1 - eps more at "
            "the target", CE_DZ,
     lambda c: c.case.extra["smoothing"] > 0 and "logits" in c.wrong and rows_parallel(
         c.diff("logits"), np.ones_like(c.ref["logits"]))),
)


# -- 12. Adam (an update, not a backward: checked by checker.check_adam) ------------------------

ADAM_STEP = ("step = lr / (1 - beta1^t); denom = sqrt(v) / sqrt(1 - beta2^t) + eps; "
             "p -= step * m / denom")
ADAM_ZERO_DIVISION = "t starts at 1 (1 - beta^0 = 0 divides by zero)"
ADAM_HINTS = {
    "no_bias_correction": Mistake(
        "the first steps are the wrong size (look at m and v in the first steps: both start "
        "at 0)", "bias correction: m and v start at 0, so their weights sum to 1 - beta^t, "
        "not 1; divide by it", ADAM_STEP),
    "corrected_state": Mistake(
        "m (or v) drifts from the right one after the first step (look at what you store "
        "back into m and v)", "m (or v) was stored bias-corrected: keep the running averages "
        "uncorrected and correct a copy", ADAM_STEP),
    "eps_inside": Mistake(
        "the steps are off where v is small (look at where eps goes)",
        "eps belongs outside the square root", "denom = sqrt(v) / sqrt(1 - beta2^t) + eps"),
    "efficient_form": Mistake(
        "the steps are off where v is small (look at the scale eps is added at)",
        "this is the Adam paper's 'efficient' form, with eps at another scale",
        "denom = sqrt(v) / sqrt(1 - beta2^t) + eps, as PyTorch computes it"),
    "nan": Mistake("NaN or inf in p, m or v (look at t in the first step)",
                   ADAM_ZERO_DIVISION, "1 - beta1 ** t with t = 1, 2, ... as it is passed"),
    "decay": Mistake(
        "right without weight decay, wrong with it (look at how weight decay enters)",
        "Adam adds wd * p to the gradient; AdamW (decoupled) shrinks p by (1 - lr * wd) first",
        "Adam: g = g + wd * p (a copy, before m and v); AdamW: p *= 1 - lr * wd, before the "
        "update"),
}


def _staged(name, number, title, section, cases, chain):
    """The staged exercise listed before exercise ``number``: its file is numbered ``04a_``, so
    that no file of a folder made before the staged exercises existed changes its name."""
    return Exercise(name, number, title, section, writes=(f"{name}_backward",), cases=cases,
                    chain=chain, part="a")


def _layer(name, number, title, section, cases, hints, prefix=None):
    """The exercise of one layer pair: the learner writes ``PREFIX_backward`` (``prefix``: the
    name unless given), and a finale takes ``PREFIX_forward`` and ``PREFIX_backward``."""
    prefix = prefix or name
    return Exercise(name, number, title, section, (f"{prefix}_backward",),
                    (f"{prefix}_forward", f"{prefix}_backward"), cases, hints)


EXERCISES = (
    _layer("linear", 1, "Linear layer", "Linear", linear_cases, LINEAR_HINTS),
    _layer("embedding", 2, "Token embedding", "Embedding", embedding_cases, EMBEDDING_HINTS),
    _layer("dropout", 3, "Dropout", "Dropout", dropout_cases, DROPOUT_HINTS),
    _staged("layernorm_staged", 4, "LayerNorm, step by step", "LayerNorm",
            staged.layernorm_staged_cases, staged.LAYERNORM),
    _layer("layernorm", 4, "LayerNorm", "LayerNorm", layernorm_cases, LAYERNORM_HINTS),
    _staged("rmsnorm_staged", 5, "RMSNorm, step by step", "RMSNorm",
            staged.rmsnorm_staged_cases, staged.RMSNORM),
    _layer("rmsnorm", 5, "RMSNorm", "RMSNorm", rmsnorm_cases, RMSNORM_HINTS),
    _staged("attention_staged", 6, "Masked softmax and attention, step by step", "Attention",
            staged.attention_staged_cases, staged.ATTENTION),
    _layer("softmax", 6, "Masked softmax", "Softmax", softmax_cases, SOFTMAX_HINTS),
    Exercise("swiglu", 7, "SiLU and SwiGLU", "SwiGLU", ("silu_backward", "swiglu_backward"),
             ("silu_forward", "silu_backward", "swiglu_forward", "swiglu_backward"),
             swiglu_cases, SWIGLU_HINTS),
    _layer("attention", 8, "Scaled dot-product attention", "Attention", attention_cases,
           ATTENTION_HINTS),
    _layer("multi_head_attention", 9, "Multi-head attention, fused projection",
           "Multi-head attention", mha_cases, MHA_HINTS, prefix="mha"),
    _layer("residual", 10, "Residual block, both orders", "Residual and layer order",
           residual_cases, RESIDUAL_HINTS),
    _staged("cross_entropy_staged", 11, "Cross-entropy with label smoothing, step by step",
            "Cross-entropy", staged.cross_entropy_staged_cases, staged.CROSS_ENTROPY),
    _layer("cross_entropy", 11, "Cross-entropy, ignore_index, label smoothing", "Cross-entropy",
           cross_entropy_cases, CE_HINTS),
    Exercise("adam", 12, "The Adam step", "Adam", ("adam_step",), ("adam_step",)),
)

BY_NAME = {e.name: e for e in EXERCISES}


def find(name):
    """The exercise called ``name`` (ValueError listing the names otherwise)."""
    if name not in BY_NAME:
        raise ValueError(f"NAME: expected one of {', '.join(BY_NAME)}, got {name!r}")
    return BY_NAME[name]
