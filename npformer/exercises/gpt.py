"""``npformer exercises check DIR --train gpt``: a small character model of tiny Shakespeare,
trained with the learner's own passes: embedding, RMSNorm, multi-head attention (the fused
projection), SwiGLU, the residual block, linear, cross-entropy and Adam.

The model is written here from the exercises' functions alone, each called through ``fns`` (a
dict of name -> function: the learner's, the reference's, or a :class:`namespace.Shadow`'s), so
that every one of them runs in every step::

    ids (B, T) -> embedding (tokens) + embedding (positions)          (B, T, D)
    n_layers x [ x + mha(rmsnorm(x)),  x + linear(swiglu(linear(rmsnorm(x)))) ]
    the residual block of exercise 10 (pre-norm: x + linear(layernorm(x)))
    rmsnorm -> linear -> logits (B, T, V) -> cross-entropy

Each part is an object whose ``forward`` keeps its caches on itself, so that the shadow can name
the part a disagreement arose in (``blocks.1``, ``head``).
"""
from dataclasses import dataclass

import numpy as np

CONFIG = {"d_model": 64, "n_heads": 4, "n_layers": 2, "d_ff": 128, "context": 64,
          "batch_size": 16, "steps": 300, "lr": 3e-3, "val_batches": 8, "sample_chars": 200}
BETAS, EPS = (0.9, 0.999), 1e-8


def _causal(t):
    return np.tril(np.ones((t, t), dtype=bool))[None, None]          # (1, 1, T, T)


class Part:
    """Named parameters (float32) and their gradients after :meth:`backward`."""

    def __init__(self, **params):
        self.params = {k: np.asarray(v, dtype=np.float32) for k, v in params.items()}
        self.grads = {}


class Embed(Part):
    def forward(self, fns, ids):                                     # ids (B, T)
        tok, self.tok = fns["embedding_forward"](ids, self.params["wte"])
        pos, self.pos = fns["embedding_forward"](np.arange(ids.shape[1])[None], self.params["wpe"])
        return tok + pos                                             # (B, T, D)

    def backward(self, fns, dx):
        self.grads["wte"] = fns["embedding_backward"](dx, self.tok, None)
        self.grads["wpe"] = fns["embedding_backward"](dx.sum(0, keepdims=True), self.pos, None)


class Block(Part):
    """x + mha(rmsnorm(x)), then x + linear(swiglu(linear(rmsnorm(x))))."""

    def __init__(self, n_heads, **params):
        super().__init__(**params)
        self.n_heads = n_heads

    def forward(self, fns, x):
        p = self.params
        h, self.n1 = fns["rmsnorm_forward"](x, p["g1"])
        a, self.att = fns["mha_forward"](h, p["w_in"], p["b_in"], p["w_out"], p["b_out"],
                                         self.n_heads, _causal(x.shape[1]))
        x = x + a
        h, self.n2 = fns["rmsnorm_forward"](x, p["g2"])
        u, self.up = fns["linear_forward"](h, p["w_up"], p["b_up"])   # (B, T, 2F)
        s, self.glu = fns["swiglu_forward"](u)                         # (B, T, F)
        f, self.down = fns["linear_forward"](s, p["w_down"], p["b_down"])
        return x + f

    def backward(self, fns, dx):
        g = self.grads
        ds, g["w_down"], g["b_down"] = fns["linear_backward"](dx, self.down)
        du = fns["swiglu_backward"](ds, self.glu)
        dh, g["w_up"], g["b_up"] = fns["linear_backward"](du, self.up)
        dh, g["g2"] = fns["rmsnorm_backward"](dh, self.n2)
        dx = dx + dh
        dh, g["w_in"], g["b_in"], g["w_out"], g["b_out"] = fns["mha_backward"](dx, self.att)
        dh, g["g1"] = fns["rmsnorm_backward"](dh, self.n1)
        return dx + dh


class Mix(Part):
    """The residual block of exercise 10, pre-norm: x + linear(layernorm(x))."""

    def forward(self, fns, x):
        p = self.params
        y, self.cache = fns["residual_forward"](x, p["w"], p["b"], p["gamma"], p["beta"], True)
        return y

    def backward(self, fns, dy):
        g = self.grads
        dx, g["w"], g["b"], g["gamma"], g["beta"] = fns["residual_backward"](dy, self.cache)
        return dx


class Head(Part):
    """rmsnorm, the projection to the vocabulary, the cross-entropy of the next characters."""

    def forward(self, fns, x, targets=None):
        p = self.params
        h, self.norm = fns["rmsnorm_forward"](x, p["g"])
        logits, self.proj = fns["linear_forward"](h, p["w"], p["b"])    # (B, T, V)
        if targets is None:
            return logits
        loss, self.loss = fns["cross_entropy_forward"](logits.reshape(-1, logits.shape[-1]),
                                                       targets.reshape(-1), -100, 0.0)
        self.shape = logits.shape
        return loss

    def backward(self, fns):
        g = self.grads
        dlogits = fns["cross_entropy_backward"](1.0, self.loss).reshape(self.shape)
        dh, g["w"], g["b"] = fns["linear_backward"](dlogits, self.proj)
        dx, g["g"] = fns["rmsnorm_backward"](dh, self.norm)
        return dx


