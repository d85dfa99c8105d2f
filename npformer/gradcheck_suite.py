"""Every layer's gradient check as a library function: ``npformer gradcheck`` prints the table.

Each check compares a hand-written backward with central differences in float64 (see
``npformer.gradcheck``), entry by entry or, with ``fast=True``, along random directions. For
modules, the module's own parameter arrays are the inputs, perturbed in place, so every
``.grad`` is checked along with the input gradients.

    for row in run_gradchecks(fast=True):
        print(row.name, row.result.worst.status, row.result.ok)
"""
import time
from dataclasses import dataclass

import numpy as np

from . import functional as F
from .gradcheck import (ATOL, RTOL, STATUSES, GradcheckResult, gradcheck as _gradcheck,
                        relative_text)
from .nn import (GPT, DecoderLayer, EncoderLayer, FeedForward, LayerNorm, Linear,
                 MultiHeadAttention, Transformer)
from .testing import module_function, pair_fn


@dataclass
class CheckRow:
    name: str
    result: GradcheckResult
    seconds: float


def _rnd(rng, *shape):
    return rng.standard_normal(shape)


def _module_check_any(module, forward, backward, x_inputs, names, max_entries=None, seed=0,
                      gradcheck=_gradcheck):
    return gradcheck(module_function(module, forward, backward, len(x_inputs)),
                     [*x_inputs, *[p.data for _, p in module.named_parameters()]], seed=seed,
                     max_entries=max_entries, names=names + [n for n, _ in module.named_parameters()])


def _f64(seed):
    return dict(rng=np.random.default_rng(seed), dtype=np.float64)


