"""Adam and AdamW, bias-corrected, step for step as torch.optim.Adam / AdamW (single-tensor path).

The update runs over the model's one flat parameter buffer (``Module.flat_params``), so a step is
a handful of vectorised operations, whatever the number of layers.

Derivation: docs/backprop.md#adam.
"""
import math

import numpy as np

from .. import backend
from ..validation import check_real


class Adam:
    """Adam (Kingma & Ba). ``weight_decay`` here is L2 regularisation: it adds wd * p to the
    gradient (as torch.optim.Adam). For decoupled decay use :class:`AdamW`.

    Attributes ``lr`` (settable, e.g. by a schedule; checked on every assignment, so a schedule
    that goes negative or NaN stops the run before it writes into the weights), ``step_count``,
    ``exp_avg``, ``exp_avg_sq``.
    """

    decoupled = False

    def __init__(self, model, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 decay=None):
        """``decay(name, parameter) -> bool`` chooses the parameters weight decay applies to
        (None: all of them, as torch's optimizers over ``model.parameters()``); e.g.
        :func:`matrices_only`, GPT-2's practice, is torch's two parameter groups, one with
        ``weight_decay`` and one with 0."""
        self.lr = lr                                     # checked by the setter below
        beta1, beta2 = check_betas(betas)
        eps = check_real("eps", eps, minimum=0)
        weight_decay = check_real("weight_decay", weight_decay, minimum=0)
        if decay is not None and not callable(decay):
            raise ValueError(f"decay: expected None or a function (name, parameter) -> bool, "
                             f"got {decay!r:.60}")
        if model.flat_params is None:
            model.flatten_parameters()
        self.model = model
        self.params, self.grads = model.flat_params, model.flat_grads     # (P,) views of the model
        self.betas, self.eps, self.weight_decay = (beta1, beta2), eps, weight_decay
        self.decay_ranges = _decay_ranges(model, decay)  # [(start, stop)] of the flat buffer
        self.step_count = 0
        self.exp_avg = np.zeros_like(self.params)
        self.exp_avg_sq = np.zeros_like(self.params)

    @property
    def lr(self):
        return self._lr

    @lr.setter
    def lr(self, value):
        self._lr = check_real("lr", value, minimum=0)

    def step(self):
        """One update of every parameter from its current gradient."""
        beta1, beta2 = self.betas
        lr, wd = self.lr, self.weight_decay
        p, g, m, v = self.params, self.grads, self.exp_avg, self.exp_avg_sq
        self.step_count += 1
        t = self.step_count
        if wd != 0 and self.decay_ranges != [(0, p.size)]:
            # decay on some parameters only: the same operations as below, on their ranges,
            # then the update without decay (element for element what one pass computes)
            if self.decoupled:
                # the factor as each backend's one pass applies it: the kernel multiplies in
                # float64 and rounds once; NumPy's reference multiplies in the weights' dtype
                factor = np.float64(1.0 - lr * wd) if backend.get_backend() == "numba" \
                    else 1.0 - lr * wd
                for start, stop in self.decay_ranges:
                    np.multiply(p[start:stop], factor, out=p[start:stop], casting="unsafe")
            else:
                g = g.copy()                             # the L2 term, not in the model's .grad
                for start, stop in self.decay_ranges:
                    g[start:stop] += wd * p[start:stop]
            wd = 0.0
        if backend.get_backend() == "numba":             # the same update fused into one pass
            backend.ops().adam_step(p, g, m, v, t, lr, beta1, beta2, self.eps, wd, self.decoupled)
            return
        if wd != 0:
            if self.decoupled:
                p *= 1.0 - lr * wd                       # AdamW: shrink the weights directly
            else:
                g = g + wd * p                           # Adam: L2 term in the gradient
        m += (1.0 - beta1) * (g - m)                     # m <- beta1 m + (1 - beta1) g
        v *= beta2
        v += (1.0 - beta2) * g * g                       # v <- beta2 v + (1 - beta2) g^2
        step_size = lr / (1.0 - beta1 ** t)
        denom = np.sqrt(v)
        denom /= math.sqrt(1.0 - beta2 ** t)
        denom += self.eps
        p -= step_size * (m / denom)

    def state_dict(self):
        return {"step_count": np.array(self.step_count, dtype=np.int64),
                "exp_avg": self.exp_avg.copy(), "exp_avg_sq": self.exp_avg_sq.copy()}

    def load_state_dict(self, state):
        for key in ("step_count", "exp_avg", "exp_avg_sq"):
            if key not in state:
                raise ValueError(f"optimizer state_dict: missing entry {key!r}")
        for key in ("exp_avg", "exp_avg_sq"):
            if np.shape(state[key]) != self.params.shape:
                raise ValueError(f"optimizer state_dict: entry {key!r} expected shape "
                                 f"{self.params.shape}, got {np.shape(state[key])}")
        step_count = np.asarray(state["step_count"])
        if step_count.shape != () or step_count.dtype.kind not in "iu" or step_count < 0:
            raise ValueError(f"optimizer state_dict: entry 'step_count' expected a non-negative "
                             f"integer scalar, got {step_count.dtype} {step_count.shape} {step_count!r:.40}")
        self.step_count = int(step_count)
        self.exp_avg[...] = state["exp_avg"]
        self.exp_avg_sq[...] = state["exp_avg_sq"]


def matrices_only(name, parameter):
    """Weight decay on the weight matrices and embeddings only, not on biases and LayerNorm
    parameters (GPT-2's practice; ``Adam(..., decay=matrices_only)``)."""
    return parameter.data.ndim >= 2


def _decay_ranges(model, decay):
    """The parts of the flat buffer that ``decay`` chooses, as merged (start, stop) ranges."""
    flat = model.flat_params
    if decay is None:
        return [(0, flat.size)]
    base = flat.__array_interface__["data"][0]
    ranges = []
    for name, p in model.named_parameters():
        if decay(name, p):
            start = (p.data.__array_interface__["data"][0] - base) // flat.itemsize
            if ranges and ranges[-1][1] == start:
                ranges[-1] = (ranges[-1][0], start + p.data.size)
            else:
                ranges.append((start, start + p.data.size))
    return ranges


def check_betas(betas, name="betas"):
    """``(beta1, beta2)`` as floats: two finite numbers in [0, 1). One message for any other
    shape or value, since a pair is what the reader has to fix."""
    try:
        beta1, beta2 = betas
        return tuple(check_real(name, b, minimum=0, maximum=1, max_open=True) for b in (beta1, beta2))
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected two numbers in [0, 1), got {betas!r}") from None


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter): p <- p (1 - lr wd) before the
    Adam step. Default weight_decay 0.01, as torch.optim.AdamW."""

    decoupled = True

    def __init__(self, model, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                 decay=None):
        super().__init__(model, lr, betas, eps, weight_decay, decay)
