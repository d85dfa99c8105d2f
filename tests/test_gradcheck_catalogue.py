"""The gradient checker against the mistakes of docs/backprop.md's "What goes wrong" paragraphs.

Each mistake that makes a backward disagree with its own forward is written here as a wrong
backward beside the right one, on the same inputs: the right one must PASS and the wrong one
must FAIL, in the full check and in the fast mode. Mistakes whose shapes cannot agree are
refused by shape (a ValueError naming the gradient), which is the check doing its job too.
The mistakes a gradient check cannot see are listed in ``INVISIBLE`` with the reason, and the
test that does see each is named there.
"""
import math
import zlib

import numpy as np
import pytest

import npformer as nf
from npformer import functional as F
from npformer.testing import pair_fn

ROOT2PI = math.sqrt(2 / math.pi)


def rnd(rng, *shape):
    return rng.standard_normal(shape)


# -- the wrong backwards, one per mistake -----------------------------------------------------

def linear_case(rng):
    """Linear: dW = X^T dY, the x @ W layout's gradient, for PyTorch's (out, in) weight (a square
    weight, so the shapes agree and it runs)."""
    def wrong(dy, cache):
        dx, dw, db = F.linear_backward(dy, cache)
        return dx, dw.T, db
    return pair_fn(F.linear_forward, F.linear_backward), pair_fn(F.linear_forward, wrong), \
        [rnd(rng, 2, 3, 4), rnd(rng, 4, 4), rnd(rng, 4)]


def embedding_cases():
    ids = np.array([[1, 2, 1], [0, 1, 3]])                     # id 1 three times
    forward = lambda w: F.embedding_forward(ids, w, scale=math.sqrt(3))

    def overwrite(dout, cache):                                # dw[ids] += dout
        _, shape, scale = cache
        dw = np.zeros(shape)
        dw[ids.reshape(-1)] += dout.reshape(-1, shape[1]) * scale
        return dw

    def no_scale(dout, cache):
        return F.embedding_backward(dout, cache) / cache[2]
    right = pair_fn(forward, F.embedding_backward)
    inputs = lambda rng: [rnd(rng, 4, 3)]
    return {"embedding: dw[ids] += dout overwrites repeated ids": (right, pair_fn(forward, overwrite), inputs),
            "embedding: the scale s forgotten in the backward": (right, pair_fn(forward, no_scale), inputs)}


def positions_case(rng):
    """Learned positions: the batch axis hidden by broadcasting; dw from dout[0] alone."""
    forward = lambda x, w: F.position_embedding_forward(x, w, start=1)

    def first_row(dout, cache):
        dx, dw = F.position_embedding_backward(dout, cache)
        start, t, _ = cache
        dw = np.zeros_like(dw)
        dw[start:start + t] = dout[0]
        return dx, dw
    return pair_fn(forward, F.position_embedding_backward), pair_fn(forward, first_row), \
        [rnd(rng, 3, 4, 5), rnd(rng, 6, 5)]


def dropout_cases():
    def forward(x):
        return F.dropout_forward(x, 0.3, np.random.default_rng(7), training=True)

    def new_mask(dout, cache):
        _, scale = cache
        keep = np.random.default_rng(8).random(dout.shape) >= 0.3
        return dout * keep * scale

    def no_scale(dout, cache):
        keep, _ = cache
        return dout * keep
    right = pair_fn(forward, F.dropout_backward)
    inputs = lambda rng: [rnd(rng, 4, 8)]
    return {"dropout: a new mask drawn in the backward": (right, pair_fn(forward, new_mask), inputs),
            "dropout: the scale 1/(1-p) forgotten in the backward": (right, pair_fn(forward, no_scale), inputs)}