class CharGPT:
    """The model: parts ``embed``, ``blocks.N``, ``mix`` and ``head`` (:func:`paths`)."""

    def __init__(self, vocab, cfg, seed):
        rng = np.random.default_rng(seed)
        d, f = cfg["d_model"], cfg["d_ff"]

        def w(*shape, scale=0.02):
            return rng.standard_normal(shape) * scale

        self.embed = Embed(wte=w(vocab, d), wpe=w(cfg["context"], d))
        self.blocks = [Block(cfg["n_heads"], g1=np.ones(d), w_in=w(3 * d, d), b_in=np.zeros(3 * d),
                             w_out=w(d, d), b_out=np.zeros(d), g2=np.ones(d),
                             w_up=w(2 * f, d), b_up=np.zeros(2 * f), w_down=w(d, f),
                             b_down=np.zeros(d)) for _ in range(cfg["n_layers"])]
        self.mix = Mix(w=w(d, d), b=np.zeros(d), gamma=np.ones(d), beta=np.zeros(d))
        self.head = Head(g=np.ones(d), w=w(vocab, d), b=np.zeros(vocab))

    def parts(self):
        return [("embed", self.embed), *((f"blocks.{i}", b) for i, b in enumerate(self.blocks)),
                ("mix", self.mix), ("head", self.head)]

    def paths(self):
        """{id(part): its name}, for :class:`namespace.Shadow`."""
        return {id(part): name for name, part in self.parts()}

    def forward(self, fns, ids, targets=None):
        x = self.embed.forward(fns, ids)
        for block in self.blocks:
            x = block.forward(fns, x)
        return self.head.forward(fns, self.mix.forward(fns, x), targets)

    def backward(self, fns):
        dx = self.head.backward(fns)
        dx = self.mix.backward(fns, dx)
        for block in reversed(self.blocks):
            dx = block.backward(fns, dx)
        self.embed.backward(fns, dx)


class AdamState:
    """Adam's running averages of every parameter, updated by ``fns["adam_step"]``."""

    def __init__(self, model):
        self.t = 0
        self.m = {(n, k): np.zeros_like(v) for n, part in model.parts()
                  for k, v in part.params.items()}
        self.v = {key: np.zeros_like(m) for key, m in self.m.items()}

    def step(self, fns, model, lr):
        self.t += 1
        for name, part in model.parts():
            for k, p in part.params.items():
                fns["adam_step"](p, part.grads[k], self.m[name, k], self.v[name, k], self.t, lr,
                                 *BETAS, EPS, 0.0, False)


@dataclass
class Text:
    """Tiny Shakespeare as character ids: the 90% trained on, the 10% validated on."""

    chars: str
    train: np.ndarray
    valid: np.ndarray

    @classmethod
    def read(cls, path):
        text = open(path, encoding="utf-8").read()
        chars = "".join(sorted(set(text)))
        if len(text) < 1000:
            raise ValueError(f"{path}: expected a text of at least 1000 characters, got "
                             f"{len(text)}")
        index = {c: i for i, c in enumerate(chars)}
        ids = np.array([index[c] for c in text], dtype=np.int64)
        cut = int(0.9 * len(ids))
        return cls(chars, ids[:cut], ids[cut:])

    def batch(self, rng, split, batch_size, context):
        """(ids, targets), each (B, T): windows of ``split`` at random places, the targets the
        characters that follow."""
        data = self.train if split == "train" else self.valid
        starts = rng.integers(0, len(data) - context - 1, batch_size)
        ids = np.stack([data[s:s + context] for s in starts])
        return ids, np.stack([data[s + 1:s + context + 1] for s in starts])


def validation_loss(fns, model, text, cfg):
    """The mean loss over ``val_batches`` fixed windows of the validation text."""
    rng = np.random.default_rng(1234)
    batches = [text.batch(rng, "valid", cfg["batch_size"], cfg["context"])
               for _ in range(cfg["val_batches"])]
    return float(np.mean([model.forward(fns, ids, y) for ids, y in batches]))


def sample(fns, model, text, cfg, seed=0, prompt="\n"):
    """``sample_chars`` characters after ``prompt``, drawn from the model (temperature 0.8)."""
    rng = np.random.default_rng(seed)
    index = {c: i for i, c in enumerate(text.chars)}
    ids = [index.get(c, 0) for c in prompt]
    for _ in range(cfg["sample_chars"]):
        window = np.array([ids[-cfg["context"]:]])
        logits = model.forward(fns, window)[0, -1].astype(np.float64) / 0.8
        p = np.exp(logits - logits.max())
        ids.append(int(rng.choice(len(p), p=p / p.sum())))
    return "".join(text.chars[i] for i in ids[len(prompt):])


def train_step(fns, model, adam, ids, targets, lr):
    """One step: the loss, the backward, Adam's update. Returns the loss."""
    loss = model.forward(fns, ids, targets)
    model.backward(fns)
    adam.step(fns, model, lr)
    return float(loss)


def train(fns, text, cfg, seed=0, on_step=None):
    """A fresh model of ``seed`` trained for ``steps`` steps with ``fns``: (model, losses)."""
    model = CharGPT(len(text.chars), cfg, seed)
    adam, rng, losses = AdamState(model), np.random.default_rng(seed + 1), []
    for step in range(1, cfg["steps"] + 1):
        ids, targets = text.batch(rng, "train", cfg["batch_size"], cfg["context"])
        losses.append(train_step(fns, model, adam, ids, targets, cfg["lr"]))
        if on_step is not None:
            on_step(step, losses[-1])
    return model, losses
