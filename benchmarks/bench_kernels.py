"""Time each Numba kernel against its NumPy reference (same inputs, same thread count).

    python benchmarks/bench_kernels.py [--threads 2] [--repeats 7] [--dtype float32]

Prints one row per kernel: reference ms, kernel ms (medians after a warm-up call, which also
compiles), and the speed-up. Attention is timed forward+backward at B=128, H=8, d_head=32 and
T = S in {16, 32, 64}, with a key-padding mask. Both run under npformer's runtime
(``npformer.configure_runtime(threads=--threads)``).

A second table shows the matmul dispatcher (``npformer.kernels.matmul``): for each product shape
the variant its deterministic rules choose, and the best-of-3 time of every variant it offers
(measured in non-deterministic mode, as ``npformer calibrate`` does).
"""
import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    args = ap.parse_args()
    if args.threads < 1 or args.repeats < 1:
        ap.error("--threads and --repeats must be positive")
    return args


def median_ms(fn, repeats):
    fn()                                                      # warm-up (and compile)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    return 1e3 * times[len(times) // 2]


def cases(np, F, K, dtype):
    rng = np.random.default_rng(0)

    def randn(*shape):
        return rng.standard_normal(shape).astype(dtype)

    for t in (16, 32, 64):
        b, h, d = 128, 8, 32
        q, k, v = randn(b, h, t, d), randn(b, h, t, d), randn(b, h, t, d)
        lengths = rng.integers(t // 2, t + 1, size=b)
        mask = (np.arange(t)[None, :] < lengths[:, None])[:, None, None, :]   # (B, 1, 1, S)
        dout = randn(b, h, t, d)

        def att(ops, q=q, k=k, v=v, mask=mask, dout=dout):
            return lambda: ops.attention_backward(dout, ops.attention_forward(q, k, v, mask)[1])
        yield f"attention fwd+bwd B=128 H=8 T=S={t} d=32", att(F), att(K)

    # a character GPT's causal self-attention, dropout 0.1 (the kernel skips masked key blocks)
    q, k, v, dout = (randn(64, 6, 128, 32) for _ in range(4))
    causal = F.causal_mask(128)

    def att_causal(ops):
        def run():
            _, cache = ops.attention_forward(q, k, v, causal, 0.1, np.random.default_rng(1), True)
            return ops.attention_backward(dout, cache)
        return run
    yield "attention fwd+bwd B=64 H=6 T=S=128 d=32, causal, dropout 0.1", att_causal(F), att_causal(K)

    # a character GPT's rotary positions, as its attention runs them: q and k turned in place,
    # in one pass over their columns of the fused projection's output (B=32, T=128, 3 x 192),
    # then their gradients back
    qkv, cos, sin = randn(32, 128, 576), *F.rotary_tables(128, 32, dtype)
    q_k = F.split_heads(qkv[..., :2 * 192], 12)                      # (B, 6 + 6, T, d)

    def rotary(ops):
        def run():
            _, cache = ops.rotary_forward(q_k, cos, sin, 0, out=q_k)
            ops.rotary_backward(q_k, cache, out=q_k)
        return run
    yield "rotary fwd+bwd, q and k (32, 6 + 6, 128, 32) in place", rotary(F), rotary(K)

    # llama-char's RMSNorm (8192 rows of 192) and SwiGLU (its (8192, 2 x 512) projection)
    xr, gr_, dr = randn(64 * 128, 192), randn(192), randn(64 * 128, 192)
    hs, ds = randn(64 * 128, 1024), randn(64 * 128, 512)

    def rms(ops):
        return lambda: ops.rmsnorm_backward(dr, ops.rmsnorm_forward(xr, gr_)[1])

    def swiglu(ops):
        return lambda: ops.swiglu_backward(ds, ops.swiglu_forward(hs)[1])
    yield "RMSNorm fwd+bwd (8192, 192)", rms(F), rms(K)
    yield "SwiGLU fwd+bwd (8192, 2 x 512)", swiglu(F), swiglu(K)

    n, dm = 128 * 15, 256
    x, g, bta, dy = randn(n, dm), randn(dm), randn(dm), randn(n, dm)

    def ln(ops):
        return lambda: ops.layernorm_backward(dy, ops.layernorm_forward(x, g, bta)[1])
    yield f"layernorm fwd+bwd ({n}, {dm})", ln(F), ln(K)

    vocab = 5893
    z = randn(n, vocab)
    tg = rng.integers(0, vocab, size=n)
    tg[:100] = 0

    def ce(ops):
        return lambda: ops.cross_entropy_backward(1.0, ops.cross_entropy_forward(z, tg, 0, 0.1)[1])
    yield f"cross-entropy fwd+bwd ({n}, {vocab}), smoothing 0.1", ce(F), ce(K)

    ids = rng.integers(0, 7853, size=(128, 14))
    w = randn(7853, dm)
    de = randn(128, 14, dm)

    def emb(ops):
        return lambda: ops.embedding_backward(de, ops.embedding_forward(ids, w, 16.0)[1], 0)
    yield "embedding fwd+bwd (128x14 ids, 7853x256)", emb(F), emb(K)

    xd = randn(n, 512)

    def drop(ops):
        return lambda: ops.dropout_backward(xd, ops.dropout_forward(xd, 0.1, np.random.default_rng(1))[1])
    yield f"dropout fwd+bwd ({n}, 512)", drop(F), drop(K)

    def act_drop(ops, activation, h):
        def run():
            out, cache = ops.activation_dropout_forward(h, activation, 0.1, np.random.default_rng(1))
            return ops.activation_dropout_backward(out, cache)
        return run
    yield f"ReLU+dropout fwd+bwd ({n}, 512)", act_drop(F, "relu", xd), act_drop(K, "relu", xd)
    xg = randn(64 * 128, 768)                         # a character GPT's feed-forward
    yield ("GELU (tanh form)+dropout fwd+bwd (8192, 768)", act_drop(F, "gelu_tanh", xg),
           act_drop(K, "gelu_tanh", xg))

    wl, bl, xl = randn(512, dm), randn(512), randn(n, dm)
    dw_acc, db_acc = np.zeros((512, dm), dtype), np.zeros(512, dtype)

    def lin(ops):
        return lambda: ops.linear_backward_accumulate(xd, ops.linear_forward(xl, wl, bl)[1],
                                                      dw_acc, db_acc)
    yield f"linear fwd+bwd with bias ({n}x{dm} -> 512)", lin(F), lin(K)

    size = 9_000_000
    p, gr = randn(size), randn(size)
    m, vv = np.zeros(size, dtype), np.zeros(size, dtype)

    def adam_ref():
        # the reference update of npformer.optim.Adam.step, on the same arrays
        lr, b1, b2, eps, t = 1e-3, 0.9, 0.98, 1e-9, 1
        m[...] += (1 - b1) * (gr - m)
        vv[...] *= b2
        vv[...] += (1 - b2) * gr * gr
        denom = np.sqrt(vv)
        denom /= np.sqrt(1 - b2 ** t)
        denom += eps
        p[...] -= lr / (1 - b1 ** t) * (m / denom)

    def adam_kernel():
        K.adam_step(p, gr, m, vv, 1, 1e-3, 0.9, 0.98, 1e-9, 0.0, False)
    yield f"Adam step over {size:,} parameters", adam_ref, adam_kernel


def matmul_shapes(np, dtype):
    """(label, a, b): per-head attention products, decoding-sized and training-sized linears."""
    rng = np.random.default_rng(1)

    def randn(*shape):
        return rng.standard_normal(shape).astype(dtype)
    for t in (16, 32, 64):
        q, k = randn(128, 8, t, 32), randn(128, 8, t, 32)
        yield f"attention q k^T (128*8 x {t}x32 @ 32x{t})", q, k.swapaxes(-1, -2)
        yield f"attention P v   (128*8 x {t}x{t} @ {t}x32)", randn(128, 8, t, t), q
    for m in (1, 8, 64):
        yield f"linear x W^T ({m}x256 @ 256x768)", randn(m, 256), randn(768, 256).T
    yield "linear x W^T (1920x256 @ 256x768)", randn(1920, 256), randn(768, 256).T
    yield "generator x W^T (1920x256 @ 256x5893)", randn(1920, 256), randn(5893, 256).T
    yield "generator dW (5893x1920 @ 1920x256)", randn(1920, 5893).T, randn(1920, 256)


def main():
    args = parse_args()
    os.environ["NUMBA_NUM_THREADS"] = str(args.threads)
    import numpy as np

    from npformer import backend
    F, K = backend.load("numpy"), backend.load("numba")
    from npformer import runtime
    policy = runtime.configure_runtime(threads=args.threads)
    print(f"policy: {policy}; load average {os.getloadavg()[0]:.2f}")
    print(f"{'kernel':55s} {'numpy ms':>10s} {'numba ms':>10s} {'speed-up':>9s}")
    for name, ref, ker in cases(np, F, K, np.dtype(args.dtype)):
        t_ref, t_ker = median_ms(ref, args.repeats), median_ms(ker, args.repeats)
        print(f"{name:55s} {t_ref:10.2f} {t_ker:10.2f} {t_ref / t_ker:8.1f}x", flush=True)

    import importlib
    dispatcher = importlib.import_module("npformer.kernels.matmul")
    names = list(dispatcher.VARIANTS)
    print(f"\n{'matmul shape':45s} " + " ".join(f"{n:>15s}" for n in names)
          + "   rules' choice / fastest")
    for label, a, b in matmul_shapes(np, np.dtype(args.dtype)):
        dispatcher.reset()
        dispatcher.matmul(a, b)
        ruled = dispatcher.choice(a, b)
        dispatcher.reset()
        runtime.set_deterministic(False)
        dispatcher.matmul(a, b)
        runtime.set_deterministic(True)
        times = dispatcher.timings().get(dispatcher.product_key(a, b), {})
        cells = " ".join(f"{1e3 * times[n]:13.3f}ms" if n in times else f"{'-':>15s}" for n in names)
        print(f"{label:45s} {cells}   {ruled} / {dispatcher.choice(a, b)}", flush=True)
    dispatcher.reset()
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