def layernorm_cases():
    def constants(dy, cache):                                  # mu, sigma treated as constants
        xhat, rstd, gamma = cache
        dx, dg, db = F.layernorm_backward(dy, cache)
        return dy * gamma * rstd, dg, db

    def one_mean_term(keep):
        def backward(dy, cache):
            xhat, rstd, gamma = cache
            dxhat = dy * gamma
            dx = dxhat
            if keep == "mean":
                dx = dx - dxhat.mean(-1, keepdims=True)
            else:
                dx = dx - xhat * (dxhat * xhat).mean(-1, keepdims=True)
            _, dg, db = F.layernorm_backward(dy, cache)
            return dx * rstd, dg, db
        return backward
    right = pair_fn(F.layernorm_forward, F.layernorm_backward)
    inputs = lambda rng: [rnd(rng, 3, 4, 6), 1 + 0.3 * rnd(rng, 6), rnd(rng, 6)]
    return {
        "layernorm: mu and sigma treated as constants (dx = r g)":
            (right, pair_fn(F.layernorm_forward, constants), inputs),
        "layernorm: the mean term of mu kept, sigma's dropped":
            (right, pair_fn(F.layernorm_forward, one_mean_term("mean")), inputs),
        "layernorm: sigma's term kept, the mean of dxhat dropped":
            (right, pair_fn(F.layernorm_forward, one_mean_term("sigma")), inputs),
    }


def rmsnorm_cases():
    def constant_r(dout, cache):                               # r treated as a constant
        xhat, rstd, gamma, _ = cache
        return dout * gamma * rstd, F.rmsnorm_backward(dout, cache)[1]

    def layernorm_mean(dout, cache):                           # LayerNorm's backward copied
        xhat, rstd, gamma, _ = cache
        g = dout * gamma
        dx = rstd * (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True))
        return dx, F.rmsnorm_backward(dout, cache)[1]
    right = pair_fn(F.rmsnorm_forward, F.rmsnorm_backward)
    inputs = lambda rng: [rnd(rng, 3, 4, 6), 1 + 0.3 * rnd(rng, 6)]
    return {"rmsnorm: r treated as a constant (dx = r g)":
                (right, pair_fn(F.rmsnorm_forward, constant_r), inputs),
            "rmsnorm: LayerNorm's mean term kept (-mean(g))":
                (right, pair_fn(F.rmsnorm_forward, layernorm_mean), inputs)}


def swiglu_cases():
    def swapped(dout, cache):                                  # d gate and d up exchanged
        act, up, silu_cache = cache
        return np.concatenate([dout * act, F.silu_backward(dout * up, silu_cache)], axis=-1)

    def sigmoid_only(dout, cache):                             # silu' taken as sigmoid(gate)
        act, up, (gate, s) = cache
        return np.concatenate([dout * up * s, dout * act], axis=-1)
    right = pair_fn(F.swiglu_forward, F.swiglu_backward)
    inputs = lambda rng: [rnd(rng, 3, 2, 8)]
    return {"swiglu: the gate's and the up projection's gradients swapped":
                (right, pair_fn(F.swiglu_forward, swapped), inputs),
            "swiglu: silu's derivative taken as sigmoid (the product rule's x s (1 - s) lost)":
                (right, pair_fn(F.swiglu_forward, sigmoid_only), inputs)}


def gelu_cases():
    """Mixing the two GELUs: the forward of one, the backward of the other."""
    def tanh_derivative(dout, cache):
        x = cache
        u = ROOT2PI * (x + 0.044715 * x ** 3)
        t = np.tanh(u)
        return dout * (0.5 * (1 + t) + 0.5 * x * (1 - t ** 2) * ROOT2PI * (1 + 3 * 0.044715 * x ** 2))

    def erf_derivative(dout, cache):
        x = cache
        from math import erf
        cdf = 0.5 * (1 + np.vectorize(erf)(x / math.sqrt(2)))
        return dout * (cdf + x * np.exp(-x ** 2 / 2) / math.sqrt(2 * math.pi))

    def erf_forward(x):
        out, _ = F.gelu_forward(x)
        return out, x

    def tanh_forward(x):
        out, _ = F.gelu_tanh_forward(x)
        return out, x
    inputs = lambda rng: [2 * rnd(rng, 4, 9)]
    return {
        "gelu: the exact (erf) forward with the tanh form's derivative":
            (pair_fn(erf_forward, erf_derivative), pair_fn(erf_forward, tanh_derivative), inputs),
        "gelu: the tanh form's forward with the exact (erf) derivative":
            (pair_fn(tanh_forward, tanh_derivative), pair_fn(tanh_forward, erf_derivative), inputs),
    }