def _checks(max_entries, fast=False):
    """(name, thunk) for every check, cheapest first; ``fast``: each in the fast mode."""
    def gradcheck(*args, **kwargs):
        return _gradcheck(*args, fast=fast, **kwargs)

    def _module_check(*args, **kwargs):
        return _module_check_any(*args, gradcheck=gradcheck, **kwargs)
    rng = np.random.default_rng(0)
    ids = np.array([[1, 2, 2, 0], [3, 1, 0, 0]])
    tgt = np.array([[1, 2, 3, 0], [1, 1, 1, 1]])
    src = np.array([[1, 2, 0], [1, 1, 1]])
    relu_x = _rnd(rng, 4, 9)
    relu_x[np.abs(relu_x) < 1e-3] = 0.5                      # away from the kink
    smask = rng.random((3, 6)) > 0.4
    targets = np.array([3, 0, 5, 1, 0, 2])

    def ce(z):
        loss, cache = F.cross_entropy_forward(z, targets, 0, 0.1)
        return np.array(loss), lambda d: F.cross_entropy_backward(float(d), cache)

    def softmax(s):
        p, cache = F.softmax_forward(s, smask)
        return p, lambda d: F.softmax_backward(d, cache)

    def embedding(w):
        out, cache = F.embedding_forward(ids, w, np.sqrt(6))
        return out, lambda d: F.embedding_backward(d, cache)

    def attention(q, k, v):
        out, cache = F.attention_forward(q, k, v, F.decoder_self_mask(tgt, 0))
        return out, lambda d: F.attention_backward(d, cache)

    def model_check():
        model = Transformer(7, 6, d_model=8, n_heads=2, d_ff=12, n_encoder_layers=1,
                            n_decoder_layers=1, dropout=0.0, dtype=np.float64, seed=0)
        s, t = np.array([[4, 5, 6], [3, 4, 5]]), np.array([[1, 4, 5], [1, 2, 3]])   # no <pad>: its row is frozen
        return _module_check(model, lambda: model.forward(s, t), model.backward, [], [],
                             max_entries=max_entries)

    def positions(x, w):
        out, cache = F.position_embedding_forward(x, w, start=1)
        return out, lambda d: F.position_embedding_backward(d, cache)

    cos, sin = F.rotary_tables(6, 4, np.float64)

    def rotary(x):
        out, cache = F.rotary_forward(x, cos, sin, start=2)
        return out, lambda d: F.rotary_backward(d, cache)

    def gpt_check(positions="learned"):
        model = GPT(7, d_model=8, n_heads=2, d_ff=12, n_layers=2, max_len=6, dropout=0.0,
                    positions=positions, dtype=np.float64, seed=0)
        ids = np.array([[1, 4, 5, 6], [3, 0, 2, 5]])
        return _module_check(model, lambda: model.forward(ids), model.backward, [], [],
                             max_entries=max_entries)

    def lin():
        m = Linear(5, 3, **_f64(0))
        return _module_check(m, m.forward, m.backward, [_rnd(rng, 2, 4, 5)], ["x"])

    def ln():
        m = LayerNorm(6, dtype=np.float64)
        m.weight.data[:] = np.linspace(0.5, 1.5, 6)
        return _module_check(m, m.forward, m.backward, [_rnd(rng, 3, 6)], ["x"])

    def ffn():
        m = FeedForward(6, 10, activation="gelu", **_f64(0))
        return _module_check(m, m.forward, m.backward, [_rnd(rng, 2, 3, 6)], ["x"])

    def mha_self():
        m = MultiHeadAttention(8, 2, **_f64(0))
        mask = F.decoder_self_mask(tgt, 0)
        return _module_check(m, lambda x: m.forward(x, mask=mask), m.backward,
                             [_rnd(rng, 2, 4, 8)], ["x"])

    def mha_rotary():
        m = MultiHeadAttention(8, 2, rotary=(cos, sin), **_f64(0))
        mask = F.causal_mask(4)
        return _module_check(m, lambda x: m.forward(x, mask=mask), m.backward,
                             [_rnd(rng, 2, 4, 8)], ["x"])

    def mha_cross():
        m = MultiHeadAttention(8, 2, **_f64(0))
        mask = F.padding_mask(src, 0)
        return _module_check(m, lambda x, mem: m.forward(x, mem, mask), m.backward,
                             [_rnd(rng, 2, 4, 8), _rnd(rng, 2, 3, 8)], ["x", "memory"])

    def enc():
        m = EncoderLayer(8, 2, 12, dropout=0.0, **_f64(0))
        mask = F.padding_mask(tgt, 0)
        return _module_check(m, lambda x: m.forward(x, mask), m.backward, [_rnd(rng, 2, 4, 8)],
                             ["x"], max_entries=max_entries)

    def dec():
        m = DecoderLayer(8, 2, 12, dropout=0.0, **_f64(0))
        return _module_check(
            m, lambda x, mem: m.forward(x, mem, F.decoder_self_mask(tgt, 0), F.padding_mask(src, 0)),
            m.backward, [_rnd(rng, 2, 4, 8), _rnd(rng, 2, 3, 8)], ["x", "memory"],
            max_entries=max_entries)

    return [
        ("linear", lambda: gradcheck(pair_fn(F.linear_forward, F.linear_backward),
                                     [_rnd(rng, 2, 3, 5), _rnd(rng, 4, 5), _rnd(rng, 4)],
                                     names=["x", "weight", "bias"])),
        ("embedding", lambda: gradcheck(embedding, [_rnd(rng, 5, 6)], names=["weight"])),
        ("layernorm", lambda: gradcheck(pair_fn(F.layernorm_forward, F.layernorm_backward),
                                        [_rnd(rng, 3, 4, 7), 1 + 0.1 * _rnd(rng, 7), _rnd(rng, 7)],
                                        names=["x", "gamma", "beta"])),
        ("rmsnorm", lambda: gradcheck(pair_fn(F.rmsnorm_forward, F.rmsnorm_backward),
                                      [_rnd(rng, 3, 4, 7), 1 + 0.1 * _rnd(rng, 7)],
                                      names=["x", "gamma"])),
        ("swiglu", lambda: gradcheck(pair_fn(F.swiglu_forward, F.swiglu_backward),
                                     [_rnd(rng, 3, 2, 10)], names=["gate | up"])),
        ("geglu", lambda: gradcheck(pair_fn(lambda h: F.gated_forward(h, "gelu_tanh"),
                                              F.gated_backward),
                                    [_rnd(rng, 3, 2, 10)], names=["gate | up"])),
        ("relu", lambda: gradcheck(pair_fn(F.relu_forward, F.relu_backward), [relu_x.copy()],
                                   names=["x"])),
        ("gelu", lambda: gradcheck(pair_fn(F.gelu_forward, F.gelu_backward), [_rnd(rng, 4, 9)],
                                   names=["x"])),
        ("gelu_tanh", lambda: gradcheck(pair_fn(F.gelu_tanh_forward, F.gelu_tanh_backward),
                                        [_rnd(rng, 4, 9)], names=["x"])),
        ("learned positions", lambda: gradcheck(positions, [_rnd(rng, 2, 3, 5), _rnd(rng, 6, 5)],
                                                names=["x", "weight"])),
        ("rotary positions", lambda: gradcheck(rotary, [_rnd(rng, 2, 3, 4, 4)],
                                               names=["x"])),
        ("soft-capping", lambda: gradcheck(
            pair_fn(lambda x: F.softcap_forward(x, 2.0), F.softcap_backward),
            [2.0 * _rnd(rng, 3, 5)], names=["x"])),
        ("masked softmax", lambda: gradcheck(softmax, [_rnd(rng, 3, 6)], names=["scores"])),
        ("attention (causal+padding)", lambda: gradcheck(
            attention, [_rnd(rng, 2, 3, 4, 4), _rnd(rng, 2, 3, 4, 4), _rnd(rng, 2, 3, 4, 6)],
            names=["q", "k", "v"])),
        ("cross-entropy (smoothing)", lambda: gradcheck(ce, [_rnd(rng, 6, 7)], names=["logits"])),
        ("Linear module", lin),
        ("LayerNorm module", ln),
        ("FeedForward module (gelu)", ffn),
        ("MultiHeadAttention self", mha_self),
        ("MultiHeadAttention rotary", mha_rotary),
        ("MultiHeadAttention cross", mha_cross),
        ("EncoderLayer", enc),
        ("DecoderLayer", dec),
        ("Transformer (whole model)", model_check),
        ("GPT (whole model)", gpt_check),
        ("GPT rotary (whole model)", lambda: gpt_check("rotary")),
    ]


