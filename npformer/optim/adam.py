"""Adam and AdamW, bias-corrected, step for step as torch.optim.Adam / AdamW (single-tensor path).

The update runs over the model's one flat parameter buffer (``Module.flat_params``), so a step is
a handful of vectorised operations, whatever the number of layers.

Derivation: docs/backprop.md#adam.
"""
import math

import numpy as np

from .. import backend


class Adam:
    """Adam (Kingma & Ba). ``weight_decay`` here is L2 regularisation: it adds wd * p to the
    gradient (as torch.optim.Adam). For decoupled decay use :class:`AdamW`.

    Attributes ``lr`` (settable, e.g. by a schedule), ``step_count``, ``exp_avg``, ``exp_avg_sq``.
    """

    decoupled = False

    def __init__(self, model, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        if lr < 0:
            raise ValueError(f"lr: expected a non-negative learning rate, got {lr}")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"betas: expected two numbers in [0, 1), got {betas}")
        if eps < 0 or weight_decay < 0:
            raise ValueError(f"eps, weight_decay: expected non-negative numbers, got {eps}, {weight_decay}")
        if model.flat_params is None:
            model.flatten_parameters()
        self.model = model
        self.params, self.grads = model.flat_params, model.flat_grads     # (P,) views of the model
        self.lr, self.betas, self.eps, self.weight_decay = lr, tuple(betas), eps, weight_decay
        self.step_count = 0
        self.exp_avg = np.zeros_like(self.params)
        self.exp_avg_sq = np.zeros_like(self.params)

    def zero_grad(self):
        self.grads.fill(0)

    def step(self):
        """One update of every parameter from its current gradient."""
        beta1, beta2 = self.betas
        lr, wd = self.lr, self.weight_decay
        p, g, m, v = self.params, self.grads, self.exp_avg, self.exp_avg_sq
        self.step_count += 1
        t = self.step_count
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
        self.step_count = int(state["step_count"])
        self.exp_avg[...] = state["exp_avg"]
        self.exp_avg_sq[...] = state["exp_avg_sq"]


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter): p <- p (1 - lr wd) before the
    Adam step. Default weight_decay 0.01, as torch.optim.AdamW."""

    decoupled = True

    def __init__(self, model, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        super().__init__(model, lr, betas, eps, weight_decay)