def softmax_case(rng):
    """Masked scores filled with 0 instead of -inf, with the unmasked softmax backward: the masked
    scores no longer depend on their inputs, yet the backward gives them a gradient."""
    mask = np.array([[True, True, False, True, False, True]] * 3)

    def fill_zero(s):
        p, _ = F.softmax_forward(np.where(mask, s, 0.0))
        return p, p
    right = pair_fn(lambda s: F.softmax_forward(s, mask), F.softmax_backward)
    return right, pair_fn(fill_zero, F.softmax_backward), [rnd(rng, 3, 6)]


def softcap_cases():
    cap = 2.0
    forward = lambda x: F.softcap_forward(x, cap)

    def outer_cap_kept(dout, t):                               # dx = dout * c (1 - t^2)
        return dout * cap * (1 - t * t)

    def identity(dout, t):                                     # the cap as if it were y = x
        return dout
    right = pair_fn(forward, F.softcap_backward)
    inputs = lambda rng: [cap * rnd(rng, 3, 5)]               # of the cap's size: tanh bends
    return {"soft-capping: the outer cap kept, the inner 1/cap forgotten (dx = c (1 - t^2) dy)":
                (right, pair_fn(forward, outer_cap_kept), inputs),
            "soft-capping: the cap treated as the identity (dx = dy)":
                (right, pair_fn(forward, identity), inputs)}


def attention_cases():
    mask = F.causal_mask(4)

    def forward(q, k, v):
        return F.attention_forward(q, k, v, mask, 0.25, np.random.default_rng(1), training=True)

    def parts(dout, cache):
        q, k, v, probs, probs_d, drop_cache, scale = cache
        dv = probs_d.swapaxes(-1, -2) @ dout
        dprobs_d = dout @ v.swapaxes(-1, -2)
        return q, k, probs, probs_d, drop_cache, scale, dv, dprobs_d

    def dropped_probs(dout, cache):                            # P' passed to the softmax backward
        q, k, probs, probs_d, drop_cache, scale, dv, dprobs_d = parts(dout, cache)
        ds = F.softmax_backward(F.dropout_backward(dprobs_d, drop_cache), probs_d) * scale
        return ds @ k, ds.swapaxes(-1, -2) @ q, dv

    def scale_times(n):
        def backward(dout, cache):
            q, k, probs, probs_d, drop_cache, scale, dv, dprobs_d = parts(dout, cache)
            ds = F.softmax_backward(F.dropout_backward(dprobs_d, drop_cache), probs)
            ds = ds * scale if n else ds
            return (ds @ k) * (scale if n == 2 else 1), ds.swapaxes(-1, -2) @ q, dv
        return backward

    def no_transpose(dout, cache):                             # dK = c dS Q
        q, k, probs, probs_d, drop_cache, scale, dv, dprobs_d = parts(dout, cache)
        ds = F.softmax_backward(F.dropout_backward(dprobs_d, drop_cache), probs) * scale
        return ds @ k, ds @ q, dv
    right = pair_fn(forward, F.attention_backward)
    inputs = lambda rng: [rnd(rng, 2, 2, 4, 3), rnd(rng, 2, 2, 4, 3), rnd(rng, 2, 2, 4, 5)]
    return {
        "attention: P' (after dropout) passed to the softmax backward":
            (right, pair_fn(forward, dropped_probs), inputs),
        "attention: the scale c forgotten in the backward": (right, pair_fn(forward, scale_times(0)), inputs),
        "attention: the scale c applied to dS and again to dQ":
            (right, pair_fn(forward, scale_times(2)), inputs),
        "attention: dK = c dS Q without the transpose (self-attention, Tq = Tk)":
            (right, pair_fn(forward, no_transpose), inputs),
    }