def check_names():
    return [name for name, _ in _checks(None)]


def run_gradchecks(only=None, max_entries=30, fast=False):
    """Run the checks (all, or those whose name contains one of ``only``); list of ``CheckRow``.

    ``max_entries`` bounds the entries checked per array of the larger modules (None: all);
    ``fast`` checks random directions instead of entries.
    """
    rows = []
    checks = _checks(max_entries, fast)
    if only:
        checks = [(n, f) for n, f in checks if any(o.lower() in n.lower() for o in only)]
        if not checks:
            raise ValueError(f"only: no check matches {only}; the checks are {check_names()}")
    for name, thunk in checks:
        start = time.perf_counter()
        result = thunk()
        rows.append(CheckRow(name, result, time.perf_counter() - start))
    return rows


def format_table(rows):
    """A plain-text table: check, the worst input with its status and errors, verdict, seconds.
    The worst input is the one furthest from passing (a MISSING or WRONG one first)."""
    width = max(len(word) for word in STATUSES)            # "not differentiable" in full
    lines = [f"{'check':<30s} {'worst input':<34s} {'status':<{width}s} {'abs err':>8s} "
             f"{'rel err':>8s} {'ok':<4s} {'s':>5s}"]
    lines.append("-" * len(lines[0]))
    for row in rows:
        r = row.result
        worst = r.worst
        name = "-" if worst is None else worst.name
        status = "-" if worst is None else worst.status
        if status == "MISSING":
            name = "no gradient: " + name
        errors = (f"{worst.abs_error:>8.1e} {relative_text(worst, r.atol):>8s}"
                  if worst is not None and worst.abs_error is not None else f"{'-':>8s} {'-':>8s}")
        lines.append(f"{row.name:<30s} {name[:34]:<34s} {status:<{width}s} {errors} "
                     f"{'PASS' if r.ok else 'FAIL':<4s} {row.seconds:5.2f}")
    ok = sum(row.result.ok for row in rows)
    mode = "random directions" if rows and rows[0].result.fast else "every entry"
    lines.append(f"{ok}/{len(rows)} passed (|a - n| <= {ATOL:.0e} + {RTOL:.0e} |n|, float64 "
                 f"central differences, {mode})")
    return "\n".join(lines)