def mha_cases():
    """Multi-head attention's pieces: two cross-attentions reading one memory (as two decoder
    layers do), and the fused projection whose input gradient is built in pieces."""
    def two_reads(x, mem, wa, wb):
        out_a, ca = F.linear_forward(mem, wa)
        out_b, cb = F.linear_forward(mem, wb)
        return x * (out_a + out_b), (x, out_a + out_b, ca, cb)

    def memory_backward(add):
        def backward(dout, cache):
            x, s, ca, cb = cache
            dmem_a, dwa, _ = F.linear_backward(dout * x, ca)
            dmem_b, dwb, _ = F.linear_backward(dout * x, cb)
            dmem = dmem_a + dmem_b if add else dmem_b          # the loop's `dmemory =`
            return dout * s, dmem, dwa, dwb
        return backward

    def fused(x, w):                                           # q, k, v rows of one weight
        out, cache = F.linear_forward(x, w)
        d = x.shape[-1]
        q, k, v = out[..., :d], out[..., d:2 * d], out[..., 2 * d:]
        return q * k + v, (q, k, cache)

    def fused_backward(accumulate):
        def backward(dout, cache):
            q, k, c = cache
            dqkv = np.concatenate([dout * k, dout * q, dout], axis=-1)
            x2, shape, w = c
            d = shape[-1]
            dx = np.zeros(shape)
            for part in range(3):
                piece = dqkv[..., part * d:(part + 1) * d] @ w[part * d:(part + 1) * d]
                dx = dx + piece if accumulate else piece        # `dx[...] =` per piece
            dw = dqkv.reshape(-1, 3 * d).T @ x2
            return dx, dw
        return backward
    inputs_mem = lambda rng: [rnd(rng, 2, 3, 4), rnd(rng, 2, 3, 5), rnd(rng, 4, 5), rnd(rng, 4, 5)]
    inputs_fused = lambda rng: [rnd(rng, 2, 3, 4), rnd(rng, 12, 4)]
    return {
        "multi-head attention: dmemory overwritten instead of added over layers":
            (pair_fn(two_reads, memory_backward(True)), pair_fn(two_reads, memory_backward(False)),
             inputs_mem),
        "multi-head attention: a gradient built in pieces assigned (=) instead of added":
            (pair_fn(fused, fused_backward(True)), pair_fn(fused, fused_backward(False)), inputs_fused),
    }


def grouped_query_cases():
    """Grouped-query attention's shared heads: K and V (B, 1, T, d) serve two query heads."""
    mask = F.causal_mask(3)

    def forward(q, k, v):
        out, cache = F.attention_forward(q, np.repeat(k, 2, axis=1), np.repeat(v, 2, axis=1), mask)
        return out, cache

    def backward(combine):
        def b(dout, cache):
            dq, dk, dv = F.attention_backward(dout, cache)
            return dq, combine(dk), combine(dv)
        return b
    inputs = lambda rng: [rnd(rng, 2, 2, 3, 4), rnd(rng, 2, 1, 3, 4), rnd(rng, 2, 1, 3, 4)]
    summed = backward(lambda d: d.sum(axis=1, keepdims=True))
    return {"grouped-query attention: a shared head's gradient from its group's first head only":
                (pair_fn(forward, summed), pair_fn(forward, backward(lambda d: d[:, :1])), inputs),
            "grouped-query attention: the group's gradients averaged, not summed":
                (pair_fn(forward, summed), pair_fn(forward, backward(lambda d: d.mean(axis=1, keepdims=True))),
                 inputs)}


def rotary_cases():
    cos, sin = F.rotary_tables(8, 4, np.float64)

    def forward(x):
        return F.rotary_forward(x, cos, sin, start=2)

    def interleaved(dout, cache):                             # pairs (2i, 2i+1), not (i, i+d/2)
        c, s = cache
        half = dout.shape[-1] // 2
        cc, ss = np.repeat(c, 2, axis=-1), np.repeat(s, 2, axis=-1)
        rot = np.empty_like(dout)
        rot[..., 0::2], rot[..., 1::2] = dout[..., 1::2], -dout[..., 0::2]
        return dout * cc + rot * ss

    def no_offset(dout, cache):                               # the tables read from position 0
        _, cache0 = F.rotary_forward(np.zeros_like(dout), cos, sin, start=0)
        return F.rotary_backward(dout, cache0)
    right = pair_fn(forward, F.rotary_backward)
    inputs = lambda rng: [rnd(rng, 2, 2, 3, 4)]
    return {"rotary: the backward pairs (2i, 2i+1), the forward (i, i + d/2)":
                (right, pair_fn(forward, interleaved), inputs),
            "rotary: the offset start forgotten in the backward": (right, pair_fn(forward, no_offset), inputs)}


def residual_cases():
    """y = x + f(x) (pre-norm: f = linear(layernorm)), z = LN(x + f(x)) (post-norm), and two
    sub-layers run back to front."""
    def pre(x, w, g, b):
        h, c_ln = F.layernorm_forward(x, g, b)
        f, c_lin = F.linear_forward(h, w)
        return x + f, (c_ln, c_lin)

    def pre_backward(identity):
        def backward(dy, cache):
            c_ln, c_lin = cache
            dh, dw, _ = F.linear_backward(dy, c_lin)
            dx, dg, db = F.layernorm_backward(dh, c_ln)
            return (dx + dy if identity else dx), dw, dg, db
        return backward

    def post(x, w, g, b):
        f, c_lin = F.linear_forward(x, w)
        z, c_ln = F.layernorm_forward(x + f, g, b)
        return z, (c_lin, c_ln)

    def post_backward(feed):
        def backward(dz, cache):
            c_lin, c_ln = cache
            dsum, dg, db = F.layernorm_backward(dz, c_ln)
            dx, dw, _ = F.linear_backward(dsum, c_lin)
            return dx + (dsum if feed == "dsum" else dz), dw, dg, db
        return backward

    def two(x, w1, w2):
        a, c1 = F.linear_forward(x, w1)
        h, c_act = F.gelu_tanh_forward(a)
        y, c2 = F.linear_forward(h, w2)
        return y, (c1, c_act, c2)

    def two_backward(order):
        def backward(dy, cache):
            c1, c_act, c2 = cache
            if order == "reverse":
                dh, dw2, _ = F.linear_backward(dy, c2)
                da = F.gelu_tanh_backward(dh, c_act)
                dx, dw1, _ = F.linear_backward(da, c1)
            else:                                              # forward order: wrong caches read
                dx1, dw1, _ = F.linear_backward(dy, c1)
                da = F.gelu_tanh_backward(dx1, c_act)
                dx, dw2, _ = F.linear_backward(da, c2)
            return dx, dw1, dw2
        return backward
    inputs = lambda rng: [rnd(rng, 2, 3, 4), rnd(rng, 4, 4), 1 + 0.3 * rnd(rng, 4), rnd(rng, 4)]
    return {
        "residual: the identity term dropped (pre-norm)":
            (pair_fn(pre, pre_backward(True)), pair_fn(pre, pre_backward(False)), inputs),
        "residual: post-norm feeds dy instead of dz to the identity path":
            (pair_fn(post, post_backward("dsum")), pair_fn(post, post_backward("dz")), inputs),
        "residual: sub-layers' backwards run in forward order":
            (pair_fn(two, two_backward("reverse")), pair_fn(two, two_backward("forward")),
             lambda rng: [rnd(rng, 2, 3, 4), rnd(rng, 4, 4), rnd(rng, 4, 4)]),
    }


def cross_entropy_cases():
    targets = np.array([3, 0, 5, 1, 0, 2])                     # 0 is ignored

    def forward(z):
        loss, cache = F.cross_entropy_forward(z, targets, 0, 0.1)
        return np.array(loss), cache

    def backward(dloss, cache):
        return F.cross_entropy_backward(float(dloss), cache)

    def by_all_rows(dloss, cache):                             # divides by N, padding included
        logp, safe, valid, count, eps = cache
        return backward(dloss, cache) * count / len(valid)

    def ignored_rows_kept(dloss, cache):
        logp, safe, valid, count, eps = cache
        everything = (logp, safe, np.ones_like(valid), count, eps)
        return backward(dloss, everything)
    right = pair_fn(forward, backward)
    inputs = lambda rng: [rnd(rng, 6, 7)]
    return {"cross-entropy: divided by all rows (padding included), not the real tokens":
                (right, pair_fn(forward, by_all_rows), inputs),
            "cross-entropy: ignored rows keep softmax - q": (right, pair_fn(forward, ignored_rows_kept), inputs)}


def tied_case(rng):
    """Tied embeddings: one matrix used by the embedding and by the output projection; the
    generator's backward assigns the gradient instead of adding to it."""
    ids = np.array([[1, 2, 1], [3, 0, 2]])

    def forward(w):
        h, c_emb = F.embedding_forward(ids, w)
        logits, c_gen = F.linear_forward(np.tanh(h), w)
        return logits, (c_emb, c_gen, h)

    def backward(add):
        def b(dlogits, cache):
            c_emb, c_gen, h = cache
            dt, dw_gen, _ = F.linear_backward(dlogits, c_gen)
            dw_emb = F.embedding_backward(dt * (1 - np.tanh(h) ** 2), c_emb)
            return dw_emb + dw_gen if add else dw_gen          # `grad = ...`: the last one wins
        return b
    return pair_fn(forward, backward(True)), pair_fn(forward, backward(False)), [rnd(rng, 4, 4)]


def lora_cases():
    """LoRA: the scale alpha / r on dB but not on dA; the adapter's share of dx forgotten (dX =
    dY W alone, as if the update were not there). Dropout on, one mask for every evaluation."""
    scale = 1.5

    def forward(x, a, b):
        w = np.linspace(-1, 1, 5 * 6).reshape(5, 6)
        return F.lora_forward(x, w, None, a, b, scale, 0.25, np.random.default_rng(3))

    def unscaled_da(dy, cache):
        dx, da, db = F.lora_backward(dy, cache)
        return dx, da / scale, db

    def frozen_dx_only(dy, cache):
        _, da, db = F.lora_backward(dy, cache)
        return F.linear_input_backward(dy, cache[0]), da, db
    right = pair_fn(forward, F.lora_backward)
    inputs = lambda rng: [rnd(rng, 2, 3, 6), rnd(rng, 2, 6), rnd(rng, 5, 2)]
    return {"lora: the scale alpha / r applied to dB but not to dA":
                (right, pair_fn(forward, unscaled_da), inputs),
            "lora: the adapter's share of dx forgotten": (right, pair_fn(forward, frozen_dx_only),
                                                           inputs)}


def catalogue():
    """{mistake: (right fn, wrong fn, inputs(rng))}"""
    cases = {}
    for name, make in (("linear: dW = X^T dY transposed, PyTorch's (out, in) layout", linear_case),
                       ("learned positions: dw from dout[0], the batch axis forgotten", positions_case),
                       ("masked softmax: masked scores filled with 0 get a gradient", softmax_case),
                       ("tied embeddings: one backward assigns the gradient, the other's lost",
                        tied_case)):
        cases[name] = (lambda make: (lambda rng: make(rng)))(make)
    for group in (embedding_cases(), dropout_cases(), layernorm_cases(), rmsnorm_cases(),
                  swiglu_cases(), gelu_cases(), softcap_cases(), attention_cases(), mha_cases(),
                  grouped_query_cases(), rotary_cases(), residual_cases(),
                  cross_entropy_cases(), lora_cases()):
        for name, (right, wrong, inputs) in group.items():
            cases[name] = (lambda right, wrong, inputs: (lambda rng: (right, wrong, inputs(rng))))(
                right, wrong, inputs)
    return cases


CATALOGUE = catalogue()

# Shape mistakes: the gradient cannot have its input's shape, so the check refuses it by name
# (or NumPy refuses the product before the backward returns).
SHAPE_MISTAKES = {
    "linear: db = dy.sum(axis=0) on a 3-D dy leaves (T, D_out)":
        (pair_fn(F.linear_forward, lambda dy, c: (*F.linear_backward(dy, c)[:2], dy.sum(axis=0))),
         lambda rng: [rnd(rng, 2, 3, 4), rnd(rng, 5, 4), rnd(rng, 5)], "the gradient of input2 has shape"),
    "linear: dW = X^T dY for a non-square (out, in) weight":
        (pair_fn(F.linear_forward, lambda dy, c: (F.linear_backward(dy, c)[0], F.linear_backward(dy, c)[1].T,
                                               F.linear_backward(dy, c)[2])),
         lambda rng: [rnd(rng, 2, 3, 4), rnd(rng, 5, 4), rnd(rng, 5)], "the gradient of input1 has shape"),
    "layernorm: dgamma summed over the batch axis only":
        (pair_fn(F.layernorm_forward, lambda dy, c: (*F.layernorm_backward(dy, c)[:1],
                                                  (dy * c[0]).sum(axis=0), dy.sum(axis=(0, 1)))),
         lambda rng: [rnd(rng, 2, 3, 4), np.ones(4), np.zeros(4)], "the gradient of input1 has shape"),
    "attention: dK = c dS Q without the transpose (cross-attention, Tq != Tk)":
        (pair_fn(lambda q, k, v: F.attention_forward(q, k, v),
              lambda d, c: (lambda dq, dk, dv: (dq, (F.softmax_backward(d @ c[2].swapaxes(-1, -2), c[3])
                                                     * c[6]) @ c[0], dv))(*F.attention_backward(d, c))),
         lambda rng: [rnd(rng, 1, 2, 3, 4), rnd(rng, 1, 2, 5, 4), rnd(rng, 1, 2, 5, 4)],
         "matmul: Input operand 1 has a mismatch"),           # NumPy's own shape error
}

# What a gradient check cannot see: the backward is the exact gradient of the function computed,
# so the error is in the function itself. Each is seen by the named test instead.
INVISIBLE = {
    "layernorm: unbiased variance (1/(D-1)) or eps outside the root":
        "a correct gradient of a different function; tests/test_torch_parity.py holds the forward "
        "against torch.nn.LayerNorm",
    "rmsnorm: eps outside the root, or the mean of |x| instead of x^2":
        "a correct gradient of another norm; tests/test_gradcheck_layers.py holds the forward and "
        "its gradients against torch.nn.RMSNorm",
    "rmsnorm: gamma applied before the cast back to half precision":
        "rounding in the forward; tests/test_gradcheck_layers.py checks the half-precision path",
    "swiglu: gate and up taken from the wrong halves in both forward and backward":
        "a consistent function with the halves swapped; the Hugging Face parity of the Llama "
        "family (its gate_proj and up_proj rows) sees it",
    "gelu: the tanh form used where the model was trained with the exact one (or back)":
        "forward and backward agree with each other; tests/test_gradcheck_layers.py holds each "
        "forward against its definition, tests/test_gpt_hf.py GPT-2 against transformers",
    "relu: inputs within eps of the kink":
        "not a mistake of the backward: the function has no derivative there; the checker reports "
        "such entries as at a kink and does not judge them",
    "softmax: a finite fill (0, 1e-9) for masked scores, masked consistently in the backward":
        "a correct gradient of a function that leaks padding; the attention parity tests "
        "(tests/test_torch_parity.py) and tests/test_kernels_attention.py see the output",
    "softmax: building the (B, H, T, T, T) Jacobian":
        "right but too large: a memory problem, not a wrong gradient",
    "multi-head attention: heads split by reshape without the transpose":
        "forward and backward both mix positions into heads, consistently; parity with "
        "torch.nn.MultiheadAttention (tests/test_torch_parity.py) sees it",
    "grouped-query attention: heads repeated in the other order (tile, not repeat)":
        "a consistent model no checkpoint was trained with; Hugging Face parity of the Llama "
        "family sees it",
    "rotary: the interleaved layout in both forward and backward":
        "a valid rotation, the other convention; tests/test_rotary.py holds the layout against "
        "GPT-NeoX's rotate-half",
    "rotary: angles computed in float32": "rounding in the forward; tests/test_rotary.py",
    "rotary: the offset start forgotten in incremental decoding (forward and backward)":
        "a consistent function of the wrong positions; tests/test_incremental.py compares the "
        "cached step with the full forward",
    "cross-entropy: smoothing eps/(V-1) on the wrong classes only":
        "a valid but different loss; tests/test_torch_parity.py holds it against torch",
    "cross-entropy: log(softmax(z)) in two steps":
        "underflow to log 0 in the forward; tests/test_torch_parity.py at extreme logits",
    "tied embeddings: tying by copying the array":
        "two parameters, each with its correct gradient; they drift apart only over optimizer "
        "steps (tests/test_model_validation.py checks the Parameter is shared)",
    "adam: bias-corrected m stored back, t from 0, the paper's efficient form, eps inside the "
    "root, t per tensor":
        "an optimizer update, not a backward; tests/test_optim.py holds every step against "
        "torch.optim.Adam / AdamW",
    "dropout: left on in evaluation": "a mode mistake, not a gradient; tests/test_decoding.py",
    "lora: dropout on the frozen term's input too, or a merged update still added":
        "a consistent function PEFT does not compute; tests/test_lora_peft.py holds the logits "
        "against PEFT's and tests/test_lora.py the merged model against the adapters",
    "soft-capping: capping the scores after the mask instead of before":
        "a consistent function in which the future leaks in (-inf becomes -cap); "
        "tests/test_gemma2_hf.py holds the logits against transformers' Gemma 2",
    "multi-head attention: splitting dmemory's heads before summing layers":
        "covered by the overwrite case above when it loses terms; otherwise the same sum",
}


@pytest.mark.parametrize("fast", [False, True], ids=["full", "fast"])
@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_the_right_backward_passes_and_the_wrong_one_fails(name, fast):
    right, wrong, inputs = CATALOGUE[name](np.random.default_rng(zlib.crc32(name.encode())))
    good = nf.gradcheck(right, [x.copy() for x in inputs], fast=fast)
    assert good.ok, f"{name}: the right backward\n{good}"
    bad = nf.gradcheck(wrong, [x.copy() for x in inputs], fast=fast)
    assert not bad.ok, f"{name}: the wrong backward passed\n{bad}"
    assert "WRONG" in str(bad)


@pytest.mark.parametrize("fast", [False, True], ids=["full", "fast"])
@pytest.mark.parametrize("seed", range(3))
def test_the_catalogue_fails_whatever_the_seed(seed, fast):
    """The probe, the directions and the inputs drawn from other seeds: still every mistake."""
    for name, make in CATALOGUE.items():
        right, wrong, inputs = make(np.random.default_rng(100 + seed))
        assert nf.gradcheck(right, [x.copy() for x in inputs], fast=fast, seed=seed).ok, name
        assert not nf.gradcheck(wrong, [x.copy() for x in inputs], fast=fast, seed=seed).ok, name


@pytest.mark.parametrize("name", sorted(SHAPE_MISTAKES))
def test_shape_mistakes_are_refused_naming_the_gradient(name):
    fn, inputs, message = SHAPE_MISTAKES[name]
    with pytest.raises(ValueError, match=message):
        nf.gradcheck(fn, inputs(np.random.default_rng(0)))


def test_the_catalogue_covers_every_what_goes_wrong_paragraph():
    """Each "What goes wrong" section of docs/backprop.md has a wrong backward here or a reason
    in INVISIBLE (by the section's first word)."""
    from pathlib import Path
    text = (Path(__file__).resolve().parents[1] / "docs" / "backprop.md").read_text()
    sections, current = [], None
    for line in text.splitlines():
        if line.startswith("## "):
            current = line[3:].strip().lower()
        if "What goes wrong" in line and current:
            sections.append(current)
    covered = " ".join(list(CATALOGUE) + list(SHAPE_MISTAKES) + list(INVISIBLE)).lower()
    keys = {"linear": "linear", "embedding": "embedding", "dropout": "dropout",
            "layernorm": "layernorm", "rmsnorm": "rmsnorm", "swiglu": "swiglu",
            "activations": "gelu", "softmax": "softmax", "soft-capping": "soft-capping",
            "attention": "attention", "multi-head attention": "multi-head attention",
            "rotary positions": "rotary", "residual and layer order": "residual",
            "cross-entropy": "cross-entropy", "tied embeddings": "tied embeddings", "adam": "adam",
            "lora": "lora"}
    assert sections, "no What goes wrong paragraphs found"
    for section in sections:
        assert section in keys, f"a new section with mistakes: {section}; add it to the catalogue"
        assert keys[section] in covered, section
    assert len(CATALOGUE) + len(SHAPE_MISTAKES) >= 30
